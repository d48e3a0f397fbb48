import numpy as np
import pandas as pd
import pytest

from autotune import evaluate as ev
from autotune.collect import read_table
from autotune.cost_model import CostModel
from autotune.features import FEATURES
from autotune.train import target, train, usable


@pytest.mark.parametrize("kind", ["log_time", "relative"])
def test_evaluate_writes_tables_and_plots(collected, tmp_path, kind):
    summary = ev.evaluate([collected], tmp_path, folds=2, n_estimators=5, kind=kind)
    for name in ("cases.csv", "summary.csv", "predicted_vs_measured.png", "chosen_vs_oracle.png"):
        assert (tmp_path / name).stat().st_size > 0
    cases = pd.read_csv(tmp_path / "cases.csv")
    table = read_table([collected])
    assert len(cases) == table.groupby(ev.CASE).ngroups == 2
    for method in ev.METHODS:
        assert (cases[method] >= 1).all()
    # The model's ratio is the time of the row it picked over the case's best time.
    for _, case in cases.iterrows():
        rows = table[(table["graph"] == case["graph"]) & (table["op"] == case["op"])]
        assert case["best_ms"] == pytest.approx(rows["time_ms"].min())
        picked = rows.loc[rows["config"] == case["model_config"], "time_ms"].iloc[0]
        assert case["model"] == pytest.approx(picked / rows["time_ms"].min())
        assert case["candidates"] == len(rows)
    assert list(summary.columns) == ["half", "method", "cases", "geomean", "within_10pct"]
    assert len(summary) == 9
    everything = summary[(summary["half"] == "all") & (summary["method"] == "model")].iloc[0]
    assert everything["geomean"] == pytest.approx(np.exp(np.log(cases["model"]).mean()))


def test_train_writes_a_loadable_model(collected, tmp_path):
    path = train([collected], tmp_path / "model.json", n_estimators=3)
    model = CostModel.load(path)
    assert model.booster_.num_boosted_rounds() == 3
    assert model.feature_names_ == list(FEATURES)
    assert model.booster_.attr("data_rows") == str(len(read_table([collected])))


def test_static_choice_is_best_geomean_over_training_cases():
    rows = []
    # Config "a" is 1.0/1.3 of the best in two cases, "b" 1.2/1.0: a's geomean 1.14, b's 1.095.
    for case, times in enumerate(({"a": 1.0, "b": 1.2}, {"a": 1.3, "b": 1.0})):
        for config, time in times.items():
            rows.append({"case": case, "gather": "sum", "F": 64, "config": config, "time_ms": time})
    rows.append({"case": 0, "gather": "sum", "F": 64, "config": "c", "time_ms": 0.5})  # only in one case
    rows.append({"case": 2, "gather": "none", "F": 64, "config": "m", "time_ms": 2.0})
    choices = ev.static_choices(pd.DataFrame(rows))
    assert choices == {(False, 64): "b", (True, 64): "m"}


def test_assign_folds():
    folds = ev.assign_folds(["g1", "g2", "g3", "g1"], 2, seed=0)
    assert set(folds) == {"g1", "g2", "g3"} and set(folds.values()) == {0, 1}
    with pytest.raises(ValueError, match="folds"):
        ev.assign_folds(["g1"], 2)
    with pytest.raises(ValueError, match="folds"):
        ev.assign_folds(["g1", "g2"], 1)


def test_targets(collected):
    rows = usable(read_table([collected]))
    log_time = target(rows, "log_time")
    np.testing.assert_allclose(log_time, np.log(rows["time_ms"]))
    relative = pd.Series(target(rows, "relative"))
    # Relative to the case mean: zero mean per case, same order within a case.
    for _, index in rows.groupby(ev.CASE).groups.items():
        assert relative[index].mean() == pytest.approx(0, abs=1e-9)
        assert (np.argsort(relative[index].to_numpy()) == np.argsort(log_time[index])).all()
    with pytest.raises(ValueError, match="target"):
        target(rows, "rank")
