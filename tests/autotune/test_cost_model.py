import json

import numpy as np
import pytest

from autotune.cost_model import CostModel


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(3000, 6)).astype(np.float32)
    y = 2 * X[:, 0] + X[:, 1] ** 2 + 0.05 * rng.normal(size=3000)
    return X[:2500], y[:2500], X[2500:], y[2500:]


def _leaves(tree: dict) -> int:
    return 1 if "leaf" in tree else sum(_leaves(child) for child in tree["children"])


def _depth(tree: dict) -> int:
    return 0 if "leaf" in tree else 1 + max(_depth(child) for child in tree["children"])


def test_fit_predict_generalises(data):
    X, y, X_test, y_test = data
    model = CostModel(n_estimators=150, learning_rate=0.1, random_state=0).fit(X, y)
    pred = model.predict(X_test)
    r2 = 1 - ((pred - y_test) ** 2).sum() / ((y_test - y_test.mean()) ** 2).sum()
    assert r2 > 0.95
    importance = model.feature_importances_
    assert importance.shape == (6,)
    # The two informative features carry the splits.
    assert importance[:2].sum() > importance[2:].sum()


@pytest.mark.parametrize("suffix", [".json", ".ubj"])
def test_save_load_round_trip(data, tmp_path, suffix):
    X, y, X_test, _ = data
    model = CostModel(n_estimators=20, num_leaves=15, min_child_samples=7, reg_lambda=0.5, random_state=3).fit(
        X, y, feature_name=[f"x{i}" for i in range(6)]
    )
    path = model.save_model(tmp_path / f"model{suffix}")
    loaded = CostModel.load(path)
    np.testing.assert_array_equal(loaded.predict(X_test), model.predict(X_test))
    assert loaded.get_params() == model.get_params()
    assert loaded.feature_names_ == [f"x{i}" for i in range(6)]


def test_lightgbm_names_are_honoured(data):
    X, y, _, _ = data
    model = CostModel(n_estimators=17, num_leaves=5, max_depth=3, min_child_samples=40).fit(X, y)
    booster = model.booster_
    assert booster.num_boosted_rounds() == 17
    trees = [json.loads(t) for t in booster.get_dump(dump_format="json", with_stats=True)]
    assert len(trees) == 17
    assert max(_leaves(t) for t in trees) <= 5
    assert max(_depth(t) for t in trees) <= 3
    # min_child_samples: with the squared error, a leaf's cover is its number of rows.
    frame = booster.trees_to_dataframe()
    assert frame.loc[frame["Feature"] == "Leaf", "Cover"].min() >= 40
    params = model.xgboost_params()
    assert params["grow_policy"] == "lossguide" and params["max_leaves"] == 5


def test_eval_set_is_recorded(data):
    X, y, X_test, y_test = data
    model = CostModel(n_estimators=12).fit(X, y, eval_set=[(X_test, y_test)])
    assert len(model.evals_result_["valid_0"]["rmse"]) == 12


@pytest.fixture(scope="module")
def groups():
    """Query groups of 20 candidates whose cost is ``x0 + x1**2`` plus a per-group offset that
    no feature explains (as a case's size is irrelevant to ranking its candidates)."""
    rng = np.random.default_rng(1)
    sizes = np.full(60, 20)
    X = rng.uniform(-2, 2, size=(sizes.sum(), 4)).astype(np.float32)
    offset = np.repeat(rng.normal(scale=5.0, size=sizes.size), sizes)
    cost = X[:, 0] + X[:, 1] ** 2 + offset
    return X, cost, sizes


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


@pytest.mark.parametrize(
    "objective,xgboost_objective", [("rank_pairwise", "rank:pairwise"), ("lambdarank", "rank:ndcg")]
)
def test_ranking_orders_within_groups(groups, objective, xgboost_objective):
    X, cost, sizes = groups
    train, test = slice(0, 1000), slice(1000, None)
    # rank:pairwise takes the cost as it is; NDCG needs integer relevance, higher is better.
    label = (
        cost
        if objective == "rank_pairwise"
        else np.clip(
            np.round(8 - 2 * (cost - np.repeat([cost[i : i + 20].min() for i in range(0, cost.size, 20)], 20))), 0, 8
        )
    )
    model = CostModel(objective=objective, n_estimators=40, num_leaves=15, random_state=0)
    model.fit(X[train], label[train], group=sizes[:50], eval_set=[(X[test], label[test])], eval_group=[sizes[50:]])
    assert model.ranking and model.xgboost_params()["objective"] == xgboost_objective
    metric = "auc" if objective == "rank_pairwise" else "ndcg@32"  # XGBoost's default cut-off
    scores = model.evals_result_["valid_0"]
    assert list(scores) == [metric] and len(scores[metric]) == 40
    pred = model.predict(X[test])
    sign = 1 if objective == "rank_pairwise" else -1
    # Held-out groups: scores follow the cost within each group (up to direction), and the best
    # score is one of the three cheapest candidates.
    correlations, picked = [], []
    for i in range(0, 200, 20):
        score, truth = sign * pred[i : i + 20], cost[test][i : i + 20]
        correlations.append(_rank_correlation(score, truth))
        picked.append(int((truth < truth[np.argmin(score)]).sum()))
    assert np.mean(correlations) > 0.8 and max(picked) < 3
    # The scores ignore what ranking cannot see: the offsets between groups.
    assert abs(_rank_correlation(pred, cost[test])) < 0.5


