"""Probe 49: GAT's training step with launch plans for row-strided operands, A/B in one process.

GAT's attention halves are unbound from one ``[N, 2, H]`` product: packed rows, not contiguous,
so until this change its three forward and two score-gradient operators went through
``triton_kernels.run`` instead of their decision's launch plan. "old" restores the contiguity
test where ``run_graph_op`` chooses (same decisions, same kernels: only the launch path differs).
Per graph (4e6 edges, 128 -> 4 x 32, Adam, MSE, as the layer suite), 3 alternating rounds: step
time (CUDA events, back to back) and host time to issue a step.

    python3 gpu_probe49.py <repo> OUT
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
import triton_kernels
from pyg_ugrapher import datasets

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
VARIANTS = {"new": triton_kernels.packed_rows, "old": lambda t: t.is_contiguous()}


def measure(step):
    for _ in range(3):
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
    return statistics.median(times), statistics.median(host)


rows = []
for kind in ("uniform", "power_law"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()

    for _ in range(8):
        step()
    for round_ in range(3):
        for name, check in VARIANTS.items():
            triton_kernels.packed_rows = check
            step_ms, host_ms = measure(step)
            rows.append({"graph": kind, "round": round_, "variant": name, "step_ms": step_ms, "host_ms": host_ms})
            print(rows[-1], flush=True)
    triton_kernels.packed_rows = VARIANTS["new"]
frame = pd.DataFrame(rows)
frame.to_csv(out / "probe49.csv", index=False)
print(frame.groupby(["graph", "variant"])[["step_ms", "host_ms"]].median())
