"""The operator-level harness end to end on toy graphs on the CPU, and its building blocks.

These runs check the harness, not performance: on a CPU our side runs the reference executor and
times are wall-clock. Compilation uses the ``aot_eager`` backend (Dynamo and AOTAutograd, no code
generation), which keeps every compiled code path at a fraction of inductor's compile time.
"""

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

# `benchmarks` is a plain folder at the repository root, not an installed package.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from torch_geometric.utils import scatter  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
from autotune import selection  # noqa: E402
from autotune.collect import collection_path  # noqa: E402
from benchmarks import graphs, ops, report, rows, run, timing  # noqa: E402
from benchmarks.rows import OPS_COLUMNS  # noqa: E402
from pyg_ugrapher.structure import marked_reused  # noqa: E402
from triton_kernels import space  # noqa: E402

TINY = ["--tiny", "--device", "cpu", "--compile-backend", "aot_eager"]


def _oracle_table(folder: Path, graph: str, device: str) -> dict:
    """Exhaustive timings of ``graph`` on ``device`` for the tiny run's forward operators, as
    ``autotune collect`` writes them, with decoys the ``oracle`` method must skip (a backward op,
    a failed and a half-precision row faster than every schedule): the three fastest schedules of
    each (op, F), fastest first."""
    rows, fastest = [], {}
    for op in ops.OPS:
        for F in ops.TINY_FEATURES:
            schedules = space(ug.OpInfo.from_name(op), F)[:5]
            for i, schedule in enumerate(schedules):
                row = dict(op=op, F=F, reverse=0, dtype="float32", status="ok", config=schedule.serialize())
                rows.append({**row, "time_ms": 1.0 + (i * 7 % 5)})
            for decoy in ({"reverse": 1}, {"status": "error"}, {"dtype": "float16"}):
                rows.append({**row, "time_ms": 0.5, **decoy})
            by_time = sorted(range(len(schedules)), key=lambda i: i * 7 % 5)
            fastest[(op, F)] = [schedules[i].serialize() for i in by_time[:3]]
    path = collection_path(folder, graph, device)
    pd.DataFrame(rows).to_csv(path, index=False)
    return fastest


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory):
    """The tiny ops suite on the CPU; the ``oracle`` method finds timings of cora alone."""
    out = tmp_path_factory.mktemp("ops")
    oracle = tmp_path_factory.mktemp("oracle")
    fastest = _oracle_table(oracle, "cora", rows.device_name(torch.device("cpu")))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops, "ORACLE", oracle)
        ops._oracle_table.cache_clear()
        report = run.main(["--suite", "ops", "--out", str(out), *TINY])
    ops._oracle_table.cache_clear()
    return out, pd.read_csv(out / "ops.csv"), report, fastest


@pytest.fixture(scope="module")
def headline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("headline")
    argv = [
        "--suite",
        "headline",
        "--out",
        str(out),
        *TINY,
        "--layers",
        "GCNConv",
        "--ours-layers",
        "torch_geometric.nn",
    ]
    report = run.main(argv)
    return out, argv, pd.read_csv(out / "ops.csv"), report


