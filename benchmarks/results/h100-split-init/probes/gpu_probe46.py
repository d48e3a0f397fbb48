"""Where a layer's training step spends host time: SAGE (mean) and GAT (4 x 32) on the 4e6-edge
uniform and power-law graphs of the layer suite. Per case: step time (CUDA events, back to back),
host time to issue a step, GPU kernel time per step (profiler), device syncs inside a step
(torch.cuda.set_sync_debug_mode), and the top host functions (cProfile).

    python3 gpu_probe46.py <repo> [OUT]
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback
import warnings

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
LAYERS = {"SAGEConv": lambda: ugnn.SAGEConv(W, W, aggr="mean"),
          "GATConv": lambda: ugnn.GATConv(W, W // 4, heads=4)}
only = os.environ.get("LAYERS")


def case(layer, kind):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    model = LAYERS[layer]().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()

    for _ in range(8):
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
    print(f"\n=== {layer} {kind}: step {statistics.median(times):.3f} ms (back to back), "
          f"host issue {statistics.median(host):.3f} ms")
    syncs = []
    old = warnings.showwarning
    warnings.showwarning = lambda msg, *a, **k: syncs.append((str(msg), "".join(traceback.format_stack(limit=14)[:-2])))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda msg, *a, **k: syncs.append((str(msg), "".join(traceback.format_stack(limit=14)[:-2])))
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    torch.cuda.synchronize()
    print(f"syncs in one step: {len(syncs)}")
    for msg, stack in syncs[:6]:
        print("--- sync:", msg[:200]); print(stack)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in kernels) / 1e3 / 5
    print(f"GPU work per step {gpu_ms:.3f} ms in {len(kernels) / 5:.0f} kernels/copies")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue()[:9000])


for layer in LAYERS:
    if only and layer not in only.split(","):
        continue
    for kind in ("uniform", "power_law"):
        case(layer, kind)