def test_ranking_needs_groups(groups):
    X, cost, sizes = groups
    with pytest.raises(ValueError, match="group: the objective"):
        CostModel(objective="rank_pairwise").fit(X, cost)
    with pytest.raises(ValueError, match="group: group sizes sum to 1180"):
        CostModel(objective="rank_pairwise").fit(X, cost, group=sizes[:-1])
    with pytest.raises(ValueError, match="group: group sizes must be positive ints"):
        CostModel(objective="rank_pairwise").fit(X, cost, group=np.r_[sizes[:-1], 0, 20])
    with pytest.raises(ValueError, match="group: query groups need a ranking objective"):
        CostModel().fit(X, cost, group=sizes)
    with pytest.raises(ValueError, match="eval_group: 0 groupings for 1"):
        CostModel(objective="rank_pairwise").fit(X, cost, group=sizes, eval_set=[(X, cost)], eval_group=[])
    with pytest.raises(ValueError, match="eval_group\\[0\\]: the objective"):
        CostModel(objective="rank_pairwise").fit(X, cost, group=sizes, eval_set=[(X, cost)])


def test_ranking_round_trip(groups, tmp_path):
    X, cost, sizes = groups
    model = CostModel(objective="rank_pairwise", n_estimators=5, random_state=2).fit(X, cost, group=sizes)
    loaded = CostModel.load(model.save_model(tmp_path / "ranker.json"))
    assert loaded.objective == "rank_pairwise" and loaded.ranking
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


def test_pairs_per_row_samples_pairs_over_each_group(groups, tmp_path):
    X, cost, sizes = groups
    default = CostModel(objective="rank_pairwise", n_estimators=40, num_leaves=15, random_state=0)
    spread = CostModel(objective="rank_pairwise", n_estimators=40, num_leaves=15, random_state=0, pairs_per_row=4)
    params = spread.xgboost_params()
    assert params["lambdarank_pair_method"] == "mean" and params["lambdarank_num_pair_per_sample"] == 4
    assert "lambdarank_pair_method" not in default.xgboost_params()
    default.fit(X[:1000], cost[:1000], group=sizes[:50])
    spread.fit(X[:1000], cost[:1000], group=sizes[:50])
    assert not np.array_equal(default.predict(X[1000:]), spread.predict(X[1000:]))
    # The lowest score of each held-out group is one of its three cheapest candidates.
    pred, truth = spread.predict(X[1000:]).reshape(10, 20), cost[1000:].reshape(10, 20)
    picked = [int((row < row[np.argmin(score)]).sum()) for score, row in zip(pred, truth)]
    assert max(picked) < 3
    loaded = CostModel.load(spread.save_model(tmp_path / "spread.json"))
    assert loaded.pairs_per_row == 4 and loaded.xgboost_params()["lambdarank_num_pair_per_sample"] == 4
    np.testing.assert_array_equal(loaded.predict(X), spread.predict(X))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"n_estimators": 0}, ValueError, "n_estimators"),
        ({"n_estimators": 2.5}, TypeError, "n_estimators"),
        ({"learning_rate": 0.0}, ValueError, "learning_rate"),
        ({"num_leaves": 1}, ValueError, "num_leaves"),
        ({"max_depth": 0}, ValueError, "max_depth"),
        ({"subsample": 1.5}, ValueError, "subsample"),
        ({"colsample_bytree": 0}, ValueError, "colsample_bytree"),
        ({"reg_lambda": -1.0}, ValueError, "reg_lambda"),
        ({"objective": "poisson"}, ValueError, "objective"),
        ({"random_state": "x"}, TypeError, "random_state"),
        ({"backend": "catboost"}, ValueError, "backend"),
        ({"objective": "rank_pairwise", "backend": "lightgbm"}, ValueError, "objective: 'rank_pairwise'"),
        ({"objective": "rank_pairwise", "pairs_per_row": 0}, ValueError, "pairs_per_row"),
        ({"objective": "rank_pairwise", "pairs_per_row": 2.0}, TypeError, "pairs_per_row"),
        ({"pairs_per_row": 8}, ValueError, "pairs_per_row: samples the pairs"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        CostModel(**kwargs)


def test_lightgbm_backend_needs_lightgbm():
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="lightgbm"):
            CostModel(backend="lightgbm")
    else:
        assert CostModel(backend="lightgbm").backend == "lightgbm"


def test_misuse_is_reported(data, tmp_path):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="booster_"):
        CostModel().predict(X)
    with pytest.raises(ValueError, match="y:"):
        CostModel().fit(X, y[:-1])
    with pytest.raises(ValueError, match="X:"):
        CostModel().fit(X[0], y[:1])
    with pytest.raises(ValueError, match="y:"):
        CostModel().fit(X, np.full_like(y, np.nan))
    model = CostModel(n_estimators=2).fit(X, y)
    with pytest.raises(ValueError, match="X: 5 columns"):
        model.predict(X[:, :5])
    with pytest.raises(ValueError, match="path"):
        model.save_model(tmp_path / "model.txt")
    with pytest.raises(FileNotFoundError, match="path"):
        CostModel.load(tmp_path / "missing.json")
