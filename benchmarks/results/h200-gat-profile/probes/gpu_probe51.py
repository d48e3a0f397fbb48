"""Probe 51: where GAT's eager training step spends its time, and where GIN's eager step peaks.

Per graph (4e6 edges, 128 -> 4 x 32, Adam, MSE, as the layer suite):
1. step time (CUDA events, back to back) and host time to issue a step, ours eager and PyG compiled;
2. GPU kernels per step (torch.profiler, 5 steps): time per kernel name, and the total busy time;
3. host time per Python function (cProfile, 20 steps): where the host's step goes.
Then GIN's eager step, ours, with the step's output kept alive as the suite's step keeps it: the
peak memory within each ATen call (peak stats reset before each call).

    python3 gpu_probe51.py <repo> OUT
"""
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_geometric.nn as pygnn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
MIB = 2 ** 20


def timings(step):
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


def kernels(name, step, steps=5):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "self_device_time_total", None)
        if dev_us is None:
            dev_us = ev.self_cuda_time_total
        if dev_us > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((dev_us / steps, ev.count // steps, ev.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n--- {name}: GPU kernels, {total / 1e3:.3f} ms busy per step")
    for us, count, key in rows[:30]:
        print(f"  {us / 1e3:7.3f} ms  x{count:<3d} {key[:150]}")
    prof.export_chrome_trace(str(out / f"trace_{name}.json"))


def host_profile(name, step, steps=20):
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        step()
    pr.disable()
    torch.cuda.synchronize()
    for order in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(order).print_stats(45)
        print(f"\n--- {name}: cProfile of {steps} steps by {order}")
        print(s.getvalue()[:14000])


def gat_step(model_ns, ei, x, target, compiled):
    torch.manual_seed(0)
    model = model_ns.GATConv(W, W // 4, heads=4).to(dev)
    runner = torch.compile(model, dynamic=False) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        o = runner(x, ei)
        F.mse_loss(o, target).backward()
        opt.step()
        return o.detach()
    return step


for kind in ("uniform", "power_law"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    ours = gat_step(ugnn, ei, x, target, False)
    pyg = gat_step(pygnn, ei, x, target, True)
    for name, step in (("ours", ours), ("pyg_compiled", pyg)):
        t, h = timings(step)
        print(f"\n=== {kind} GAT {name}: step {t:.3f} ms, host {h:.3f} ms")
        kernels(f"{kind}_{name}", step)
    host_profile(f"{kind}_ours", ours)
    del ours, pyg
    torch._dynamo.reset()
    torch.cuda.empty_cache()


class PeakPerCall(TorchDispatchMode):
    def __init__(self, base):
        super().__init__()
        self.base, self.rows = base, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.reset_peak_memory_stats()
        result = func(*args, **(kwargs or {}))
        outs = result if isinstance(result, (tuple, list)) else [result]
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        self.rows.append((torch.cuda.max_memory_allocated() / MIB - self.base,
                          torch.cuda.memory_allocated() / MIB - self.base, str(func), shapes))
        return result


ei = datasets.uniform_graph(N, E, seed=0, device=dev)
torch.manual_seed(0)
x = torch.randn(N, W, device=dev)
target = torch.randn(N, W, device=dev)
model = ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def gin_step():
    opt.zero_grad(set_to_none=True)
    o = model(x, ei)
    F.mse_loss(o, target).backward()
    opt.step()
    return o.detach()


for _ in range(3):
    gin_step()
torch.cuda.synchronize()
base = torch.cuda.memory_allocated() / MIB
torch.cuda.reset_peak_memory_stats()
r = gin_step()
torch.cuda.synchronize()
print(f"\n=== GIN ours eager: step peak {torch.cuda.max_memory_allocated() / MIB - base:.1f} MiB over {base:.1f}")
del r
base = torch.cuda.memory_allocated() / MIB
mode = PeakPerCall(base)
with mode:
    r = gin_step()
torch.cuda.synchronize()
print(f"{len(mode.rows)} calls; by peak within the call:")
for i, (peak, after, func, shapes) in enumerate(mode.rows):
    print(f"{'>>' if peak == max(x[0] for x in mode.rows) else '  '} {i:3d} peak {peak:8.1f} after {after:8.1f} {func} {shapes}")
