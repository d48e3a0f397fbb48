"""Leaving each real graph out, and the stability of repeated measurements, on a table whose best
schedules are known: on graphs of skewness 0 the smallest edge block is fastest, on skewed graphs
the largest."""

import math

import numpy as np
import pandas as pd
import pytest

from autotune import __main__ as cli
from autotune import evaluate as ev
from autotune.features import CASE_COLUMNS, FEATURES, KNOB_COLUMNS
from autotune.heuristic import small_graph_schedule
from autotune.selection import MEASURE_EDGES, SMALL_GRAPH_EDGES
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo

#: graph -> (data family, row skewness); cora and citeseer are real graphs, the others synthetic.
GRAPHS = {
    "cora": ("power_law", 0.0),
    "citeseer": ("uniform", 5.0),
    "uni-a": ("uniform", 0.0),
    "pl-b": ("power_law", 5.0),
}
BLOCKS = (1, 2, 4, 8)
WIDTHS = (16, 32)
#: The schedule the table marks as the heuristic's.
HEURISTIC_BLOCK = 4


def time_of(skew: float, block_e: int) -> float:
    """1 ms for the best block, half a millisecond more per doubling away from it."""
    steps = math.log2(block_e) if skew == 0 else 3 - math.log2(block_e)
    return 1.0 + 0.5 * steps


def schedule(block_e: int) -> str:
    return ParallelInfo("vertex", block_v=1, block_e=block_e, block_f=16, num_warps=4).serialize()


def make_table() -> pd.DataFrame:
    base = {name: 1.0 for name in CASE_COLUMNS + KNOB_COLUMNS}
    base.update(op="copy_u_sum", dtype="float32", gpu="g", gather="sum", strategy="vertex", status="ok")
    rows = []
    for graph, (family, skew) in GRAPHS.items():
        for F in WIDTHS:
            for block_e in BLOCKS:
                rows.append(
                    {
                        **base,
                        "graph": graph,
                        "family": family,
                        "row_skew": skew,
                        "F": float(F),
                        "block_e": float(block_e),
                        "block_f": 16.0,
                        "config": schedule(block_e),
                        "heuristic": int(block_e == HEURISTIC_BLOCK),
                        "time_ms": time_of(skew, block_e),
                    }
                )
    return pd.DataFrame(rows)


class Ranker:
    """A model that ranks every case right (``sign=1``) or exactly wrong (``sign=-1``)."""

    def __init__(self, sign: int) -> None:
        self.sign = sign

    def predict(self, X: np.ndarray) -> np.ndarray:
        block = X[:, FEATURES.index("log_block_e")]
        skewed = X[:, FEATURES.index("row_skew")] != 0
        return self.sign * np.where(skewed, -block, block)


@pytest.fixture
def fits(monkeypatch):
    """The graphs of each training set given to ``fit``; the fitted model is :class:`Ranker`."""
    seen = []
    sign = [1]

    def spy(train, n_estimators=None, seed=0, kind="rank"):
        seen.append(set(train["graph"]))
        return Ranker(sign[0])

    monkeypatch.setattr(ev, "fit", spy)
    return seen, sign


def test_each_real_graph_is_predicted_by_a_model_that_never_saw_it(fits):
    seen, _ = fits
    rows = ev.leave_one_out(make_table())
    assert set(rows["graph"]) == {"cora", "citeseer"}
    assert rows["pred"].notna().all()
    # One fit per real graph, on every other graph, real and synthetic.
    assert sorted(map(sorted, seen)) == [["citeseer", "pl-b", "uni-a"], ["cora", "pl-b", "uni-a"]]
    for graph in ("cora", "citeseer"):
        fold = rows.loc[rows["graph"] == graph, "fold"].unique()
        assert len(fold) == 1 and graph not in seen[int(fold[0])]


