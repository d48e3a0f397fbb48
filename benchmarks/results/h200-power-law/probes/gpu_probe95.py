"""Probe 95: what makes the layer steps slower on the power-law graph than on the uniform one
(the twenty-sixth session's suite: SAGE 2.02 against 1.29 ms, GIN 1.95 against 1.55, GAT 3.54
against 2.71), and why their host time there equals their step time (probe 94: SAGE 1.389 / 1.391
ms), which points at a device sync inside the step.

For GAT, SAGE, GIN and GraphConv (the suite's constructors) on the power-law graph first, then the
uniform one: every schedule decided (forward and backward), host and step time (3 rounds of 30
steps), each device sync of two warm steps with its call stack (CUDA sync debug mode), the
heaviest functions of 20 steps under cProfile, and the GPU time of each kernel.

    python3 gpu_probe95.py OUT.txt
"""
import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher import ops  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
decided = []
schedule_for = ops.schedule_for


def recording(op, layout, csr, *args, **kwargs):
    info = schedule_for(op, layout, csr, *args, **kwargs)
    decided.append((op.name, csr.num_rows, layout.message_width, info.serialize()))
    return info


ops.schedule_for = recording
import pyg_ugrapher.attention as attention  # noqa: E402
attention.schedule_for = recording
LAYERS = {"GATConv": lambda: ugnn.GATConv(128, 32, heads=4),
          "SAGEConv": lambda: ugnn.SAGEConv(128, 128, aggr="mean"),
          "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))),
          "GraphConv": lambda: ugnn.GraphConv(128, 128, aggr="max")}
stacks = collections.Counter()


def on_warning(message, category, filename, lineno, file=None, line=None):
    frames = [f for f in traceback.format_stack()[:-1] if "warnings.py" not in f]
    stacks["".join(frames[-7:])] += 1


for spec in reversed(layer_graphs()):
    loaded = spec.load(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    target = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    for name, make in LAYERS.items():
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, loaded.edge_index), target).backward()
            opt.step()

        decided.clear()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        host, total = [], []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(30):
                step()
            host.append((time.perf_counter() - t) / 30 * 1e3)
            torch.cuda.synchronize()
            total.append((time.perf_counter() - t) / 30 * 1e3)
        say(f"== {name} on {spec.name}: host {statistics.median(host):.3f} [{', '.join(f'{t:.2f}' for t in host)}]"
            f" step {statistics.median(total):.3f} [{', '.join(f'{t:.2f}' for t in total)}] ms")
        for entry in dict.fromkeys(decided):
            say(f"  decided {entry}")
        stacks.clear()
        shown = warnings.showwarning
        warnings.showwarning = on_warning
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = on_warning
            for _ in range(2):
                step()
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
        say(f"  syncs in 2 steps: {sum(stacks.values())}")
        for stack, count in stacks.most_common(6):
            say(f"  -- {count}x\n{stack}")
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
        say("\n".join(text.getvalue().splitlines()[6:]))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        kernels = collections.defaultdict(float)
        for average in prof.key_averages():
            us = getattr(average, "self_device_time_total", 0) or getattr(average, "self_cuda_time_total", 0)
            if us > 0:
                kernels[average.key[:90]] += us / 5
        say(f"  GPU us per step: {sum(kernels.values()):.0f}")
        for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:8]:
            say(f"    {us:8.1f}  {kernel}")
    del loaded, x, target
    torch.cuda.empty_cache()
say("done")
