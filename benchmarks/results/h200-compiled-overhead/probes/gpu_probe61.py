"""Probe 61: A/B of the eager training steps of SAGEConv (mean) and GraphConv (max) between two
code trees (run once per tree, alternating, on one machine). Uniform and power-law graphs of 4e6
edges, 128 features.

    python3 gpu_probe61.py <tree> <label> OUT.csv   (appends one row per graph and layer)
"""
import os
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
LAYERS = {"SAGEConv": lambda: ugnn.SAGEConv(W, W, aggr="mean"), "GraphConv": lambda: ugnn.GraphConv(W, W, aggr="max")}
rows = []
for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    for name, make in LAYERS.items():
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, ei), target).backward()
            opt.step()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); step(); step(); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 2)
        host = []
        for _ in range(10):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(4):
                step()
            host.append((time.perf_counter() - t) / 4 * 1e3)
        torch.cuda.synchronize()
        rows.append(dict(tree=sys.argv[2], graph=kind, layer=name, step_ms=statistics.median(times),
                         host_ms=statistics.median(host)))
        print(rows[-1], flush=True)
out = sys.argv[3]
pd.DataFrame(rows).to_csv(out, mode="a", header=not os.path.exists(out), index=False)
