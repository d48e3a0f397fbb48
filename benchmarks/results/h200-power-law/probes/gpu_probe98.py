"""Probe 98: GAT's forward in one pass on graphs with hubs (``triton_kernels.group_softmax``).

Before, a forward whose decided schedule was neighbour groups ran three operators (a gather-max,
a gather-sum, the output gather) and three torch operations for the log-normaliser; now one
neighbour-group kernel and one combining kernel. In one process, for GATConv(128, 32, heads=4)
on both layer graphs: the forward's decided schedule, then 5 alternating rounds of the new route
(A) and the three operators wherever the decided schedule is neighbour groups (B, the previous
code's route): host and step ms of 30 training steps; the forward's GPU time alone (``do_bench``,
no grad); the GPU time of each kernel of one step.

    python3 gpu_probe98.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.attention as attention  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
three = [False]
decided = {}
one_pass_decision = attention._one_pass_decision


def routed(*args):
    result = one_pass_decision(*args)
    decided[result[0].csr.num_edges] = result[2].serialize()
    if three[0] and result[2].strategy == "group":
        return result[:4] + (None, False)
    return result


attention._one_pass_decision = routed
for spec in reversed(layer_graphs()):
    loaded = spec.load(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    target = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    torch.manual_seed(0)
    model = ugnn.GATConv(128, 32, heads=4).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, loaded.edge_index), target).backward()
        opt.step()

    for variant in (False, True):
        three[0] = variant
        for _ in range(5):
            step()
    say(f"== GATConv on {spec.name}: one pass decided {decided}")
    results = {"A one pass": ([], [], []), "B three operators": ([], [], [])}
    for _ in range(5):
        for name, variant in (("A one pass", False), ("B three operators", True)):
            three[0] = variant
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                step()
            results[name][0].append((time.perf_counter() - t) / 30 * 1e3)
            torch.cuda.synchronize()
            results[name][1].append((time.perf_counter() - t) / 30 * 1e3)
            with torch.no_grad():
                results[name][2].append(do_bench(lambda: model(x, loaded.edge_index), warmup=25, rep=200))
    for name, (host, total, forward) in results.items():
        say(f"  {name}: host {statistics.median(host):.3f} [{min(host):.2f}-{max(host):.2f}] step "
            f"{statistics.median(total):.3f} [{min(total):.2f}-{max(total):.2f}] ms; forward alone (no grad) "
            f"{statistics.median(forward):.3f} [{min(forward):.3f}-{max(forward):.3f}] ms")
    for name, variant in (("A one pass", False), ("B three operators", True)):
        three[0] = variant
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        kernels = collections.defaultdict(float)
        for average in prof.key_averages():
            us = getattr(average, "self_device_time_total", 0) or getattr(average, "self_cuda_time_total", 0)
            if us > 0:
                kernels[average.key[:90]] += us / 5
        say(f"  {name}: GPU us per step {sum(kernels.values()):.0f}")
        for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:14]:
            say(f"    {us:8.1f}  {kernel}")
    del loaded, x, target, model, opt
    torch.cuda.empty_cache()
say("done")
