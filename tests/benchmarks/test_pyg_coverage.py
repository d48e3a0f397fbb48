"""The PyG coverage script on six classes: a swapped layer, routed ones that fuse (one with its own
``aggregate()``), a routed one whose ``message()`` runs staged and one that takes PyG's path."""

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a plain folder at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import pyg_coverage  # noqa: E402


def test_six_classes(tmp_path):
    classes = ["GCNConv", "LEConv", "EdgeConv", "FeaStConv", "FastRGCNConv", "EGConv"]
    pyg_coverage.main(["--classes", *classes, "--out", str(tmp_path)])
    frame = pd.read_csv(tmp_path / "pyg_coverage.csv").set_index("layer")
    assert tuple(frame.reset_index().columns) == pyg_coverage.COLUMNS
    assert list(frame.index) == classes
    assert list(frame.conversion) == ["swapped"] + ["routed"] * 5
    assert (frame.runs == "yes").all() and frame.forward_match.all() and frame.grads_match.all()
    assert (frame.forward_error <= pyg_coverage.TOLERANCE).all() and (frame.grads_error <= pyg_coverage.TOLERANCE).all()
    # EdgeConv's network (one Linear) is captured as products of the node rows; FeaStConv's softmax
    # over its heads runs staged, in PyTorch on per-edge values; EGConv's own aggregate() is one
    # scatter, fused; FastRGCNConv's message() indexes a weight per edge type, so with its own
    # aggregate() it takes PyG's path.
    assert list(frame.fully_fused) == [True, True, True, False, False, True]
    assert list(frame.staged) == [False, False, False, True, False, False]
    assert list(frame.edges_in_pytorch) == [False, False, False, True, False, False]
    assert frame.loc["LEConv", "ops"] == 1 and frame.loc["EdgeConv", "ops"] == 1 and frame.loc["EGConv", "ops"] == 1
    assert frame.loc["FastRGCNConv", "ops"] == 0 and frame.loc["FastRGCNConv", "fallbacks"] >= 1
    assert "softmax" in frame.loc["FeaStConv", "reason"] and "aggregate()" in frame.loc["FastRGCNConv", "reason"]
    table = (tmp_path / "pyg_coverage.md").read_text()
    assert "| 6 | 6 | 0 | 0 | 6 | 6 | 1 | 4 | 4 | 1 | 0 | 1 |" in table and "| EdgeConv | routed | yes |" in table


def test_every_class_has_arguments():
    assert set(pyg_coverage.message_passing_classes()) <= set(pyg_coverage.CASES)
