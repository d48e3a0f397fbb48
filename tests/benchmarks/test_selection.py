"""The selection-time suite on a CPU (the bundled Cora): its rows, report table and plot, and that
an uncached call decides again."""

import math

import pandas as pd
import pytest
import torch

from autotune import selection
from benchmarks import report, rows
from benchmarks import selection as selection_suite
from pyg_ugrapher import GraphTensor
from pyg_ugrapher.datasets import load_cora
from pyg_ugrapher.ir import OpInfo


def test_rows_table_and_plot(tmp_path):
    selection_suite.main(
        ["--graphs", "cora", "--ops", "copy_u_sum", "u_dot_v", "--features", "16", "64"]
        + ["--repeats", "3", "--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "selection.csv")
    assert tuple(results.columns) == rows.SELECTION_COLUMNS
    assert (results["status"] == "ok").all(), results["note"].tolist()
    assert sorted(zip(results["op"], results["F"])) == [
        ("copy_u_sum", 16),
        ("copy_u_sum", 64),
        ("u_dot_v", 16),
        ("u_dot_v", 64),
    ]
    for column in ("stats_us", "uncached_us", "cached_us"):
        assert all(math.isfinite(v) and v > 0 for v in results[column]), column
    # No GPU: the heuristic decides, from the whole design space of each width.
    assert (results["chooser"] == "heuristic").all()
    assert (results["candidates"] > 1).all() and (results["num_edges"] == 10556).all()
    assert (tmp_path / "selection.png").stat().st_size > 0
    text = report.write_report(tmp_path)
    assert "Choosing a schedule" in text and "| cora | 10,556 | heuristic | 4 |" in text


def test_forgotten_decisions_are_made_again(monkeypatch):
    data = load_cora()
    csr = GraphTensor.from_edge_index(data.edge_index, data.num_nodes).csr("cpu")
    op = OpInfo.from_name("copy_u_sum")
    decided = []
    heuristic = selection.heuristic

    def counted(*args, **kwargs):
        decided.append(args)
        return heuristic(*args, **kwargs)

    monkeypatch.setattr(selection, "heuristic", counted)
    selection.forget_decisions()
    first = selection.select(csr, op, 32, torch.float32, device="cpu")
    assert selection.select(csr, op, 32, torch.float32, device="cpu") == first
    assert len(decided) == 1  # the second call looked the first one's decision up
    selection.forget_decisions()
    assert selection.select(csr, op, 32, torch.float32, device="cpu") == first
    assert len(decided) == 2


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--features", "0"], ["--ops", "copy_u_frobnicate"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        selection_suite.parse_args(argv)