def test_ops_rows(ops_run):
    _, frame, _, _ = ops_run
    assert tuple(frame.columns) == OPS_COLUMNS
    assert set(frame.method) == {"pyg", "cusparse", "ours", "ours_recorded", "oracle", "sweep", "floor"}
    assert set(frame.op) == set(ops.OPS)
    assert set(frame.F) == set(ops.TINY_FEATURES)
    without_oracle = (frame.method == "oracle") & (frame.graph != "cora")
    assert (frame[~without_oracle].status == "ok").all(), frame[frame.status != "ok"].note.tolist()
    assert (frame[without_oracle].status == "unavailable").all() and without_oracle.any()
    assert frame[without_oracle].note.str.startswith("no exhaustive timings of this graph on this device").all()
    assert set(frame[frame.method == "cusparse"].op) == {"copy_u_sum", "u_mul_e_sum"}
    assert not (frame[frame.method.isin(ops.FORWARD_ONLY)]["pass"] == "fwd+bwd").any()
    timed = frame[(frame.method != "floor") & ~without_oracle]
    assert (timed.time_ms > 0).all() and (timed.first_call_s > 0).all()
    assert (frame.timer == "wall").all() and frame.gpu.str.startswith("cpu").all() and (frame.suite == "ops").all()
    for column in ("torch", "triton", "torch_geometric", "date", "commit"):
        assert frame[column].notna().all()
    assert (frame[frame.method.isin(["ours", "ours_recorded"])].schedule == "reference").all()
    # Speed-ups over the baselines measured before them in the same case.
    ours = frame[frame.method == "ours"]
    assert (ours.speedup_vs_pyg > 0).all() and ours.speedup_vs_pyg_compiled.isna().all()
    fwd = ours[ours["pass"] == "fwd"].set_index(["graph", "op", "F"])
    pyg = frame[(frame.method == "pyg") & (frame["pass"] == "fwd")].set_index(["graph", "op", "F"])
    assert (fwd.speedup_vs_pyg - pyg.time_ms.reindex(fwd.index) / fwd.time_ms).abs().max() < 1e-9
    assert ours[(ours.op == "copy_u_sum") & (ours["pass"] == "fwd")].speedup_vs_cusparse.notna().all()


def test_oracle_rows_keep_the_fastest_of_the_oracles_best(ops_run):
    """An ``oracle`` row times the oracle's three fastest forward float32 schedules of its case
    again and keeps one of them, checked against PyG like every row."""
    _, frame, _, fastest = ops_run
    oracle = frame[(frame.method == "oracle") & (frame.graph == "cora")]
    assert len(oracle) == len(ops.OPS) * len(ops.TINY_FEATURES) and (oracle["pass"] == "fwd").all()
    for row in oracle.itertuples():
        assert row.schedule in fastest[(row.op, row.F)] and row.strategy == row.schedule.split(":")[0]
        assert row.note == "fastest of the oracle's 3 fastest schedules" and row.max_rel_err <= timing.TOLERANCE
        assert isinstance(row.config, float)  # empty: one row per case, which --resume finds


def test_oracle_schedules_read_the_collected_timings(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "ORACLE", tmp_path)
    ops._oracle_table.cache_clear()
    fastest = _oracle_table(tmp_path, "cora", "NVIDIA H200")
    try:
        got = ops.oracle_schedules("cora", "copy_u_sum", 8, "NVIDIA H200")
        assert [s.serialize() for s in got] == fastest[("copy_u_sum", 8)]
        assert [s.serialize() for s in ops.oracle_schedules("cora", "copy_u_sum", 8, "NVIDIA H200", top=1)] == (
            fastest[("copy_u_sum", 8)][:1]
        )
        assert ops.oracle_schedules("cora", "copy_u_sum", 8, "NVIDIA H100") == []
        assert ops.oracle_schedules("citeseer", "copy_u_sum", 8, "NVIDIA H200") == []
        assert ops.oracle_schedules("cora", "copy_u_sum", 32, "NVIDIA H200") == []
    finally:
        ops._oracle_table.cache_clear()


def test_ops_outputs_are_checked_against_pyg(ops_run):
    _, frame, _, _ = ops_run
    checked = frame[frame.method.isin(["ours", "ours_recorded", "cusparse", "sweep"])]
    assert checked.max_rel_err.notna().all()
    assert (checked.max_rel_err <= timing.TOLERANCE).all()
    for method in ("ours", "ours_recorded"):
        assert set(checked[checked.method == method]["pass"]) == {"fwd", "fwd+bwd"}
    sweep = frame[frame.method == "sweep"]
    assert (sweep.schedule == sweep.config).all() and set(sweep.strategy) == {"vertex", "edge", "group"}


def test_ops_report(ops_run):
    out, _, report, _ = ops_run
    assert "### Operators over the corpus" in report and "| op | pass | F |" in report
    assert "GPU time: oracle vs PyG comp." in report
    assert (out / "report.md").read_text() == report and "![ops](ops.png)" in report
    full = (out / "ops.md").read_text()
    assert "### copy_u_max, fwd+bwd (ms)" in full and "best group" in full and "oracle (GPU)" in full
    assert (out / "ops.png").stat().st_size > 0


