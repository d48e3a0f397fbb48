"""Probe 67: GAT's measured schedule decisions in an eager training step (every candidate the
decisions timed, and what they chose), then the backward gather with edge output (the step's
largest kernel) over its whole adapted schedule space, timed in isolation with the decisions' own
cold-L2 timer, and the step's kernels (torch.profiler). Uniform and power-law graphs of 2e5 nodes
and 4e6 edges, 128 features, 4 heads.

    python3 gpu_probe67.py <repo> OUT.csv
"""
import sys

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import pyg_ugrapher.nn as ugnn
import triton_kernels
from autotune import selection
from pyg_ugrapher import datasets, ops
from triton_kernels.space import pair_schedule, space

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
decisions, pairs = [], []
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
    if pair is not None and not pairs:
        pairs.append((arrays, list(operands), op, pair, result))
    return result


selection.fastest = logged_fastest
ops._decision = logged_decision
rows = []
for kind in ("uniform", "power_law"):
    decisions.clear()
    pairs.clear()
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"=== {kind}: {len(decisions)} measured decisions", flush=True)
    for candidates, times, choice in decisions:
        print("  chose", choice)
        for schedule, ms in sorted(times.items(), key=lambda kv: kv[1])[:8]:
            print(f"    {ms:7.3f} ms  {schedule}{'  (shortlist)' if schedule in candidates else ''}")
    arrays, operands, op, pair, (info, layout, chosen, dtype, _) = pairs[0]
    message = ops._op(pair[0])
    message_layout = ops._layout_of(*pair)
    adapted = dict.fromkeys(pair_schedule(s, layout.message_width, message_layout.reduce_size)
                            for s in space(info, layout.message_width))
    adapted = [chosen] + [s for s in adapted if s != chosen]
    for schedule in adapted:
        def run():
            return triton_kernels.run_with_edge_output(info, layout, message, message_layout, arrays, operands,
                                                       pair[1], schedule, (dtype, dtype))
        try:
            if run() is None:
                continue  # a schedule that cannot write the edge output in the gather's pass
            ms = selection._cuda_ms(run, 7)
        except Exception as exc:  # noqa: BLE001
            ms = float("nan")
            print("   failed", schedule, repr(exc)[:120])
        rows.append(dict(graph=kind, schedule=str(schedule), chosen=schedule == chosen, ms=ms))
    table = pd.DataFrame([r for r in rows if r["graph"] == kind]).sort_values("ms")
    print(f"--- {kind}: pair over {len(table)} adapted schedules (cold L2, median of 7)")
    print(table.head(10).to_string(index=False))
    print(table[table.chosen].to_string(index=False), flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels = sorted(((ev.self_device_time_total / 5, ev.count // 5, ev.key) for ev in prof.key_averages()
                      if ev.device_type == torch.autograd.DeviceType.CUDA and ev.self_device_time_total > 0),
                     reverse=True)
    print(f"--- {kind}: GPU kernels, {sum(k[0] for k in kernels) / 1e3:.3f} ms busy per step")
    for us, count, key in kernels[:14]:
        print(f"    {us / 1e3:.3f} ms  x{count}   {key[:110]}")
    del model, opt
pd.DataFrame(rows).to_csv(sys.argv[2], index=False)
