"""Probe 88: host and step time of SAGE's and GIN's eager layer step, the code of 47ca234 (the
session's start) against the final code, in alternating processes on one machine: did the
decision cache's refactor (``ops.cached_decision``) change their host time?

    python3 gpu_probe88.py TREE LABEL      # one process: TREE is the repository root to import
    python3 gpu_probe88.py --drive OLD NEW OUT.txt   # alternates the two, twice
"""
import os
import statistics
import subprocess
import sys
import time

if sys.argv[1] == "--drive":
    old, new, path = sys.argv[2:5]
    with open(path, "w") as out:
        for rnd in range(2):
            for tree, label in ((new, "final"), (old, "47ca234")):
                result = subprocess.run([sys.executable, __file__, tree, label], capture_output=True, text=True)
                print(result.stdout + result.stderr[-2000:], file=out, flush=True)
                print(result.stdout, flush=True)
    sys.exit(0)

tree, label = sys.argv[1:3]
sys.path.insert(0, os.path.abspath(tree))
import torch  # noqa: E402
from torch import nn  # noqa: E402

import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402

dev = torch.device("cuda")
for spec in layer_graphs():
    loaded = spec.load(dev)
    x = torch.randn(loaded.num_nodes, 128, device=dev)
    for name, make in (("SAGEConv", lambda: ugnn.SAGEConv(128, 128, aggr="mean")),
                       ("GINConv", lambda: ugnn.GINConv(nn.Sequential(nn.Linear(128, 128), nn.ReLU(),
                                                                      nn.Linear(128, 128))))):
        torch.manual_seed(0)
        conv = make().to(dev)
        opt = torch.optim.Adam(conv.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            conv(x, loaded.edge_index).square().mean().backward()
            opt.step()

        for _ in range(10):
            step()
        host, total = [], []
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                step()
            host.append((time.perf_counter() - t) / 30 * 1e3)
            torch.cuda.synchronize()
            total.append((time.perf_counter() - t) / 30 * 1e3)
        print(f"{label:8s} {spec.name:14s} {name:9s} host {statistics.median(host):.3f} step "
              f"{statistics.median(total):.3f}  [{', '.join(f'{t:.2f}' for t in total)}]", flush=True)
