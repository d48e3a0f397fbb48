"""Probe 100: the linear maps' autograd nodes in SAGE, GIN and GraphConv steps.

Eager layers compute ``x @ W^T + b`` through ``nn._dense._Linear``, a Python autograd Function whose
bias gradient is a matrix-vector product (ATen's reduction was 4x slower on the H100). Its backward
runs Python on autograd's device thread. Variants of ``_Linear.apply``, alternating in one process:

* A: the Function (the code as it is);
* B: native nodes, the bias in ``addmm``'s epilogue (its gradient ATen's ``sum`` over the rows);
* C: native nodes, the bias as a rank-1 ``addmm_`` with a column of ones (its gradient a GEMM
  ``1^T G``);

For each: host ms to issue 30 steps, step ms, host us of each part of a step (forward, loss and
backward, Adam, each timed without a sync), GPU us per step (torch.profiler's kernel sum).

    python3 gpu_probe100.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from pyg_ugrapher.nn import _dense  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


original = _dense._Linear.apply
ONES = {}


def native_epilogue(x, weight, bias, addend):
    if addend is not None:
        return addend.addmm(x, weight.t())
    return torch.mm(x, weight.t()) if bias is None else torch.addmm(bias, x, weight.t())


def native_rank_one(x, weight, bias, addend):
    if addend is not None:
        return addend.addmm(x, weight.t())
    result = torch.mm(x, weight.t())
    if bias is None:
        return result
    ones = ONES.get(x.shape[0])
    if ones is None:
        ones = ONES[x.shape[0]] = x.new_ones(x.shape[0], 1)
    return result.addmm_(ones, bias.view(1, -1))


VARIANTS = {"A Function": original, "B native, bias epilogue": native_epilogue,
            "C native, rank-1 bias": native_rank_one}
dev = torch.device("cuda")
makers = {
    "SAGEConv": lambda: ugnn.SAGEConv(128, 128),
    "GINConv": lambda: ugnn.GINConv(torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                                        torch.nn.Linear(128, 128))),
    "GraphConv": lambda: ugnn.GraphConv(128, 128, aggr="max"),
}
for spec in layer_graphs():
    loaded = spec.load(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    target = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    for layer, make in makers.items():
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, loaded.edge_index), target).backward()
            opt.step()

        for apply in VARIANTS.values():
            _dense._Linear.apply = apply
            for _ in range(5):
                step()
        results = {name: collections.defaultdict(list) for name in VARIANTS}
        for _ in range(5):
            for name, apply in VARIANTS.items():
                _dense._Linear.apply = apply
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(30):
                    step()
                results[name]["host"].append((time.perf_counter() - t) / 30 * 1e3)
                torch.cuda.synchronize()
                results[name]["step"].append((time.perf_counter() - t) / 30 * 1e3)
                for _ in range(10):
                    opt.zero_grad(set_to_none=True)
                    t0 = time.perf_counter()
                    y = model(x, loaded.edge_index)
                    t1 = time.perf_counter()
                    F.mse_loss(y, target).backward()
                    t2 = time.perf_counter()
                    opt.step()
                    t3 = time.perf_counter()
                    results[name]["fwd"].append((t1 - t0) * 1e6)
                    results[name]["bwd"].append((t2 - t1) * 1e6)
                    results[name]["adam"].append((t3 - t2) * 1e6)
                torch.cuda.synchronize()
        say(f"== {layer} on {spec.name}")
        for name, apply in VARIANTS.items():
            r = results[name]
            _dense._Linear.apply = apply
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            gpu = sum((getattr(a, "self_device_time_total", 0) or getattr(a, "self_cuda_time_total", 0))
                      for a in prof.key_averages()) / 5
            say(f"  {name}: host {statistics.median(r['host']):.3f} [{min(r['host']):.2f}-{max(r['host']):.2f}] "
                f"step {statistics.median(r['step']):.3f} [{min(r['step']):.2f}-{max(r['step']):.2f}] ms; "
                f"us fwd {statistics.median(r['fwd']):.0f} bwd {statistics.median(r['bwd']):.0f} "
                f"adam {statistics.median(r['adam']):.0f}; GPU {gpu:.0f} us")
        _dense._Linear.apply = original
        del model, opt
    del loaded, x, target
    torch.cuda.empty_cache()
say("done")
