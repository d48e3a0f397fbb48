"""Probe 102: what a new mini-batch graph costs our steps, and how much of it is the endpoint check's
device sync.

``train_e2e``'s 2-layer models (hidden 64) on COLLAB batches (1024 seeds, 10 + 10 neighbours). In
one process, 5 alternating rounds of 40 steps: ours on a fresh batch every step; ours on one batch
every step; ours on fresh batches with ``graph.validate_endpoints`` skipping its device check (no
sync: not a valid configuration, only a measurement; GAT's looped graph still reads its count of
stored loops, one sync); PyG eager on fresh batches. ms per step.

    python3 gpu_probe102.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from pyg_ugrapher import graph as graph_module  # noqa: E402
from pyg_ugrapher.nn import _graph as layer_graphs  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


checked = graph_module.validate_endpoints


def unchecked(src, dst, num_src, num_dst, extra=()):
    return [int(t) for t in extra]


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731
for model_name in ("sage", "gin", "gcn", "gat"):
    torch.manual_seed(0)
    steps = {}
    for label, layers in (("ours", ugnn), ("pyg", pygnn)):
        m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)

        def step(b, m=m, opt=opt):
            opt.zero_grad()
            o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
            F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
            opt.step()
        steps[label] = step
    for b in fresh(batches[:5]):
        steps["ours"](b)
        steps["pyg"](b)
    results = collections.defaultdict(list)
    for _ in range(5):
        for label in ("ours new graphs", "ours one graph", "ours new, no sync", "PyG new graphs"):
            graph_module.validate_endpoints = layer_graphs.validate_endpoints = \
                unchecked if "no sync" in label else checked
            step = steps["pyg" if label.startswith("PyG") else "ours"]
            items = fresh(batches[:1]) * 40 if "one graph" in label else fresh(batches[5:45])
            torch.cuda.synchronize()
            t = time.perf_counter()
            for b in items:
                step(b)
            torch.cuda.synchronize()
            results[label].append((time.perf_counter() - t) / len(items) * 1e3)
    graph_module.validate_endpoints = layer_graphs.validate_endpoints = checked
    say(f"== {model_name}")
    for label, v in results.items():
        say(f"    {label:18s} ms/step {statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]")
say("done")
