"""Probe 74: host time of our operator path and of small-graph training steps, one code tree per
process (the custom ops register once per process); ``gpu_ab74.py`` alternates two trees.

A. host us per call (GPU idle between loops), COLLAB mini-batch graph, F = 64: ``copy_u_sum``
   forward without and with an autograd node, forward + backward, and ``u_mul_e_sum`` with a
   static edge weight (read in CSR order from its second call on).
B. 2-layer training steps (train_e2e's models, hidden 64) on fresh COLLAB mini-batches and on one
   batch every step, ms per step.
C. one training step of GATConv and GCNConv on a uniform graph of 2e5 nodes, 4e6 edges, F = 128,
   decisions by the cost model alone (``PYG_UGRAPHER_MEASURE=0``): step ms (CUDA events) and host
   ms to issue a step.

    python3 gpu_probe74.py TREE LABEL OUT.csv
"""
import os
import statistics
import sys
import time

os.environ["PYG_UGRAPHER_MEASURE"] = "0"
tree, label, out_csv = sys.argv[1:4]
sys.path.insert(0, os.path.abspath(tree))
sys.path.insert(1, os.getcwd())

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher import datasets  # noqa: E402

assert os.path.dirname(ug.__file__).startswith(os.path.abspath(tree)), ug.__file__
dev = torch.device("cuda")
rows = []


def record(part, name, value):
    rows.append({"tree": label, "part": part, "name": name, "value": value})
    print(f"{label:4s} {part} {name:50s} {value:9.3f}", flush=True)


def host_us(fn, reps=1500):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn()
        times.append((time.perf_counter() - t) / (reps // 5) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
b0 = batches[0]
n0 = b0.node_ids.numel()
graph = ug.GraphTensor(b0.edge_index[0], b0.edge_index[1], n0, n0)
x = torch.randn(n0, 64, device=dev)
xg = x.clone().requires_grad_()
g = torch.randn(n0, 64, device=dev)
w = torch.rand(graph.num_edges, device=dev)
record("A", "copy_u_sum forward", host_us(lambda: ug.compute(graph, "copy_u_sum", x)))
record("A", "copy_u_sum forward, autograd node", host_us(lambda: ug.compute(graph, "copy_u_sum", xg)))
record("A", "copy_u_sum forward + backward", host_us(lambda: ug.compute(graph, "copy_u_sum", xg).backward(g), 600))
record("A", "u_mul_e_sum forward, static weight", host_us(lambda: ug.compute(graph, "u_mul_e_sum", x, w)))

fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]
for model_name in ("gcn", "sage", "gin", "gat"):
    torch.manual_seed(0)
    m = te.build_model(model_name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    items = fresh(batches)
    for b in items[:5]:
        step(b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in items[5:]:
        step(b)
    torch.cuda.synchronize()
    record("B", f"{model_name} new graph every step, ms", (time.perf_counter() - t) / (len(items) - 5) * 1e3)
    b = items[0]
    for _ in range(5):
        step(b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(40):
        step(b)
    torch.cuda.synchronize()
    record("B", f"{model_name} same graph every step, ms", (time.perf_counter() - t) / 40 * 1e3)

edge_index = datasets.uniform_graph(200_000, 4_000_000, seed=0, device=dev)
xs, target = torch.randn(200_000, 128, device=dev), torch.randn(200_000, 128, device=dev)
for name, layer in (("GATConv", ugnn.GATConv(128, 32, heads=4)), ("GCNConv", ugnn.GCNConv(128, 128))):
    layer = layer.to(dev)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)

    def big_step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(layer(xs, edge_index), target).backward()
        opt.step()
    for _ in range(5):
        big_step()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        big_step()
        big_step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    record("C", f"{name} 4e6 edges step ms", statistics.median(times))
    host = []
    for _ in range(15):
        torch.cuda.synchronize()
        t = time.perf_counter()
        big_step()
        host.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    record("C", f"{name} 4e6 edges host ms to issue a step", statistics.median(host))
pd.DataFrame(rows).to_csv(out_csv, mode="a", header=not os.path.exists(out_csv), index=False)