def test_headline_rows(headline_run):
    out, _, frame, report = headline_run
    assert tuple(frame.columns) == OPS_COLUMNS
    assert set(frame.op) == set(ops.HEADLINE_OPS)
    assert set(frame.method) == {"pyg", "pyg_compiled", "cusparse", "ours", "ours_compiled", "ours_recorded", "floor"}
    assert (frame.status == "ok").all(), frame[frame.status != "ok"].note.tolist()
    compiled = frame[frame.method.isin(ops.COMPILED)]
    assert compiled.graph_breaks.notna().all() and (compiled.graphs >= 1).all()
    checked = frame[frame.method.isin(["pyg_compiled", "cusparse", "ours", "ours_compiled", "ours_recorded"])]
    assert (checked.max_rel_err <= timing.TOLERANCE).all()
    assert (frame.suite == "headline").all()
    assert "### Operators: time (ms, median)" in report and "### Layers" in report
    assert (out / "ops.png").stat().st_size > 0 and (out / "layers.csv").exists()


def test_setup_check_compares_with_the_issue(headline_run):
    out, _, _, _ = headline_run
    frame = rows.read(out / "ops.csv")
    frame = frame.assign(graph=frame.graph.str.replace("uniform-4.8k", "uniform-16M"), F="128")
    text = report.setup_check(frame, None)
    assert "| uniform-16M | copy_u_sum | fwd | pyg_compiled | time_ms | 9.69 |" in text


def test_resume_measures_only_what_is_missing(headline_run):
    out, argv, frame, _ = headline_run
    run.main(argv + ["--resume"])
    assert len(pd.read_csv(out / "ops.csv")) == len(frame)


def test_time_budget_skips_and_still_reports(tmp_path):
    log = tmp_path / "run.log"
    report = run.main(["--suite", "ops", "--out", str(tmp_path), *TINY, "--time-budget", "0", "--log", str(log)])
    assert not (tmp_path / "ops.csv").exists()
    assert "time budget of 0.0 s exhausted" in log.read_text()
    assert "No results yet." in report


def test_a_second_run_appends_and_the_plot_is_drawn_from_the_csv(tmp_path, monkeypatch, uncached_commit):
    """Each run appends its rows, with the environment columns, under one header; the plot is
    redrawn from the CSV alone, from the newest row of each case. The commit is all digits, as a short
    hash can be: it must read back as text."""
    monkeypatch.setenv(rows.COMMIT_ENV, "1234567")
    argv = [
        "--suite",
        "ops",
        "--out",
        str(tmp_path),
        *TINY,
        "--graphs",
        "cora",
        "--ops",
        "copy_u_sum",
        "--features",
        "8",
        "--sweep-size",
        "0",
    ]
    run.main(argv)
    csv = tmp_path / "ops.csv"
    first = rows.read(csv)
    assert tuple(first.columns) == OPS_COLUMNS and len(first)
    for column in rows.ENV_COLUMNS + (
        "graph",
        "op",
        "F",
        "dtype",
        "pass",
        "method",
        "time_ms",
        "peak_mib",
        "speedup_vs_pyg",
    ):
        assert column in first.columns
    assert (first.commit == "1234567").all() and (first.gpu.str.startswith("cpu")).all()
    run.main(argv)
    both = rows.read(csv)
    assert len(both) == 2 * len(first)
    assert csv.read_text().count("date,commit,gpu") == 1
    png = tmp_path / "ops.png"
    png.unlink()
    assert report.plot(csv) == png and png.stat().st_size > 0
    report.main(["--plot", str(csv)])
    assert png.exists()


