"""``benchmarks.timing`` and the results files: what a measurement row holds on each kind of
device, and rows of an older version's file when a run is resumed."""
import math
import time

import pandas as pd
import pytest
import torch

from benchmarks import report, timing

SETTINGS = timing.Settings(warmup_ms=1.0, rep_ms=2.0, min_reps=3, max_cpu_reps=5)


def test_cpu_rows_have_no_host_column():
    """On a CPU every millisecond is host time: ``host_ms`` stays NaN, ``time_ms`` is wall-clock."""
    row = timing.measure(lambda: torch.ones(8).sum(), torch.device("cpu"), SETTINGS)
    assert row["status"] == "ok" and row["time_ms"] > 0 and math.isnan(row["host_ms"])


def test_each_compiled_row_notes_its_own_graph_breaks():
    """A compiled row lists the breaks of its own step, not those of the rows before it (Dynamo's
    reset keeps its counters)."""
    def breaking(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    step = torch.compile(breaking, backend="eager")
    first = timing.measure(lambda: step(torch.ones(4)), torch.device("cpu"), SETTINGS, compiled=True)
    assert first["graph_breaks"] == 1 and "graph_break" in first["note"]
    clean = torch.compile(lambda x: x * 3, backend="eager")
    second = timing.measure(lambda: clean(torch.ones(4)), torch.device("cpu"), SETTINGS, compiled=True)
    assert second["graph_breaks"] == 0 and second["note"] == ""


@pytest.mark.cuda
def test_host_time_of_a_host_bound_call():
    """A call that sleeps 2 ms on the host and launches one tiny kernel: its host time is at least
    the sleep, and ``time_ms`` (GPU events around the call) sees the same host time."""
    device = torch.device("cuda")
    x = torch.ones(8, device=device)

    def step():
        time.sleep(0.002)
        return x + 1

    row = timing.measure(step, device, SETTINGS)
    assert row["status"] == "ok"
    assert row["host_ms"] >= 2.0 and row["time_ms"] >= 1.5, row


@pytest.mark.cuda
def test_host_time_of_a_device_bound_call():
    """A call of one long kernel returns to the host long before the GPU finishes it."""
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    row = timing.measure(lambda: a @ a @ a, device, SETTINGS)
    assert row["status"] == "ok" and row["host_ms"] < row["time_ms"], row


def test_resuming_a_file_of_an_older_version_keeps_columns_aligned(tmp_path):
    """``--resume`` over a CSV written before a column existed rewrites it in the current columns
    before appending, so old and new rows line up."""
    path = tmp_path / "layers.csv"
    old_columns = [c for c in report.LAYER_COLUMNS if c != "host_ms"]
    old_row = {c: "" for c in old_columns}
    old_row.update(layer="GCNConv", graph="g", method="pyg", time_ms="1.5", status="ok")
    pd.DataFrame([old_row], columns=old_columns).to_csv(path, index=False)
    results = report.ResultsFile(path, report.LAYER_COLUMNS, report.LAYER_KEY, resume=True)
    assert results.done(("GCNConv", "g", "pyg"))
    results.write({"layer": "GCNConv", "graph": "g", "method": "ours", "time_ms": 0.5, "host_ms": 0.25,
                   "status": "ok"})
    frame = report.read(path, report.LAYER_COLUMNS)
    assert list(frame.columns) == list(report.LAYER_COLUMNS)
    assert frame.time_ms.tolist() == [1.5, 0.5]
    assert math.isnan(frame.host_ms[0]) and frame.host_ms[1] == 0.25
