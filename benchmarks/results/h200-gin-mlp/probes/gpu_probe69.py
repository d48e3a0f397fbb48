"""Probe 69: A/B of the eager training steps of SAGEConv, GraphConv (max) and GINConv (MLP
128-128-128) between this tree's ``pyg_ugrapher.nn`` (new) and a copy of the previous commit's
(``pyg_ugrapher.nn_old``, made for the run, not committed), alternating new, old, new, old in one
process; then, for the new code, the live memory after every ATen call of one GIN and one SAGE
step around the peak, and GIN's kernels per step. Uniform and power-law graphs of 2e5 nodes,
4e6 edges, 128 features, as the layer suite.

    python3 gpu_probe69.py OUT_DIR
"""
import importlib
import os
import statistics
import sys

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.getcwd())
from benchmarks.layers import LAYERS  # noqa: E402
from pyg_ugrapher import datasets  # noqa: E402

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
MIB = 2**20
TREES = {"new": "pyg_ugrapher.nn", "old": "pyg_ugrapher.nn_old"}


def make_step(namespace, layer, x, ei, target):
    torch.manual_seed(0)
    model = LAYERS[layer](importlib.import_module(namespace), W).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x, ei)
        F.mse_loss(out, target).backward()
        opt.step()
        return out.detach()
    return model, step


def timed(step, reps=40):
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    return statistics.median(times)


def peak(step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = step()
    torch.cuda.synchronize()
    value = (torch.cuda.max_memory_allocated() - before) / MIB
    del result
    return value


class PeakPerCall(TorchDispatchMode):
    def __init__(self, base):
        super().__init__()
        self.base, self.rows = base, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize()
        shapes = [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        self.rows.append((torch.cuda.max_memory_allocated() / MIB - self.base,
                          torch.cuda.memory_allocated() / MIB - self.base, str(func), shapes))
        return out


rows, report = [], []
for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, W, generator=gen, device=dev)
    target = torch.randn(N, W, generator=gen, device=dev)
    for layer in ("SAGEConv", "GraphConv", "GINConv"):
        steps, outs = {}, {}
        for tree, namespace in TREES.items():
            model, step = make_step(namespace, layer, x, ei, target)
            for _ in range(5):
                step()
            outs[tree] = (model(x, ei).detach(), [p.grad.clone() for p in model.parameters()])
            steps[tree] = step
        err = max(((a - b).abs().max() / b.abs().max()).item()
                  for a, b in zip([outs["new"][0]] + outs["new"][1], [outs["old"][0]] + outs["old"][1]))
        for rnd in range(2):
            for tree in ("new", "old"):
                rows.append(dict(graph=kind, layer=layer, tree=tree, round=rnd, step_ms=timed(steps[tree]),
                                 peak_mib=peak(steps[tree]), max_rel_diff_new_old=err))
                print(rows[-1], flush=True)
        if kind == "uniform" and layer in ("SAGEConv", "GINConv"):
            step = steps["new"]
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated() / MIB
            mode = PeakPerCall(base)
            with mode:
                result = step()
            del result
            top = max(r[0] for r in mode.rows)
            report.append(f"=== {layer} new, uniform: {len(mode.rows)} ATen calls, step peak {top:.2f} MiB")
            for i, (p, a, f, s) in enumerate(mode.rows):
                if p > top - 120 or i < 3:
                    report.append(f"{'>>' if p == top else '  '} {i:3d} peak {p:8.2f} after {a:8.2f} {f} {s}")
        if kind == "uniform" and layer == "GINConv":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    steps["new"]()
                torch.cuda.synchronize()
            kernels = []
            for ev in prof.key_averages():
                dev_us = getattr(ev, "self_device_time_total", None)
                if dev_us is None:
                    dev_us = ev.self_cuda_time_total
                if dev_us > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
                    kernels.append((dev_us / 5, ev.count // 5, ev.key))
            kernels.sort(reverse=True)
            report.append(f"=== GINConv new, uniform: GPU kernels, {sum(k[0] for k in kernels) / 1e3:.3f} ms busy per step")
            for us, count, key in kernels:
                report.append(f"  {us / 1e3:7.3f} ms  x{count:<3d} {key[:130]}")
        del steps, outs
        torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(os.path.join(out_dir, "probe69.csv"), index=False)
with open(os.path.join(out_dir, "probe69.txt"), "w") as f:
    f.write("\n".join(report) + "\n")
print("\n".join(report))
print(pd.DataFrame(rows).groupby(["graph", "layer", "tree"])[["step_ms", "peak_mib"]].median().to_string())
