"""``benchmarks.timing`` and the results files: what a measurement row holds on each kind of
device, the environment columns, and rows of an older version's file when rows are appended."""

import math
import time

import pandas as pd
import pytest
import torch

from benchmarks import rows, timing

SETTINGS = timing.Settings(warmup_ms=1.0, rep_ms=2.0, min_reps=3, max_cpu_reps=5)


def test_cpu_rows_have_no_host_column():
    """On a CPU every millisecond is host time: ``host_ms`` and ``gpu_ms`` stay NaN, ``time_ms`` is
    wall-clock."""
    row = timing.measure(lambda: torch.ones(8).sum(), torch.device("cpu"), SETTINGS)
    assert row["status"] == "ok" and row["time_ms"] > 0
    assert math.isnan(row["host_ms"]) and math.isnan(row["gpu_ms"])


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
    assert row["gpu_ms"] < 0.5, row  # the busy-wait outlasts the host: the kernel alone


@pytest.mark.cuda
def test_host_time_of_a_device_bound_call():
    """A call of one long kernel returns to the host long before the GPU finishes it."""
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    row = timing.measure(lambda: a @ a @ a, device, SETTINGS)
    assert row["status"] == "ok" and row["host_ms"] < row["time_ms"], row


def test_appending_to_a_file_of_an_older_version_keeps_columns_aligned(tmp_path, monkeypatch):
    """A CSV written before a column existed is rewritten in the current columns before rows are
    appended, so old and new rows line up; with ``resume`` the current commit's rows count as done."""
    monkeypatch.setattr(rows, "commit", lambda: "abc1234")
    path = tmp_path / "layers.csv"
    old_columns = [c for c in rows.LAYER_COLUMNS if c != "host_ms"]
    old_row = {c: "" for c in old_columns}
    old_row.update(commit="abc1234", layer="GCNConv", graph="g", method="pyg", time_ms="1.5", status="ok")
    pd.DataFrame([old_row], columns=old_columns).to_csv(path, index=False)
    results = rows.ResultsFile(path, resume=True)
    assert results.done({"layer": "GCNConv", "graph": "g", "method": "pyg"})
    assert not results.done({"layer": "GCNConv", "graph": "g", "method": "ours"})
    written = results.write(
        {
            "commit": "abc1234",
            "layer": "GCNConv",
            "graph": "g",
            "method": "ours",
            "time_ms": 0.5,
            "host_ms": 0.25,
            "status": "ok",
        }
    )
    assert written["speedup_vs_pyg"] == 3.0  # from the resumed row
    frame = rows.read(path)
    assert list(frame.columns) == list(rows.LAYER_COLUMNS)
    assert frame.time_ms.tolist() == [1.5, 0.5]
    assert math.isnan(frame.host_ms[0]) and frame.host_ms[1] == 0.25
    assert not rows.ResultsFile(path).done({"layer": "GCNConv", "graph": "g", "method": "pyg"})


def test_unknown_columns_and_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="row: unknown columns"):
        rows.ResultsFile(tmp_path / "layers.csv").write({"layer": "GCNConv", "speed": 1.0})
    with pytest.raises(ValueError, match="path"):
        rows.ResultsFile(tmp_path / "headline.csv")


def test_environment_columns():
    env = rows.environment(torch.device("cpu"))
    assert tuple(env) == rows.ENV_COLUMNS
    assert env["gpu"].startswith("cpu") and env["timer"] == "wall" and env["torch"] == torch.__version__
    assert rows.default_out(torch.device("cpu")) == rows.RESULTS / "cpu"


def test_commit_is_the_short_hash_marked_dirty(monkeypatch, uncached_commit):
    monkeypatch.delenv(rows.COMMIT_ENV, raising=False)  # set where a copy without history runs
    outputs = {"rev-parse": "0c4048b", "status": " M benchmarks/run.py"}
    monkeypatch.setattr(rows, "_git", lambda *args: outputs[args[0]])
    assert rows.commit() == "0c4048b+dirty"
    rows.commit.cache_clear()
    outputs["status"] = ""
    assert rows.commit() == "0c4048b"
    rows.commit.cache_clear()
    monkeypatch.setattr(rows, "_git", lambda *args: None)
    assert rows.commit() == "unknown"
    rows.commit.cache_clear()
    monkeypatch.setenv(rows.COMMIT_ENV, "1234abc")
    assert rows.commit() == "1234abc"


def test_stopwatch_times_a_block():
    with timing.Stopwatch(torch.device("cpu")) as watch:
        time.sleep(0.002)
    assert watch.ms >= 1.5