def test_a_perfect_model_scores_one_and_the_baselines_their_known_ratios(fits, tmp_path):
    table = make_table()
    table.to_csv(tmp_path / "table.csv", index=False)
    out = tmp_path / "eval"
    ev.evaluate([tmp_path / "table.csv"], out, leave_out="real")
    cases = pd.read_csv(out / "cases.csv")
    assert sorted(set(cases["graph"])) == ["citeseer", "cora"] and len(cases) == 2 * len(WIDTHS)
    assert (cases["model"] == 1.0).all()
    # Trained on two graphs of the other skew and one of the same, the best static schedule is
    # the other skew's: its block is 8x off, 2.5x the best time.
    assert cases["static"].to_numpy() == pytest.approx(2.5)
    graphs = pd.read_csv(out / "graphs.csv").set_index(["graph", "method"])
    assert list(pd.read_csv(out / "graphs.csv").columns) == [
        "graph",
        "method",
        "cases",
        "geomean",
        "within_10pct",
        "worst",
    ]
    model = graphs.loc[("cora", "model")]
    assert (model["cases"], model["geomean"], model["within_10pct"], model["worst"]) == (2, 1.0, 1.0, 1.0)
    assert graphs.loc[("cora", "heuristic"), "geomean"] == pytest.approx(2.0)  # block 4: two doublings off
    assert graphs.loc[("citeseer", "heuristic"), "geomean"] == pytest.approx(1.5)  # one doubling off
    families = pd.read_csv(out / "families.csv").set_index(["family", "method"])
    assert families.loc[("power_law", "heuristic"), "worst"] == pytest.approx(2.0)
    assert families.loc[("uniform", "heuristic"), "within_10pct"] == 0.0
    widths = pd.read_csv(out / "widths.csv").set_index(["F", "method"])
    for F in WIDTHS:
        heuristic = widths.loc[(F, "heuristic")]
        assert heuristic["cases"] == 2 and heuristic["geomean"] == pytest.approx(3**0.5)
        assert heuristic["worst"] == pytest.approx(2.0)
    summary = pd.read_csv(out / "summary.csv").set_index(["half", "method"])
    assert summary.loc[("all", "model"), "cases"] == 4 and summary.loc[("all", "model"), "geomean"] == 1.0
    assert not (out / "stability.csv").exists()  # nothing was measured twice


def test_a_model_that_ranks_backwards_picks_the_slowest(fits):
    _, sign = fits
    sign[0] = -1
    cases = ev.case_table(ev.leave_one_out(make_table()))
    assert cases["model"].to_numpy() == pytest.approx(2.5)
    table = ev.grouped(cases, "F")
    assert set(table["F"]) == set(WIDTHS)
    assert table.loc[table["method"] == "model", "worst"].to_numpy() == pytest.approx(2.5)


def test_folds_still_cross_validate(fits):
    seen, _ = fits
    rows = ev.cross_validate(make_table(), folds=2)
    assert set(rows["graph"]) == set(GRAPHS) and rows["pred"].notna().all()
    assert len(seen) == 2 and all(len(graphs) == 2 for graphs in seen)


def test_leave_one_out_needs_real_graphs_and_others(fits):
    table = make_table()
    with pytest.raises(ValueError, match="graphs: none"):
        ev.leave_one_out(table[~table["graph"].isin(["cora", "citeseer"])])
    with pytest.raises(ValueError, match="graphs: every graph"):
        ev.leave_one_out(table[table["graph"].isin(["cora", "citeseer"])])
    with pytest.raises(ValueError, match="leave_out"):
        ev.evaluate([], "unused", leave_out="synthetic")


def test_stability_of_schedules_measured_twice(fits, tmp_path):
    table = make_table()
    assert ev.stability(table) is None
    again = table.assign(time_ms=table["time_ms"] * 1.05)
    # On cora at F = 16, the second measurement of the best schedule is 60% slower: the schedule
    # one doubling away (1.5 ms, 1.575 ms the second time) wins it.
    slow = (again["graph"] == "cora") & (again["F"] == 16) & (again["block_e"] == 1)
    again.loc[slow, "time_ms"] = 1.6
    result = ev.stability(pd.concat([table, again], ignore_index=True)).set_index(["graph", "F"])
    assert len(result) == len(GRAPHS) * len(WIDTHS) and (result["schedules"] == len(BLOCKS)).all()
    changed = result.loc[("cora", 16)]
    assert changed["oracle"] == pytest.approx(1.6 / 1.575)
    assert changed["spread"] == pytest.approx((1.6 * 1.05**3) ** 0.25)
    assert changed["within_10pct"] == 0.75
    steady = result.drop(("cora", 16))
    assert steady["oracle"].to_numpy() == pytest.approx(1.0)
    assert steady["spread"].to_numpy() == pytest.approx(1.05) and (steady["within_10pct"] == 1.0).all()
    # evaluate writes it beside the cases.
    pd.concat([table, again]).to_csv(tmp_path / "twice.csv", index=False)
    ev.evaluate([tmp_path / "twice.csv"], tmp_path / "eval", folds=2)
    assert len(pd.read_csv(tmp_path / "eval" / "stability.csv")) == len(result)


def test_cli_leaves_real_graphs_out(tmp_path):
    make_table().to_csv(tmp_path / "table.csv", index=False)
    args = cli.parser().parse_args(["evaluate", "--data", str(tmp_path / "table.csv"), "--leave-one-out", "real"])
    assert args.leave_one_out == "real" and args.out is None
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["evaluate", "--data", "x", "--leave-one-out", "everything"])
    out = tmp_path / "eval"
    argv = ["evaluate", "--data", str(tmp_path / "table.csv"), "--leave-one-out", "real", "--out", str(out)]
    assert cli.main(argv + ["--n-estimators", "5"]) == 0
    for name in ("cases.csv", "summary.csv", "graphs.csv", "families.csv", "widths.csv", "chosen_vs_oracle.png"):
        assert (out / name).stat().st_size > 0
    cases = pd.read_csv(out / "cases.csv")
    assert set(cases["graph"]) == {"cora", "citeseer"} and (cases["model"] >= 1).all()


