"""Probe 94: why SAGEConv's and GINConv's layer steps are slower on the power-law graph than on
the uniform one in the layer suites of the twenty-fifth and twenty-sixth sessions (SAGE 1.63-2.40
against 1.29-1.62 ms; the twenty-third session read 1.25 ms on both).

For SAGEConv(128, 128, aggr="mean") and GINConv (the suite's MLP) on the suite's two 4e6-edge
graphs, after 10 warm-up steps: the step's host time (no sync) and step time (30 steps, 3 rounds),
the schedule decided for each graph operator of the step (forward and backward, through
``ops.schedule_for``), and the GPU time of every kernel of one step under torch.profiler.

    python3 gpu_probe94.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

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
LAYERS = {"SAGEConv": lambda: ugnn.SAGEConv(128, 128, aggr="mean"),
          "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128)))}
for spec in layer_graphs():
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
        for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]:
            say(f"    {us:8.1f}  {kernel}")
    del loaded, x, target
    torch.cuda.empty_cache()
say("done")
