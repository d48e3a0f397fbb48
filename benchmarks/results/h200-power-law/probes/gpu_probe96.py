"""Probe 96: where a layer step's host time goes. Probe 95 found every eager step of ours bound by
host time on its machine (host time = step time, 1.5-4.3 ms against 1.2-2.7 ms of GPU time).

For GAT, SAGE and GIN on the power-law layer graph, ours and eager PyG: host time of each part of
a step (zero_grad, forward, loss, backward, optimizer step), timed without syncs (the host never
waits for the GPU there), median of 40 steps; then, for ours, torch.profiler's CPU ops of 10 steps
by self CPU time, and the launches per step.

    python3 gpu_probe96.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch_geometric.nn as pygnn
from torch import nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
LAYERS = {"GATConv": lambda ns: ns.GATConv(128, 32, heads=4),
          "SAGEConv": lambda ns: ns.SAGEConv(128, 128, aggr="mean"),
          "GINConv": lambda ns: ns.GINConv(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128)))}
spec = layer_graphs()[1]
loaded = spec.load(dev)
gen = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
target = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
edge_index = loaded.edge_index
PARTS = ("zero_grad", "forward", "loss", "backward", "step")
for name, make in LAYERS.items():
    for side, ns in (("ours", ugnn), ("pyg", pygnn)):
        torch.manual_seed(0)
        model = make(ns).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(times=None):
            marks = [time.perf_counter()]
            opt.zero_grad(set_to_none=True)
            marks.append(time.perf_counter())
            y = model(x, edge_index)
            marks.append(time.perf_counter())
            loss = F.mse_loss(y, target)
            marks.append(time.perf_counter())
            loss.backward()
            marks.append(time.perf_counter())
            opt.step()
            marks.append(time.perf_counter())
            if times is not None:
                for part, a, b in zip(PARTS, marks, marks[1:]):
                    times[part].append((b - a) * 1e6)

        for _ in range(10):
            step()
        torch.cuda.synchronize()
        times = collections.defaultdict(list)
        t = time.perf_counter()
        for _ in range(40):
            step(times)
        host = (time.perf_counter() - t) / 40 * 1e3
        torch.cuda.synchronize()
        total = (time.perf_counter() - t) / 40 * 1e3
        parts = ", ".join(f"{p} {statistics.median(times[p]):.0f}" for p in PARTS)
        say(f"== {name} {side}: host {host:.3f} ms, step {total:.3f} ms; us: {parts}")
        if side != "ours":
            continue
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        launches = sum(a.count for a in averages if "LaunchKernel" in a.key) / 10
        ops = sum(a.count for a in averages if a.key.startswith("aten::")) / 10
        say(f"  per step: {launches:.0f} kernel launches, {ops:.0f} aten ops (incl. nested)")
        for a in sorted(averages, key=lambda a: -a.self_cpu_time_total)[:22]:
            say(f"    {a.self_cpu_time_total / 10:8.1f} us self, {a.cpu_time_total / 10:8.1f} us total, "
                f"{a.count / 10:5.1f}x  {a.key[:80]}")
say("done")
