"""Probe 76: where a new graph's structure build goes (probe 75: 513 us per COLLAB batch graph
for ``GraphTensor(...).structure()``, 163 us of it the sort). The pieces again with Python's
garbage collector on and off, then torch.profiler tables (self CPU, and CUDA) of 30 builds, and
the final step comparison of probe 74 for this tree (GAT's looped graph now checks the index and
counts the stored loops in one sync).

    python3 gpu_probe76.py OUT.txt
"""
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher.nn import _graph as nn_graph, gcn_conv  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
flow = "source_to_target"


def per_graph(label, fn):
    runs = []
    for _ in range(5):
        items = [(b.edge_index.clone(), b.node_ids.numel()) for b in batches[10:40]]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for ei, n in items:
            fn(ei, n)
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) / len(items) * 1e6)
    say(f"  {label:64s} {statistics.median(runs):8.1f}  {[round(r) for r in runs]}")


PIECES = [
    ("index.clone() only (scale)", lambda ei, n: None),
    ("GraphTensor(src, dst) (validated: one sync)", lambda ei, n: ug.GraphTensor(ei[0], ei[1], n, n)),
    ("GraphTensor(validate=False)", lambda ei, n: ug.GraphTensor(ei[0], ei[1], n, n, validate=False)),
    ("GraphTensor(validate=False).structure()",
     lambda ei, n: ug.GraphTensor(ei[0], ei[1], n, n, validate=False).structure(dev)),
    ("GraphTensor + structure()", lambda ei, n: ug.GraphTensor(ei[0], ei[1], n, n).structure(dev)),
    ("cat + sort of the [2E] keys", lambda ei, n: torch.cat([ei[1], ei[0] + n]).sort(stable=True)),
    ("SAGE: layer_graph + structure", lambda ei, n: nn_graph.layer_graph(ei, flow, n, n).tensor.structure(dev)),
    ("GCN: padded_looped_graph + structure",
     lambda ei, n: nn_graph.padded_looped_graph(ei, flow, n).tensor.structure(dev)),
    ("GCN: fixed_size_unit_norm", lambda ei, n: gcn_conv.fixed_size_unit_norm(ei, flow, n, True, "sum", torch.float32)),
    ("GAT: looped_graph + structure", lambda ei, n: nn_graph.looped_graph(ei, flow, n, n, n).graph.tensor.structure(dev)),
]
for gc_on in (True, False):
    if not gc_on:
        gc.disable()
    say(f"\n== us per new COLLAB batch graph (host + GPU, synchronised), median of 5 passes over 30; gc {'on' if gc_on else 'off'}")
    for label, fn in PIECES:
        per_graph(label, fn)
gc.enable()
for label, fn in (PIECES[4], PIECES[7]):
    items = [(b.edge_index.clone(), b.node_ids.numel()) for b in batches[10:40]]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for ei, n in items:
            fn(ei, n)
        torch.cuda.synchronize()
    say(f"\n== torch.profiler, 30 x {label}")
    say(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50))
say("done")
