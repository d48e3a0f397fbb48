"""Probe 60: GPU kernels of one eager training step of SAGEConv (mean) and GINConv (MLP
128-128-128), ours and compiled PyG, uniform and power-law graphs (4e6 edges, 128 features).

    python3 gpu_probe60.py <repo>
"""
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_geometric.nn as pygnn
from torch.profiler import ProfilerActivity, profile

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
LAYERS = {
    "SAGEConv": lambda ns: ns.SAGEConv(W, W, aggr="mean"),
    "GINConv": lambda ns: ns.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))),
}


def kernels(label, step, steps=5):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = ev.self_device_time_total
        if us > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((us / steps, ev.count // steps, ev.key))
    rows.sort(reverse=True)
    print(f"\n--- {label}: step {statistics.median(times):.3f} ms, GPU busy {sum(r[0] for r in rows) / 1e3:.3f} ms")
    for us, count, key in rows[:14]:
        print(f"  {us / 1e3:7.3f} ms  x{count:<3d} {key[:120]}")


for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    for name, make in LAYERS.items():
        for label, ns, compiled in (("ours", ugnn, False), ("pyg_compiled", pygnn, True)):
            torch.manual_seed(0)
            model = make(ns).to(dev)
            runner = torch.compile(model, dynamic=False) if compiled else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(runner(x, ei), target).backward()
                opt.step()
            kernels(f"{kind} {name} {label}", step)
            torch._dynamo.reset()
