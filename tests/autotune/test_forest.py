"""``autotune.forest``: XGBoost models as flat trees, scored by the tree-ensemble kernel exactly as
XGBoost scores them (Triton's interpreter on the CPU, the GPU under the ``cuda`` marker)."""

import json

import numpy as np
import pytest
import torch

from autotune import features as ft
from autotune import selection
from autotune.cost_model import CostModel
from autotune.forest import Forest
from pyg_ugrapher.datasets import power_law_graph
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo

xgboost = pytest.importorskip("xgboost")

H100 = ft.GpuInfo("NVIDIA H100 80GB HBM3", 132, 90)


def assert_same_scores(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float32 sums taken in another order; the same best row where it is clear."""
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
    order = np.sort(expected)
    if order.size > 1 and order[1] - order[0] > 1e-4 * scale:
        assert np.argmin(got) == np.argmin(expected)


@pytest.fixture(scope="module")
def shipped_booster():
    booster = selection.load_booster(selection.DEFAULT_MODEL)
    assert booster is not None
    return booster


@pytest.fixture(scope="module")
def case_rows():
    """Feature rows of a real case: a sample of the schedules of copy_u_sum at F = 128 on a
    power-law graph."""
    graph = GraphTensor.from_edge_index(power_law_graph(3000, 60_000, seed=4), 3000)
    _, matrix = ft.case_features(
        selection.bucket(graph.stats()), OpInfo.from_name("copy_u_sum"), 128, 1, torch.float32, H100
    )
    return matrix[np.random.default_rng(0).choice(len(matrix), 48, replace=False)]


def test_shipped_model_scores_as_xgboost(shipped_booster, case_rows, device):
    forest = Forest.from_booster(shipped_booster)
    assert forest.roots.size == shipped_booster.num_boosted_rounds()
    expected = shipped_booster.inplace_predict(case_rows, validate_features=False)
    assert_same_scores(forest.predict(case_rows, device), expected)


def test_missing_values_and_base_score(device):
    """A regression model trained with missing values (each split's default direction matters)
    and labels far from zero (the base score matters)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 5)).astype(np.float32)
    X[rng.random(X.shape) < 0.3] = np.nan
    y = 40.0 + np.nan_to_num(X[:, 0]) * 3 + np.isnan(X[:, 1]) * 5
    model = CostModel(n_estimators=30, num_leaves=15, min_child_samples=2).fit(X, y)
    forest = Forest.from_booster(model.booster_)
    rows = X[:70]
    assert_same_scores(forest.predict(rows, device), model.predict(rows))


@pytest.mark.parametrize("num_trees", [1, 2, 3, 4, 5, 9])
def test_forests_of_a_few_trees(num_trees, device):
    """Fewer trees than a program walks side by side: the dead lanes add nothing."""
    rng = np.random.default_rng(num_trees)
    X = rng.normal(size=(70, 3))
    booster = xgboost.train(
        {"objective": "reg:squarederror", "max_depth": 4}, xgboost.DMatrix(X, label=rng.normal(size=70)), num_trees
    )
    forest = Forest.from_booster(booster)
    assert forest.roots.size == num_trees
    assert_same_scores(forest.predict(X, device), booster.predict(xgboost.DMatrix(X)))


def test_trees_trained_with_dropout_keep_their_weights(device):
    """DART weighs each tree by the dropout it went through; the forest folds the weights in."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(70, 3))
    params = {"objective": "reg:squarederror", "booster": "dart", "rate_drop": 0.5, "skip_drop": 0.0}
    booster = xgboost.train(params, xgboost.DMatrix(X, label=rng.normal(size=70)), 12)
    saved = json.loads(booster.save_raw("json"))["learner"]["gradient_booster"]
    weights = saved.get("weight_drop", saved.get("model", {}).get("weight_drop"))
    assert weights is not None and min(weights) < 1.0  # some trees were dropped and reweighted
    assert_same_scores(Forest.from_booster(booster).predict(X, device), booster.predict(xgboost.DMatrix(X)))


@pytest.mark.parametrize(
    "params,reason",
    [
        ({"objective": "reg:logistic"}, "objective"),
        ({"objective": "multi:softprob", "num_class": 3}, "objective"),
        ({"objective": "reg:squarederror", "booster": "gblinear"}, "gblinear"),
    ],
)
def test_models_that_are_not_a_sum_of_trees_are_refused(params, reason):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 3))
    y = rng.integers(0, 3 if "num_class" in params else 2, 60).astype(float)
    booster = xgboost.train(params, xgboost.DMatrix(X, label=y), num_boost_round=2)
    with pytest.raises(ValueError, match=reason):
        Forest.from_booster(booster)


def _stump(**changes):
    arrays = dict(
        feature=[0, 0, 0],
        threshold=[0.5, 0, 0],
        left=[1, 1, 2],
        right=[2, 1, 2],
        default_left=[1, 0, 0],
        value=[0, -1, 1],
        roots=[0],
        base=0.0,
        num_features=2,
    )
    arrays.update(changes)
    return Forest(**arrays)


def test_forest_arrays_are_checked():
    stump = _stump()
    assert stump.depth == 1
    with pytest.raises(ValueError, match="left:"):
        _stump(left=[1, 5, 2])
    with pytest.raises(ValueError, match="feature:"):
        _stump(feature=[2, 0, 0])
    with pytest.raises(ValueError, match="value:"):
        _stump(value=[0, 1])
    with pytest.raises(ValueError, match="X:"):
        stump.predict(np.zeros((3, 3), dtype=np.float32), "cpu")


def test_a_stump_by_hand(device):
    got = _stump(base=0.25).predict(np.array([[0.0, 9.0], [1.0, 9.0], [np.nan, 9.0]], dtype=np.float32), device)
    np.testing.assert_array_equal(got, np.array([-0.75, 1.25, -0.75], dtype=np.float32))


@pytest.mark.cuda
def test_whole_design_space_on_the_gpu(shipped_booster):
    """Every schedule of two cases scored on the GPU as XGBoost scores them, and selection picks
    the same schedule either way."""
    graph = GraphTensor.from_edge_index(power_law_graph(30_000, 600_000, seed=5), 30_000)
    stats = selection.bucket(graph.stats())
    for name in ("copy_u_sum", "u_add_v"):
        op = OpInfo.from_name(name)
        infos, matrix = ft.case_features(stats, op, 128, 1, torch.float32, H100)
        expected = shipped_booster.inplace_predict(matrix, validate_features=False)
        got = selection.scores(shipped_booster, matrix, "cuda")
        assert_same_scores(got, expected)
        chosen = selection.predict_best(shipped_booster, stats, op, 128, 1, torch.float32, H100, "cuda")
        assert chosen == infos[int(np.argmin(got))]
        # Fewer rows after more reuse the staging buffers; their stale tail is not returned.
        few = matrix[:7]
        assert_same_scores(selection.scores(shipped_booster, few, "cuda"), expected[:7])
