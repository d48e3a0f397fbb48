"""Probe 68: GAT's eager training step on the power-law graph (2e5 nodes, 4e6 edges, 128 features,
4 heads) in a fresh process: its measured decisions (as probe 67 logs them), step and host time,
and the step's kernels. Run twice, in two processes, to see how the decisions and the step vary.

    python3 gpu_probe68.py <repo>
"""
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import pyg_ugrapher.nn as ugnn
from autotune import selection
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
decisions = []
original_fastest = selection.fastest


def logged_fastest(candidates, run, repeats=3, timer=None, **kwargs):
    current, times = [None], {}

    def named_run(schedule):
        current[0] = schedule
        return run(schedule)

    def timed(call, reps):
        ms = (timer or selection._cuda_ms)(call, reps)
        times.setdefault(current[0], []).append(round(ms, 3))
        return ms
    choice = original_fastest(candidates, named_run, repeats, timed, **kwargs)
    decisions.append((times, choice))
    return choice


selection.fastest = logged_fastest
ei = datasets.power_law_graph(N, E, seed=0, device=dev)
torch.manual_seed(0)
x = torch.randn(N, W, device=dev)
target = torch.randn(N, W, device=dev)
model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def step():
    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(x, ei), target).backward()
    opt.step()


for _ in range(5):
    step()
torch.cuda.synchronize()
for times, choice in decisions:
    print("chose", choice, times[choice])
    for schedule, ms in sorted(times.items(), key=lambda kv: min(kv[1]))[:5]:
        print("   ", ms, schedule)
for _ in range(3):
    steps = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        steps.append(s.elapsed_time(e) / 2)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        step()
    host = (time.perf_counter() - t) / 10 * 1e3
    torch.cuda.synchronize()
    print(f"step {statistics.median(steps):.3f} ms, host {host:.3f} ms", flush=True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
kernels = sorted(((ev.self_device_time_total / 5, ev.count // 5, ev.key) for ev in prof.key_averages()
                  if ev.device_type == torch.autograd.DeviceType.CUDA and ev.self_device_time_total > 0), reverse=True)
print(f"GPU kernels, {sum(k[0] for k in kernels) / 1e3:.3f} ms busy per step")
for us, count, key in kernels[:8]:
    print(f"    {us / 1e3:.3f} ms  x{count}   {key[:100]}")