def test_one_gpus_cases_are_scored_by_models_trained_on_every_gpu(monkeypatch, tmp_path):
    """Two GPUs' tables: with ``score_gpu`` the models still train on both (every fit sees both
    GPUs' rows), only the named GPU's real graphs are held out (citeseer, measured on the other
    GPU only, stays in every training set) and only its cases are scored; an unknown slug is
    refused."""
    seen_gpus, seen_graphs = [], []

    def spy(train, n_estimators=None, seed=0, kind="rank"):
        seen_gpus.append(set(train["gpu"]))
        seen_graphs.append(set(train["graph"]))
        return Ranker(1)

    one, other = make_table().assign(gpu="NVIDIA H200"), make_table().assign(gpu="NVIDIA H100 80GB HBM3")
    one = one[one["graph"] != "citeseer"]
    other["time_ms"] = other["time_ms"] * 2.0
    pd.concat([one, other]).to_csv(tmp_path / "table.csv", index=False)
    monkeypatch.setattr(ev, "fit", spy)
    out = tmp_path / "eval"
    argv = ["evaluate", "--data", str(tmp_path / "table.csv"), "--leave-one-out", "real", "--out", str(out)]
    assert cli.main(argv + ["--score-gpu", "h200"]) == 0
    assert seen_gpus and all(gpus == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"} for gpus in seen_gpus)
    assert seen_graphs == [{"citeseer", "uni-a", "pl-b"}]
    cases = pd.read_csv(out / "cases.csv")
    assert set(cases["gpu"]) == {"NVIDIA H200"} and set(cases["graph"]) == {"cora"} and len(cases) == len(WIDTHS)
    assert (cases["best_ms"] == 1.0).all() and (cases["model"] == 1.0).all()
    with pytest.raises(ValueError, match="^score_gpu: no rows of 'a100'"):
        ev.evaluate([tmp_path / "table.csv"], tmp_path / "none", leave_out="real", score_gpu="a100")
    assert not (tmp_path / "none").exists()


def exhaustive_cora() -> pd.DataFrame:
    """cora's cases timed again over a larger space: every block of :data:`BLOCKS` and one more."""
    table = make_table()
    cora = table[table["graph"] == "cora"]
    wider = cora[cora["block_e"] == 8].assign(block_e=16.0, config=schedule(16), heuristic=0)
    return pd.concat([cora, wider.assign(time_ms=time_of(0.0, 16))], ignore_index=True)


def test_only_the_exhaustive_cases_are_scored_by_models_that_never_saw_their_graph(fits, tmp_path):
    seen, _ = fits
    table, exhaustive = make_table(), exhaustive_cora()
    rows = ev.against_oracle(table, exhaustive)
    # Only cora is exhaustive: it alone is held out, from both tables' training rows.
    assert seen == [{"citeseer", "uni-a", "pl-b"}]
    assert set(rows["graph"]) == {"cora"} and len(rows) == len(exhaustive)
    cases = ev.case_table(rows)
    assert len(cases) == len(WIDTHS) and (cases["candidates"] == len(BLOCKS) + 1).all()
    assert (cases["model"] == 1.0).all()
    # evaluate() with the oracle: the same cases, and the schedules timed in both tables compared.
    table.to_csv(tmp_path / "sampled.csv", index=False)
    exhaustive.assign(time_ms=exhaustive["time_ms"] * 1.05).to_csv(tmp_path / "oracle.csv", index=False)
    out = tmp_path / "eval"
    ev.evaluate([tmp_path / "sampled.csv"], out, oracle=[tmp_path / "oracle.csv"])
    written = pd.read_csv(out / "cases.csv")
    assert set(written["graph"]) == {"cora"} and len(written) == len(WIDTHS)
    assert set(pd.read_csv(out / "graphs.csv")["graph"]) == {"cora"}
    stability = pd.read_csv(out / "stability.csv")
    assert (stability["schedules"] == len(BLOCKS)).all() and stability["spread"].to_numpy() == pytest.approx(1.05)
    with pytest.raises(ValueError, match="oracle: no real graph"):
        ev.against_oracle(table, table[table["graph"] == "uni-a"])


def test_choices_are_scored_against_a_second_timing_of_the_oracle(fits, tmp_path):
    """A second exhaustive timing of cora, 2% slower, but for the oracle's best schedule at F = 16,
    timed 1.6 ms: the model's choice (the oracle's best) scores 1.6 / 1.53 there, as a perfect
    model of the oracle does; at F = 32 both score 1. ``stability.csv`` compares the oracle with
    the repeat, and a repeat without an oracle is refused."""
    table, exhaustive = make_table(), exhaustive_cora()
    repeat = exhaustive.assign(time_ms=exhaustive["time_ms"] * 1.02)
    repeat.loc[(repeat["F"] == 16) & (repeat["block_e"] == 1), "time_ms"] = 1.6
    for name, frame in (("sampled", table), ("oracle", exhaustive), ("repeat", repeat)):
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
    out = tmp_path / "eval"
    argv = ["evaluate", "--data", str(tmp_path / "sampled.csv"), "--oracle", str(tmp_path / "oracle.csv")]
    assert cli.main(argv + ["--repeat", str(tmp_path / "repeat.csv"), "--out", str(out)]) == 0
    scored = pd.read_csv(out / "repeat.csv").set_index("F")
    assert list(scored.index) == [16.0, 32.0] and (scored["schedules"] == len(BLOCKS) + 1).all()
    assert (scored["model"] == 1.0).all()
    assert scored.loc[16.0, "model_repeat"] == pytest.approx(1.6 / (1.5 * 1.02))
    assert scored.loc[16.0, "oracle_repeat"] == pytest.approx(1.6 / (1.5 * 1.02))
    assert scored.loc[32.0, ["model_repeat", "oracle_repeat"]].to_numpy() == pytest.approx(1.0)
    stability = pd.read_csv(out / "stability.csv").set_index("F")
    assert (stability["schedules"] == len(BLOCKS) + 1).all()
    assert stability.loc[32.0, "spread"] == pytest.approx(1.02)
    with pytest.raises(ValueError, match="^repeat: "):
        ev.evaluate([tmp_path / "sampled.csv"], tmp_path / "none", repeat=[tmp_path / "repeat.csv"])


def test_runtime_is_the_small_graph_rule_below_its_size_and_the_model_above(fits):
    """The rule's schedule (a vertex schedule's row renamed to it: 2.5x the best on cora, where
    block 8 is three doublings off) scores the runtime on a small graph; on a large one the
    model's choice does, and from MEASURE_EDGES the measured choice: the shortlist holds the
    model's four best, every block here, so timing them finds the best where the model ranks
    backwards."""
    table = make_table()
    op = OpInfo.from_name("copy_u_sum")
    rules = {F: small_graph_schedule(op, F).serialize() for F in WIDTHS}
    table["op_text"] = op.serialize()
    renamed = table["block_e"] == 8
    table.loc[renamed, "config"] = table.loc[renamed, "F"].map(lambda F: rules[int(F)])
    cases = ev.case_table(ev.leave_one_out(table)).set_index(["graph", "F"])
    assert cases.loc["cora", "runtime"].to_numpy() == pytest.approx(2.5)
    assert cases.loc["citeseer", "runtime"].to_numpy() == pytest.approx(1.0)  # skewed: block 8 is best
    at_the_bound = ev.case_table(ev.leave_one_out(table.assign(num_edges=float(SMALL_GRAPH_EDGES))))
    assert at_the_bound.set_index(["graph", "F"]).loc["cora", "runtime"].to_numpy() == pytest.approx(2.5)
    large = table.assign(num_edges=float(SMALL_GRAPH_EDGES + 1))
    cases = ev.case_table(ev.leave_one_out(large))
    assert (cases["runtime"] == cases["model"]).all() and (cases["measured"] == 1.0).all()
    _, sign = fits
    sign[0] = -1
    measured = table.assign(num_edges=float(MEASURE_EDGES))
    cases = ev.case_table(ev.leave_one_out(measured))
    assert (cases["model"] == 2.5).all() and (cases["runtime"] == 1.0).all() and (cases["measured"] == 1.0).all()
    # A table without the operator's text (older collections) has no rule to look up.
    cases = ev.case_table(ev.leave_one_out(make_table()))
    assert cases["runtime"].isna().all()


def test_cli_scores_against_the_oracle(tmp_path):
    make_table().to_csv(tmp_path / "table.csv", index=False)
    exhaustive_cora().to_csv(tmp_path / "oracle.csv", index=False)
    args = cli.parser().parse_args(["evaluate", "--data", str(tmp_path / "table.csv"), "--oracle", str(tmp_path)])
    assert args.oracle == [tmp_path]
    out = tmp_path / "eval"
    argv = ["evaluate", "--data", str(tmp_path / "table.csv"), "--oracle", str(tmp_path / "oracle.csv")]
    assert cli.main(argv + ["--out", str(out), "--n-estimators", "5"]) == 0
    assert set(pd.read_csv(out / "cases.csv")["graph"]) == {"cora"}
