"""Probe 77: SAGEConv's and GraphConv's eager step with ``nn._dense.linear_sum`` as two autograd
nodes (this tree: the root term first, the aggregation's product added in place, so the backward
frees the aggregation before the root's weight gradient) against the previous single node (its
code copied below), alternating in one process: step ms (CUDA events), host ms, peak MiB from an
emptied cache, and GPU time per step from torch.profiler's kernel list.

    python3 gpu_probe77.py OUT.txt
"""
import os
import statistics
import sys
import time
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from benchmarks.layers import LAYERS  # noqa: E402
from pyg_ugrapher import datasets  # noqa: E402
from pyg_ugrapher.nn import _dense  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


class OneNode(torch.autograd.Function):
    """The previous ``_Linear`` with a root term (commit 811f54b)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], root_x: Tensor, root_weight: Tensor):
        out = torch.addmm(bias, x, weight.t())
        out.addmm_(root_x, root_weight.t())
        ctx.save_for_backward(x, weight, root_x, root_weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, root_x, root_weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (grad.mm(weight) if needs[0] else None, grad.t().mm(x) if needs[1] else None,
                _dense._row_sum(grad) if needs[2] else None,
                grad.mm(root_weight) if needs[3] else None, grad.t().mm(root_x) if needs[4] else None)


new_sum = _dense.linear_sum


def old_sum(lin, x, root, root_x):
    if root.bias is not None or not _dense._eager(x, lin, root) or not _dense._fused(x, lin, root) \
            or not _dense._fused(root_x, root):
        return _dense.linear(lin, x) + root(root_x)
    return OneNode.apply(x, lin.weight, lin.bias, root_x, root.weight)


dev = torch.device("cuda")
import pyg_ugrapher.nn as ugnn  # noqa: E402
from pyg_ugrapher.nn import graph_conv, sage_conv  # noqa: E402

for kind in ("uniform", "power_law"):
    make = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    edge_index = make(200_000, 4_000_000, seed=0, device=dev)
    x, target = torch.randn(200_000, 128, device=dev), torch.randn(200_000, 128, device=dev)
    for layer_name in ("SAGEConv", "GraphConv"):
        torch.manual_seed(0)
        model = LAYERS[layer_name](ugnn, 128).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            o = model(x, edge_index)
            F.mse_loss(o, target).backward()
            opt.step()
            return o
        res = {"old": [], "new": []}
        host = {"old": [], "new": []}
        peaks = {}
        gpu = {}
        for round_ in range(6):
            for label in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                fn = old_sum if label == "old" else new_sum
                sage_conv.linear_sum = graph_conv.linear_sum = fn
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                for _ in range(15):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    step()
                    step()
                    e.record()
                    torch.cuda.synchronize()
                    res[label].append(s.elapsed_time(e) / 2)
                    t = time.perf_counter()
                    step()
                    host[label].append((time.perf_counter() - t) * 1e3)
                    torch.cuda.synchronize()
                if round_ == 0:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    step()
                    torch.cuda.synchronize()
                    peaks[label] = (torch.cuda.max_memory_allocated() - before) / 2**20
                    with profile(activities=[ProfilerActivity.CUDA]) as p:
                        for _ in range(5):
                            step()
                        torch.cuda.synchronize()
                    kernels = [e for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
                    gpu[label] = sum(e.self_device_time_total for e in kernels) / 5 / 1e3
        say(f"{kind:9s} {layer_name:9s} step ms old {statistics.median(res['old']):.3f} new "
            f"{statistics.median(res['new']):.3f} | host ms old {statistics.median(host['old']):.3f} new "
            f"{statistics.median(host['new']):.3f} | peak MiB old {peaks['old']:.4f} new {peaks['new']:.4f} | "
            f"GPU ms per step old {gpu['old']:.3f} new {gpu['new']:.3f}")
say("done")
