import numpy as np
import pandas as pd
import pytest

from autotune import evaluate as ev
from autotune.collect import read_table
from autotune.cost_model import CostModel
from autotune.features import CASE_COLUMNS, FEATURES, KNOB_COLUMNS, frame_features
from autotune.selection import REFINE_MS, SMALL_GRAPH_EDGES
from autotune.train import PAIRS_PER_ROW, fit, train
from pyg_ugrapher.ir import OpInfo
from triton_kernels.space import neighbours, space


@pytest.mark.parametrize("kind", ["log_time", "relative", "rank"])
def test_evaluate_writes_tables_and_plots(collected, tmp_path, kind):
    summary = ev.evaluate([collected], tmp_path, folds=2, n_estimators=5, kind=kind)
    for name in ("cases.csv", "summary.csv", "sizes.csv", "predicted_vs_measured.png", "chosen_vs_oracle.png"):
        assert (tmp_path / name).stat().st_size > 0
    cases = pd.read_csv(tmp_path / "cases.csv")
    table = read_table([collected])
    assert len(cases) == table.groupby(ev.CASE).ngroups == 2
    for method in ev.METHODS:
        assert (cases[method].dropna() >= 1).all()
    # The model's ratio is the time of the row it picked over the case's best time.
    for _, case in cases.iterrows():
        rows = table[(table["graph"] == case["graph"]) & (table["op"] == case["op"])]
        assert case["best_ms"] == pytest.approx(rows["time_ms"].min())
        picked = rows.loc[rows["config"] == case["model_config"], "time_ms"].iloc[0]
        assert case["model"] == pytest.approx(picked / rows["time_ms"].min())
        assert case["candidates"] == len(rows)
    assert list(summary.columns) == ["half", "method", "cases", "geomean", "within_10pct"]
    assert len(summary) == 3 * len(ev.METHODS)
    everything = summary[(summary["half"] == "all") & (summary["method"] == "model")].iloc[0]
    assert everything["geomean"] == pytest.approx(np.exp(np.log(cases["model"]).mean()))
    sizes = pd.read_csv(tmp_path / "sizes.csv")
    assert sizes["cases"].sum() == len(cases)


def test_by_size_bins_the_best_time():
    cases = pd.DataFrame(
        {
            "best_ms": [0.01, 0.015, 0.3, 5.0],
            "model": [1.0, 1.44, 1.2, 1.05],
            "static": [2.0, 2.0, 1.0, np.nan],
            "single": [3.0, 2.0, 1.0, np.nan],
            "heuristic": [1.0, 1.0, 1.0, 1.0],
            "measured": [1.0, 1.0, 1.1, 1.0],
            "runtime": [2.0, 1.44, 1.2, 1.05],
        }
    )
    sizes = ev.by_size(cases).set_index("best_ms_from")
    assert list(sizes.index) == [0.0, 0.1, 2.0] and list(sizes["cases"]) == [2, 1, 1]
    assert sizes.loc[0.0, "model_geomean"] == pytest.approx(1.2)
    assert sizes.loc[0.0, "model_within_10pct"] == 0.5
    assert np.isnan(sizes.loc[2.0, "static_geomean"])
    assert sizes.loc[0.0, "single_geomean"] == pytest.approx(6**0.5)
    assert sizes.loc[0.0, "runtime_geomean"] == pytest.approx(2.88**0.5)
    assert sizes.loc[0.1, "measured_within_10pct"] == 1.0