def test_plots_and_tables_show_the_newest_row_of_each_case(tmp_path):
    """A rerun of some cases replaces their rows in the tables and plots, and the cases it did not
    run keep theirs; each table row and the environment line name the commits."""
    base = {c: "" for c in rows.LAYER_COLUMNS}
    base.update(suite="layers", graph="g", F="16", gpu="NVIDIA H100 80GB HBM3", timer="cuda_event", status="ok")
    old = [
        {**base, "layer": layer, "commit": "aaaaaaa", "method": m, "time_ms": t}
        for layer in ("GCNConv", "GATConv")
        for m, t in (("pyg", 9.0), ("ours", 3.0))
    ]
    new = [
        {**base, "layer": "GCNConv", "commit": "bbbbbbb", "method": m, "time_ms": t}
        for m, t in (("pyg", 8.0), ("ours", 2.0))
    ]
    path = tmp_path / "layers.csv"
    written = rows.write_rows(path, old + new)
    assert written[-1]["speedup_vs_pyg"] == 4.0
    newest = report.load(path)
    assert len(newest) == 4
    gcn = newest[newest.layer == "GCNConv"]
    assert set(gcn.commit) == {"bbbbbbb"} and sorted(gcn.time_ms) == [2.0, 8.0]
    assert set(newest[newest.layer == "GATConv"].commit) == {"aaaaaaa"}
    text = report.write_report(tmp_path)
    assert "commit aaaaaaa, bbbbbbb" in text
    assert "| GCNConv | g | 8 |" in text and "| GATConv | g | 9 |" in text
    gcn_line = next(line for line in text.splitlines() if line.startswith("| GCNConv"))
    gat_line = next(line for line in text.splitlines() if line.startswith("| GATConv"))
    assert gcn_line.endswith("| bbbbbbb |") and gat_line.endswith("| aaaaaaa |")
    assert (tmp_path / "layers.png").stat().st_size > 0


