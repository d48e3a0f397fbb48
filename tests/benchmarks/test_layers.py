"""The layer-level harness on toy graphs on the CPU (see test_ops.py for what these runs check).

``--ours-layers torch_geometric.nn`` puts PyG's layers on our side too, which checks the harness
whether or not ``pyg_ugrapher.nn`` is complete; our own layers get their own test.
"""

import importlib
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a plain folder at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import layers, run, timing  # noqa: E402
from benchmarks.rows import LAYER_COLUMNS  # noqa: E402

TINY = ["--tiny", "--device", "cpu", "--compile-backend", "aot_eager"]


def _run(out: Path, *extra: str):
    report = run.main(["--suite", "layers", "--out", str(out), *TINY, *extra])
    return pd.read_csv(out / "layers.csv"), report


def test_harness_with_pyg_on_both_sides(tmp_path):
    frame, report = _run(
        tmp_path, "--ours-layers", "torch_geometric.nn", "--graphs", "power_law-3.2k", "--layers", "GATConv", "GINConv"
    )
    assert tuple(frame.columns) == LAYER_COLUMNS
    assert set(frame.layer) == {"GATConv", "GINConv"} and set(frame.method) == set(layers.METHODS)
    assert (frame.status == "ok").all(), frame[frame.status != "ok"].note.tolist()
    assert (frame.time_ms > 0).all() and (frame.F == layers.TINY_WIDTH).all()
    # Every model starts from the PyG model's weights; the first step's output is compared.
    assert (frame.max_rel_err <= timing.TOLERANCE).all()
    compiled = frame[frame.method.str.endswith("compiled")]
    assert compiled.graph_breaks.notna().all() and (compiled.graphs >= 1).all()
    ours = frame[frame.method == "ours"]
    assert (ours.speedup_vs_pyg > 0).all() and (ours.speedup_vs_pyg_compiled > 0).all()
    assert "### Layers: one training step" in report and "| GATConv | power_law-3.2k |" in report
    assert (tmp_path / "layers.png").stat().st_size > 0


def test_missing_layers_are_rows(tmp_path):
    frame, report = _run(tmp_path, "--ours-layers", "torch", "--layers", "GINConv", "--graphs", "uniform-3.2k")
    ours = frame[frame.method.str.startswith("ours")]
    assert (ours.status == "unavailable").all() and ours.note.str.contains("torch.GINConv").all()
    assert (frame[frame.method.str.startswith("pyg")].status == "ok").all()
    assert "| GINConv | uniform-3.2k |" in report


def test_our_layers(tmp_path):
    namespace = importlib.import_module("pyg_ugrapher.nn")
    missing = [name for name in layers.LAYERS if name not in layers.ROUTED and not hasattr(namespace, name)]
    if missing:
        pytest.skip(
            f"pyg_ugrapher.nn lacks {', '.join(missing)}: the harness is tested with PyG's layers on both sides instead"
        )
    frame, _ = _run(tmp_path, "--graphs", "uniform-3.2k")
    ours = frame[frame.method.str.startswith("ours")]
    assert (ours.status == "ok").all(), ours[ours.status != "ok"].note.tolist()
    assert (ours.max_rel_err <= timing.TOLERANCE).all()
