"""The small-graph rule suite on a CPU, through Triton's interpreter: its rows, summary and plot."""

import math

import pandas as pd
import pytest
import torch

from autotune.heuristic import small_graph_schedule
from benchmarks import report, rows, small_graph_rule
from pyg_ugrapher.ir import OpInfo


def test_rule_and_edge_schedules_in_both_orders(tmp_path, interpret):
    table = small_graph_rule.main(
        ["--graphs", "uni-n1e2-e1e3", "--ops", "copy_u_sum", "--features", "32", "--limit", "2"]
        + ["--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "small_graph_rule.csv")
    assert tuple(results.columns) == rows.SMALL_GRAPH_RULE_COLUMNS
    assert (results["status"] == "ok").all(), results["note"].tolist()
    rule = small_graph_schedule(OpInfo.from_name("copy_u_sum"), 32).serialize()
    # Two edge schedules of the space and the rule, in each order; the rule marked once per order.
    assert len(results) == 6 and set(results["edge_order"]) == {"user", "sorted"}
    assert results.loc[results["rule"] == 1, "config"].tolist() == [rule, rule]
    assert all(math.isfinite(v) and v > 0 for v in results["time_ms"])
    assert (results["num_edges"] == 1000).all() and (results["num_nodes"] == 100).all()
    assert set(table["edge_order"]) == {"user", "sorted"} and (table["cases"] == 1).all()
    assert (table["rule_geomean"] >= 1).all() and (table["best_fixed_geomean"] == 1).all()
    assert (tmp_path / "small_graph_rule.png").stat().st_size > 0
    assert "The small-graph rule" in report.write_report(tmp_path)


def test_summary_scores_the_rule_against_each_case_best():
    """Two cases: the rule is 2x the best in one and the best in the other (geometric mean
    sqrt(2), worst 2); the schedule "b" is best in both."""
    base = {"commit": "c", "graph": "g", "edge_order": "user", "F": 32, "status": "ok"}
    frame = pd.DataFrame(
        [
            {**base, "op": "copy_u_sum", "config": "rule", "rule": 1, "time_ms": 2.0},
            {**base, "op": "copy_u_sum", "config": "b", "rule": 0, "time_ms": 1.0},
            {**base, "op": "copy_u_max", "config": "rule", "rule": 1, "time_ms": 1.0},
            {**base, "op": "copy_u_max", "config": "b", "rule": 0, "time_ms": 1.0},
        ]
    )
    (row,) = report.small_graph_rule_summary(frame).itertuples(index=False)
    assert row.cases == 2 and row.rule_geomean == pytest.approx(2**0.5) and row.rule_worst == 2.0
    assert row.best_fixed == "b" and row.best_fixed_geomean == 1.0


def test_padded_batch_pads_to_a_bucket_with_one_row_of_loops():
    edge_index = torch.randint(0, 800, (2, 6000), generator=torch.Generator().manual_seed(0))
    padded, num_nodes = small_graph_rule.padded_batch(edge_index, 800, seed=1)
    again, _ = small_graph_rule.padded_batch(edge_index, 800, seed=1)
    assert torch.equal(padded, again)  # seeded
    kept = 800 // small_graph_rule.BATCH_FRACTION
    assert num_nodes > kept and int(padded.max()) < num_nodes
    loops = (padded[0] == kept) & (padded[1] == kept)  # the first padded node's loops
    real = padded[:, ~loops]
    assert int(real.max()) < kept and int(loops.sum()) == padded.size(1) - real.size(1) > 0