def test_the_summary_compares_gpu_times_where_rows_have_them():
    """The summary's GPU-time columns divide the baselines' ``gpu_ms`` by ours (geometric mean over
    graphs), apart from ``time_ms``; rows without GPU times (a CPU run, an older file) give none."""
    base = {c: float("nan") if c in rows.NUMERIC else "" for c in rows.OPS_COLUMNS}
    base.update(suite="ops", op="copy_u_sum", F="32", status="ok", commit="aaaaaaa")
    times = {"cusparse": (2.0, 0.04), "pyg_compiled": (3.0, 0.09), "ours": (4.0, 0.01)}
    frame = pd.DataFrame(
        [
            {**base, "graph": graph, "pass": "fwd", "method": method, "time_ms": wall, "gpu_ms": gpu * scale}
            for graph, scale in (("a", 1.0), ("b", 4.0))
            for method, (wall, gpu) in times.items()
        ]
    )
    summary, _ = report.ops_tables(frame)
    row = next(line for line in summary.splitlines() if line.startswith("| copy_u_sum"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[7] == "0.5x"  # time_ms: cuSPARSE's 2.0 over our 4.0
    assert cells[8:10] == ["9x", "4x"]  # gpu_ms: PyG compiled's and cuSPARSE's over ours
    summary, _ = report.ops_tables(frame.drop(columns="gpu_ms"))
    row = next(line for line in summary.splitlines() if line.startswith("| copy_u_sum"))
    assert [cell.strip() for cell in row.strip("|").split("|")][8:10] == ["–", "–"]


def test_failures_become_rows(tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(ops.ug, "compute", out_of_memory)
    run.main(
        [
            "--suite",
            "ops",
            "--out",
            str(tmp_path),
            *TINY,
            "--graphs",
            "cora",
            "--ops",
            "copy_u_sum",
            "--features",
            "8",
            "--sweep-size",
            "1",
        ]
    )
    frame = pd.read_csv(tmp_path / "ops.csv")
    ours = frame[frame.method.isin(["ours", "sweep"])]
    assert (ours.status == "oom").all() and ours.note.str.contains("out of memory").all()
    assert (frame[frame.method == "pyg"].status == "ok").all()


def test_unloadable_graphs_become_rows(tmp_path, monkeypatch):
    def missing(self, device):
        raise FileNotFoundError("no shared datasets folder")

    monkeypatch.setattr(graphs.GraphSpec, "load", missing)
    report = run.main(["--suite", "ops", "--out", str(tmp_path), *TINY, "--graphs", "cora", "--ops", "copy_u_sum"])
    frame = pd.read_csv(tmp_path / "ops.csv")
    assert frame[["graph", "method", "status"]].values.tolist() == [["cora", "load", "unavailable"]]
    assert "could not load: cora (unavailable: FileNotFoundError: no shared datasets folder)" in report


def test_recorded_graph_is_read_as_recorded_steps_read_it(monkeypatch):
    """``ours_recorded`` runs on a second graph of the same edges whose structure is sorted and
    marked as read by recorded steps (the cost model's schedules on a small GPU graph), built
    once; the plain graph keeps the user's order where the small-graph rule reads it."""
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: True)
    loaded = graphs.GraphSpec("uniform", num_nodes=40, num_edges=200).load(torch.device("cpu"))
    recorded = loaded.recorded_graph
    assert recorded is loaded.recorded_graph and recorded is not loaded.graph
    assert torch.equal(recorded.edge_index, loaded.edge_index)
    built = recorded.structure(torch.device("cpu"))
    assert not built.csr.user_order and marked_reused(built.csr.rowptr) and marked_reused(built.csc.rowptr)
    plain = loaded.graph.eager_structure(torch.device("cpu"))
    assert plain.csr.user_order and not marked_reused(plain.csr.rowptr)


def test_features_hold_no_exact_zero():
    """A feature exactly 0 that is a destination's maximum gets half its gradient from PyG's max
    aggregation (the other half goes to the zero-filled output), the whole from ours."""
    x = torch.tensor([[-1.0], [0.0], [-2.0]], requires_grad=True)
    index = torch.zeros(3, dtype=torch.long)
    (grad,) = torch.autograd.grad(scatter(x, index, 0, dim_size=1, reduce="max"), x, torch.ones(1, 1))
    assert grad.flatten().tolist() == [0.0, 0.5, 0.0]
    graph = ug.GraphTensor.from_edge_index(torch.stack([torch.arange(3), index]), (3, 1))
    (ours,) = torch.autograd.grad(ug.compute(graph, "copy_u_max", x), x, torch.ones(1, 1))
    assert ours.flatten().tolist() == [0.0, 1.0, 0.0]
    gen = torch.Generator().manual_seed(0)
    generated = ops._normal_without_zeros((4096, 512), gen, torch.device("cpu"))
    assert generated.shape == (4096, 512) and (generated != 0).all()


def test_floor_bytes():
    N, E, F = 10, 40, 8
    index = (N + 1 + E) * 4
    assert ops.floor_bytes(ops.OPS["copy_u_sum"], "fwd", N, E, F) == 2 * N * F * 4 + index
    # backward: read the output gradient and the graph, write the input gradient
    assert ops.floor_bytes(ops.OPS["copy_u_sum"], "fwd+bwd", N, E, F) == 4 * N * F * 4 + 2 * index
    assert ops.floor_bytes(ops.OPS["u_dot_v"], "fwd", N, E, F) == (2 * N * F + E) * 4 + 2 * E * 4


def test_sweep_is_seeded_and_anchored():
    first = ops.sweep_configs("copy_u_sum", 128, 4)
    assert first == ops.sweep_configs("copy_u_sum", 128, 4)
    assert [p.strategy for p in first] == ["vertex"] * 4 + ["edge"] * 4 + ["group"] * 4
    assert first[0].block_v == 4 and first[0].block_e == 16 and first[0].block_f == 64
    assert {p.strategy for p in ops.sweep_configs("u_add_v", 32, 2)} == {"vertex", "edge", "group"}


def test_max_rel_err():
    want = torch.tensor([1.0, -2.0, 4.0])
    assert timing.max_rel_err([want + 0.04], [want]) == pytest.approx(0.01)
    assert timing.max_rel_err([torch.tensor([1.0, float("nan"), 4.0])], [want]) == float("inf")
