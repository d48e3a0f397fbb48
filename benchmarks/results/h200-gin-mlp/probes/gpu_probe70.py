"""Probe 70: GINConv's eager training step (MLP 128-128-128) on the uniform and power-law graphs
of 2e5 nodes and 4e6 edges: the step time, every measured decision (candidates timed, choice),
the chosen aggregation's time against its whole schedule space (cold L2, the decisions' own
timer), and the step's kernels. Run it twice, in two processes, to see whether decisions vary.

    python3 gpu_probe70.py <repo> OUT.csv <run label>
"""
import os
import statistics
import sys

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import pyg_ugrapher.nn as ugnn
import triton_kernels
from autotune import selection
from pyg_ugrapher import datasets, ops
from triton_kernels.space import space

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
decisions, calls = [], []
original_fastest, original_decision = selection.fastest, ops._decision


def logged_fastest(candidates, run, repeats=3, timer=None, **kwargs):
    current, times = [None], {}

    def named_run(schedule):
        current[0] = schedule
        return run(schedule)

    def timed(call, reps):
        ms = (timer or selection._cuda_ms)(call, reps)
        times[current[0]] = ms
        return ms
    choice = original_fastest(candidates, named_run, repeats, timed, **kwargs)
    decisions.append((list(candidates), times, choice))
    return choice


def logged_decision(arrays, operands, op, schedule, pair=None):
    result = original_decision(arrays, operands, op, schedule, pair)
    if pair is None and "sum" in op and not calls:
        calls.append((arrays, list(operands), op, result))
    return result


selection.fastest = logged_fastest
ops._decision = logged_decision
rows = []
for kind in ("uniform", "power_law"):
    decisions.clear()
    calls.clear()
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, W, generator=gen, device=dev)
    target = torch.randn(N, W, generator=gen, device=dev)
    torch.manual_seed(0)
    model = ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    print(f"=== {sys.argv[3]} {kind}: step {statistics.median(times):.3f} ms; {len(decisions)} measured decisions",
          flush=True)
    for candidates, timed_ms, choice in decisions:
        print("  chose", choice)
        for schedule, ms in sorted(timed_ms.items(), key=lambda kv: kv[1])[:8]:
            print(f"    {ms:7.3f} ms  {schedule}{'  (shortlist)' if schedule in candidates else ''}")
    arrays, operands, op, (info, layout, chosen, dtype, _) = calls[0]
    print(f"--- {kind}: {op} over its space (cold L2, median of 7)")
    for schedule in [chosen] + [s for s in space(info, layout.message_width) if s != chosen]:
        def run():
            return triton_kernels.run(info, layout, arrays, operands, schedule, dtype)
        try:
            ms = selection._cuda_ms(run, 7)
        except Exception as exc:  # noqa: BLE001
            ms = float("nan")
            print("   failed", schedule, repr(exc)[:120])
        rows.append(dict(run=sys.argv[3], graph=kind, op=op, schedule=str(schedule), chosen=schedule == chosen, ms=ms,
                         step_ms=statistics.median(times)))
    table = pd.DataFrame([r for r in rows if r["graph"] == kind]).sort_values("ms")
    print(table[["schedule", "chosen", "ms"]].head(8).to_string(index=False))
    print(table[table.chosen][["schedule", "chosen", "ms"]].to_string(index=False), flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = sorted(((ev.self_device_time_total / 5, ev.count // 5, ev.key) for ev in prof.key_averages()
                      if ev.device_type == torch.autograd.DeviceType.CUDA and ev.self_device_time_total > 0),
                     reverse=True)
    print(f"--- {kind}: GPU kernels, {sum(k[0] for k in kernels) / 1e3:.3f} ms busy per step")
    for us, count, key in kernels[:12]:
        print(f"    {us / 1e3:.3f} ms  x{count}   {key[:110]}")
    del model, opt
out = sys.argv[2]
pd.DataFrame(rows).to_csv(out, mode="a", header=not os.path.exists(out), index=False)
