"""The host-call suite on a CPU (the bundled Cora): its rows, report table and plot."""

import math

import pandas as pd
import pytest

from benchmarks import host_calls, report, rows


def test_rows_table_and_plot(tmp_path):
    host_calls.main(
        [
            "--graphs",
            "cora",
            "--cases",
            "op copy_u_mean",
            "new graph SAGEConv",
            "new graph GCNConv",
            "new graph GATConv",
        ]
        + ["--calls", "2", "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "host_calls.csv")
    assert tuple(results.columns) == rows.HOST_CALL_COLUMNS
    assert (results["status"] == "ok").all(), results["note"].tolist()
    # The operator in both passes, the new graphs forward only; PyG's and ours each.
    cases = sorted(zip(results["case"], results["pass"], results["impl"]))
    assert cases == sorted(
        (case, pass_, impl)
        for case, pass_ in [
            ("op copy_u_mean", "forward"),
            ("op copy_u_mean", "forward+backward"),
            ("new graph SAGEConv", "forward"),
            ("new graph GCNConv", "forward"),
            ("new graph GATConv", "forward"),
        ]
        for impl in ("pyg", "ours")
    )
    for column in ("host_us", "wall_us", "python_calls"):
        assert all(math.isfinite(v) and v > 0 for v in results[column]), column
    assert (results["wall_us"] >= results["host_us"]).all()
    assert (results["num_nodes"] == 2708).all() and (results["num_edges"] == 10556).all()
    assert (tmp_path / "host_calls.png").stat().st_size > 0
    text = report.write_report(tmp_path)
    assert "Host time per call" in text and "new graph SAGEConv" in text


@pytest.mark.parametrize("case", ["compiled layer SAGEConv", "compiled op copy_u_sum"])
def test_a_compiled_case_times_both_compiled_calls(tmp_path, case):
    host_calls.main(
        ["--graphs", "cora", "--cases", case, "--calls", "2", "--repeats", "1"]
        + ["--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "host_calls.csv")
    assert (results["status"] == "ok").all(), results["note"].tolist()
    assert sorted(zip(results["pass"], results["impl"])) == [
        (pass_, impl) for pass_ in ("forward", "forward+backward") for impl in ("ours", "pyg")
    ]
    assert (results["host_us"] > 0).all() and (results["python_calls"] > 0).all()


def test_a_part_is_a_smaller_graph_and_unknown_graphs_are_refused():
    edge_index, num_nodes = host_calls.load_graph("cora-parts", seed=0)
    assert 0 < num_nodes < 2708 and int(edge_index.max()) < num_nodes
    with pytest.raises(ValueError, match="^graphs:"):
        host_calls.load_graph("cora-halves", seed=0)


def test_unknown_cases_and_counts_are_refused():
    with pytest.raises(SystemExit):
        host_calls.parse_args(["--cases", "op copy_u_prod"])
    with pytest.raises(SystemExit):
        host_calls.parse_args(["--calls", "0"])


def test_the_report_keeps_each_cases_newest_commit():
    """A run of a few cases replaces those cases' rows in the table and leaves the others' newest."""
    key = {"gpu": "h200", "graph": "cora", "F": 64, "pass": "forward", "status": "ok"}
    frame = pd.DataFrame(
        [
            {**key, "commit": commit, "case": case, "impl": impl, "host_us": host_us}
            for commit, case, impl, host_us in [
                ("old", "layer SAGEConv", "pyg", 200.0),
                ("old", "layer SAGEConv", "ours", 100.0),
                ("old", "new graph SAGEConv", "pyg", 300.0),
                ("old", "new graph SAGEConv", "ours", 900.0),
                ("new", "new graph SAGEConv", "pyg", 310.0),
                ("new", "new graph SAGEConv", "ours", 600.0),
            ]
        ]
    )
    table = report.host_calls_newest(frame).set_index("case")
    assert table.loc["layer SAGEConv", ["pyg", "ours", "commit"]].tolist() == [200.0, 100.0, "old"]
    assert table.loc["new graph SAGEConv", ["pyg", "ours", "commit"]].tolist() == [310.0, 600.0, "new"]
    assert "| cora | 64 | layer SAGEConv | forward | 200 | 100 | 2x | old |" in report.host_calls_table(frame)
