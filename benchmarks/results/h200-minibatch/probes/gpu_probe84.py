"""Probe 84: GAT's attention pass with node operands read through one view per pass (now) against
a new view per operator for every operand (as before), switched in one process.

``attention._operand`` is patched to return a new view for every operand, which is the view count
of 50fe5f8 (one more view per score operand and pass than before, for the shared column). A. The
issue's GAT layer step (GATConv(128, 32, heads=4), 2e5 vertices, 4e6 uniform edges, forward +
backward + Adam): host ms per step (no sync in the loop) and ms per step, 5 alternating rounds.
B. 2-layer GAT mini-batch steps (train_e2e's model, hidden 64) on fresh COLLAB batches, 3 rounds.

    python3 gpu_probe84.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher import attention  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


shared = attention._operand
VARIANTS = {"view per pass (now)": shared, "view per operator (before)": lambda column, kind: column.view_as(column)}
dev = torch.device("cuda")

# -- A ------------------------------------------------------------------------------------------
torch.manual_seed(0)
num_nodes, num_edges = 200_000, 4_000_000
edge_index = torch.randint(0, num_nodes, (2, num_edges), device=dev)
x = torch.randn(num_nodes, 128, device=dev)
conv = ugnn.GATConv(128, 32, heads=4).to(dev)
opt = torch.optim.Adam(conv.parameters(), lr=1e-3)


def layer_step():
    opt.zero_grad()
    conv(x, edge_index).square().mean().backward()
    opt.step()


for _ in range(10):
    layer_step()
torch.cuda.synchronize()
host = {k: [] for k in VARIANTS}
step = {k: [] for k in VARIANTS}
for rnd in range(5):
    for label, operand in VARIANTS.items():
        attention._operand = operand
        for _ in range(5):
            layer_step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(30):
            layer_step()
        host[label].append((time.perf_counter() - t) / 30 * 1e3)
        torch.cuda.synchronize()
        step[label].append((time.perf_counter() - t) / 30 * 1e3)
attention._operand = shared
say("== A. GAT layer step, 4e6 uniform edges, ms: host (loop without sync) / step, median [rounds]")
for label in VARIANTS:
    say(f"  {label:28s} host {statistics.median(host[label]):.3f} [{', '.join(f'{t:.2f}' for t in host[label])}]"
        f"  step {statistics.median(step[label]):.3f} [{', '.join(f'{t:.2f}' for t in step[label])}]")

# -- B ------------------------------------------------------------------------------------------
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
torch.manual_seed(0)
model = te.build_model("gat", ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
opt_b = torch.optim.Adam(model.parameters(), lr=1e-3)


def batch_step(b):
    opt_b.zero_grad()
    o = model(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
    F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
    opt_b.step()


times = {k: [] for k in VARIANTS}
for rnd in range(3):
    for label, operand in VARIANTS.items():
        attention._operand = operand
        items = [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches]
        for b in items[:5]:
            batch_step(b)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in items[5:]:
            batch_step(b)
        torch.cuda.synchronize()
        times[label].append((time.perf_counter() - t) / 40 * 1e3)
attention._operand = shared
say("\n== B. 2-layer GAT steps on fresh COLLAB batches, ms per step, median [rounds]")
for label, v in times.items():
    say(f"  {label:28s} {statistics.median(v):.3f}  [{', '.join(f'{t:.2f}' for t in v)}]")
say("done")
