"""Probe 54: eager training steps of the five layers, for one working tree, on the suite's graphs
(4e6 edges, 128 features, Adam, MSE): step time (CUDA events, back to back, median of 30 pairs)
and host time to issue a step. Run once per tree, alternating, on one machine: A/B of code.
``--no-flush`` times measured decisions without clearing the L2 cache first (as before probe 53).

    python3 gpu_probe54.py <repo> <label> OUT.csv [--no-flush]
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from autotune import selection
from pyg_ugrapher import datasets

if "--no-flush" in sys.argv:
    def _cuda_ms(run, repeats):
        run()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            torch.cuda._sleep(selection.BUSY_CYCLES)
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)
    selection._cuda_ms = _cuda_ms

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
LAYERS = {
    "GCNConv": lambda: ugnn.GCNConv(W, W),
    "GATConv": lambda: ugnn.GATConv(W, W // 4, heads=4),
    "SAGEConv": lambda: ugnn.SAGEConv(W, W, aggr="mean"),
    "GraphConv": lambda: ugnn.GraphConv(W, W, aggr="max"),
    "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))),
}
rows = []
for kind in ("uniform", "power_law"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    for name, make in LAYERS.items():
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            out = model(x, ei)
            F.mse_loss(out, target).backward()
            opt.step()
            return out.detach()
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
            for _ in range(5):
                step()
            host.append((time.perf_counter() - t) / 5 * 1e3)
            torch.cuda.synchronize()
        rows.append(dict(tree=sys.argv[2], graph=kind, layer=name, step_ms=statistics.median(times),
                         host_ms=statistics.median(host)))
        print(rows[-1], flush=True)
        del model, opt
out = Path(sys.argv[3])
pd.DataFrame(rows).to_csv(out, mode="a", header=not out.exists(), index=False)
