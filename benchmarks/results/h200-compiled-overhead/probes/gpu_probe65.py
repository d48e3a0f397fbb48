"""Probe 65: A/B of GINConv's training step (MLP 128-128-128) between two code trees: compiled with
the default epsilon, and eager with a fixed epsilon of 0.3. Uniform and power-law graphs of 4e6
edges, 128 features.

    python3 gpu_probe65.py <tree> <label> OUT.csv   (appends one row per graph and case)
"""
import os
import statistics
import sys

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
rows = []
for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    for case, eps, compiled in (("compiled eps=0", 0.0, True), ("eager eps=0.3", 0.3, False)):
        torch.manual_seed(0)
        model = ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W)), eps=eps).to(dev)
        runner = torch.compile(model, dynamic=False) if compiled else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(runner(x, ei), target).backward()
            opt.step()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); step(); step(); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 2)
        rows.append(dict(tree=sys.argv[2], graph=kind, case=case, step_ms=statistics.median(times)))
        print(rows[-1], flush=True)
        torch._dynamo.reset()
out = sys.argv[3]
pd.DataFrame(rows).to_csv(out, mode="a", header=not os.path.exists(out), index=False)