@pytest.mark.parametrize("scale,expected", [(REFINE_MS, 1.0), (REFINE_MS / 2, 1.5)])
def test_measured_times_the_shortlist_then_refines_its_winner(scale, expected):
    """Of the whole space of a case, the best schedule is ranked last and one of its neighbours
    first: timing the shortlist finds the neighbour (1.5x the best), and a winner of at least
    REFINE_MS is refined to the best itself. The graph is scored by the model at run time."""
    op, F = OpInfo.from_name("copy_u_sum"), 32
    schedules = space(op, F)
    best, step = next(
        (info, n)
        for info in schedules
        for n in neighbours(info, op, F)
        if n in schedules and info in neighbours(n, op, F)
    )
    ranked = [step] + [info for info in schedules if info not in (best, step)] + [best]
    rows = pd.DataFrame(
        {
            "case": 0,
            "graph": "g",
            "op": "copy_u_sum",
            "F": F,
            "dtype": "float32",
            "gpu": "g",
            "family": "power_law",
            "config": [info.serialize() for info in ranked],
            "time_ms": [scale * (1.0 if info == best else 1.5 if info == step else 2.0) for info in ranked],
            "pred": np.arange(len(ranked), dtype=float),
            "static": False,
            "single": False,
            "heuristic": 0,
            "num_edges": float(2 * SMALL_GRAPH_EDGES),
            "op_text": op.serialize(),
        }
    )
    case = ev.case_table(rows).iloc[0]
    assert case[["model", "measured", "runtime"]].tolist() == pytest.approx([1.5, expected, 1.5])


def test_static_choices_per_width_and_for_every_width():
    """``static`` picks per (kind, F), ``single`` one schedule per kind: here "a" is best at F = 16
    and "b" at F = 32, while "b" is best over both widths; "c" covers too few cases to be chosen."""
    rows = []
    for case, (F, times) in enumerate(
        [
            (16, {"a": 1.0, "b": 1.2}),
            (16, {"a": 1.0, "b": 1.1, "c": 0.5}),
            (32, {"a": 3.0, "b": 1.0}),
            (32, {"a": 2.0, "b": 1.0}),
        ]
    ):
        rows += [{"case": case, "gather": "sum", "F": F, "config": c, "time_ms": t} for c, t in times.items()]
    train = pd.DataFrame(rows)
    assert ev.static_choices(train) == {(False, 16): "a", (False, 32): "b"}
    assert ev.static_choices(train, ("message",)) == {(False,): "b"}


@pytest.mark.parametrize("kind,objective", [("rank", "rank_pairwise"), ("relative", "regression")])
def test_train_writes_a_loadable_model(collected, tmp_path, kind, objective):
    path = train([collected], tmp_path / "model.json", n_estimators=3, kind=kind)
    model = CostModel.load(path)
    assert model.booster_.num_boosted_rounds() == 3
    assert model.feature_names_ == list(FEATURES)
    assert model.objective == objective and model.booster_.attr("target") == kind
    # The ranking draws its pairs over each whole case; the regressions have no pairs.
    assert model.pairs_per_row == (PAIRS_PER_ROW if kind == "rank" else None)
    assert model.booster_.attr("data_rows") == str(len(read_table([collected])))


def test_rank_fit_groups_rows_by_case():
    # Eight cases whose rows interleave (fit sorts them into one query group per case), each
    # graph 10x slower than the last; within a case the time grows with the block size, below
    # the clip, and the scores must follow it.
    rows = []
    for repeat in range(4):
        for scale, graph in enumerate(("g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8")):
            for step, block_e in enumerate((1, 2, 4, 8, 16, 32)):
                time_ms = 10.0**scale * (1 + 0.3 * step) * (1 + 0.01 * repeat)
                rows.append({"graph": graph, "block_e": block_e, "time_ms": time_ms})
    base = {name: 1.0 for name in CASE_COLUMNS + KNOB_COLUMNS}
    base.update(
        op="copy_u_sum",
        dtype="float32",
        gpu="g",
        gather="sum",
        strategy="vertex",
        F=16.0,
        status="ok",
        block_v=4.0,
        block_f=16.0,
        num_warps=1.0,
    )
    table = pd.DataFrame([{**base, **row} for row in rows])
    model = fit(table, n_estimators=10, kind="rank")
    score = model.predict(frame_features(table))
    assert (np.diff(score[:6]) > 0).all()
