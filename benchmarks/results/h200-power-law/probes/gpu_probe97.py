"""Probe 97: probe 96's CPU profile put 226-262 us of host time per SAGE and GIN step into one
``aten::index_fill_`` (the neighbour-group output's split rows set to the identity), and
150-170 us each into GAT's two ``aten::fill_`` and two ``aten::cat``, ops that launch one small
kernel. Is that the op, or waiting?

A. Host us per call of small ops (empty, zeros, empty + index_fill_ of the power-law graph's split
   rows, cat of two attention vectors), in a tight loop with the GPU idle, and with a 2e5 x 128
   x 128 matmul issued before each call (the GPU busy and the launch queue holding work).
B. SAGE, GIN and GAT steps on the power-law graph, the output allocation as it is against
   ``torch.zeros`` for every atomic output (no index_fill_), 5 alternating rounds of 30 steps:
   host and step ms.

    python3 gpu_probe97.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import triton_kernels.dispatch as dispatch  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher.graph import GraphTensor, split_rows  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
spec = layer_graphs()[1]
loaded = spec.load(dev)
edge_index = loaded.edge_index
n = loaded.num_nodes
csr = GraphTensor(edge_index[0], edge_index[1], n, n).csr(dev)
idx = split_rows(csr, 128)
say(f"split rows at group size 128: {idx.numel()} of {n}")
a = torch.randn(n, 128, device=dev)
w = torch.randn(128, 128, device=dev)
vec = [torch.randn(1, 4, 32, device=dev) for _ in range(2)]
small = torch.empty(4, 32, device=dev)
OPS = {"empty": lambda: torch.empty(n, 128, device=dev),
       "zeros": lambda: torch.zeros(n, 128, device=dev),
       "empty+index_fill_": lambda: torch.empty(n, 128, device=dev).index_fill_(0, idx, 0.0),
       "cat": lambda: torch.cat(vec),
       "small fill_": lambda: small.fill_(1.0)}
for busy in (False, True):
    for name, fn in OPS.items():
        times = []
        for _ in range(300):
            if busy:
                a @ w
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        say(f"A {'busy' if busy else 'idle'} {name}: {statistics.median(times[50:]):.1f} us "
            f"(p90 {sorted(times[50:])[225]:.1f})")

LAYERS = {"SAGEConv": lambda: ugnn.SAGEConv(128, 128, aggr="mean"),
          "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))),
          "GATConv": lambda: ugnn.GATConv(128, 32, heads=4)}
x = torch.randn(n, 128, device=dev)
target = torch.randn(n, 128, device=dev)
allocate = dispatch._allocate


def zeros_allocate(op, graph, template, info, rows, width, out_dtype):
    if template.ATOMIC:
        return torch.zeros((rows, width), dtype=dispatch._atomic_dtype(out_dtype), device=graph.csr.device)
    return allocate(op, graph, template, info, rows, width, out_dtype)


for name, make in LAYERS.items():
    torch.manual_seed(0)
    model = make().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, edge_index), target).backward()
        opt.step()

    for _ in range(10):
        step()
    results = {"index_fill_": ([], []), "zeros": ([], [])}
    for _ in range(5):
        for variant, patch in (("index_fill_", allocate), ("zeros", zeros_allocate)):
            dispatch._allocate = patch
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                step()
            results[variant][0].append((time.perf_counter() - t) / 30 * 1e3)
            torch.cuda.synchronize()
            results[variant][1].append((time.perf_counter() - t) / 30 * 1e3)
    dispatch._allocate = allocate
    for variant, (host, total) in results.items():
        say(f"B {name} {variant}: host {statistics.median(host):.3f} [{min(host):.2f}-{max(host):.2f}] "
            f"step {statistics.median(total):.3f} [{min(total):.2f}-{max(total):.2f}] ms")
say("done")
