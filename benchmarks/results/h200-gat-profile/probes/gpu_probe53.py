"""Probe 53: GAT's eager training step after head-split tiles, pair plans and folded attention
vectors: step and host time, the GPU kernels of one step; and ways to compute the backward's
per-node products ``t = <out_v, G_v>`` per head (``[N, H, C]`` -> ``[N, H]``).

    python3 gpu_probe53.py <repo> OUT
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F
import torch_geometric.nn as pygnn
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
N, E, W, H = 200_000, 4_000_000, 128, 4

o = torch.randn(N, H, W // H, device=dev)
g = torch.randn(N, H, W // H, device=dev)
ones = torch.ones(W // H, device=dev)
ways = {
    "mul_sum": lambda: (o * g).sum(dim=-1),
    "vecdot": lambda: torch.linalg.vecdot(o, g),
    "mul_mv": lambda: (o * g).view(-1, W // H).mv(ones),
    "bmm": lambda: torch.bmm(o.view(-1, 1, W // H), g.view(-1, W // H, 1)),
    "einsum": lambda: torch.einsum("nhc,nhc->nh", o, g),
    "mul_matmul_blocks": lambda: (o * g).view(N, W) @ torch.block_diag(*[ones[:, None]] * H),
}
want = (o.double() * g.double()).sum(-1)
for name, fn in ways.items():
    got = fn().reshape(N, H)
    err = ((got.double() - want).abs().max() / want.abs().max()).item()
    print(f"t as {name:18s} {do_bench(fn, warmup=25, rep=200, return_mode='median') * 1e3:7.1f} us  rel err {err:.1e}")


def timings(step):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(40):
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
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [(ev.self_device_time_total / steps, ev.count // steps, ev.key) for ev in prof.key_averages()
            if ev.device_type == torch.autograd.DeviceType.CUDA and ev.self_device_time_total > 0]
    rows.sort(reverse=True)
    print(f"\n--- {name}: GPU kernels, {sum(r[0] for r in rows if 'Optimizer' not in r[2]) / 1e3:.3f} ms busy per step")
    for us, count, key in rows[:16]:
        print(f"  {us / 1e3:7.3f} ms  x{count:<3d} {key[:120]}")


for kind in ("uniform", "power_law"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    for name, ns in (("ours", ugnn), ("pyg_compiled", pygnn)):
        torch.manual_seed(0)
        model = ns.GATConv(W, W // H, heads=H).to(dev)
        runner = torch.compile(model, dynamic=False) if name == "pyg_compiled" else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(runner(x, ei), target).backward()
            opt.step()
        t, h = timings(step)
        print(f"\n=== {kind} GAT {name}: step {t:.3f} ms, host {h:.3f} ms", flush=True)
        kernels(f"{kind} {name}", step)
    torch._dynamo.reset()
