"""Probe 78: GINConv's network through ``nn._dense.network`` (this tree: every torch or PyG
``Linear`` submodule of any module computes through ``linear`` for the call) against the previous
``sequential`` (a plain ``Sequential`` only, child by child; copied below) and against the
network called as it is, alternating in one process: the layer suite's GIN (``Sequential`` 128-128-128)
and GIN with PyG's ``MLP([128, 128, 128])`` (batch norm, ReLU), eager steps on the 4e6-edge graphs;
step ms (CUDA events), host ms, peak MiB from an emptied cache; compiled PyG's GIN(MLP) for scale.

    python3 gpu_probe78.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_geometric.nn as pygnn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from pyg_ugrapher import datasets  # noqa: E402
from pyg_ugrapher.nn import _dense, gin_conv  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


def sequential(net, x):
    """The previous ``_dense.sequential`` (commit a576137), hooks checks left out (none here)."""
    if type(net) is not nn.Sequential or not torch.is_grad_enabled():
        return net(x)
    for module in net:
        x = _dense.linear(module, x) if type(module) in _dense._LINEARS else module(x)
    return x


RUNNERS = {"network": _dense.network, "sequential": sequential, "as is": lambda net, x: net(x)}
dev = torch.device("cuda")
NETS = {"Sequential": lambda: nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128)),
        "PyG MLP": lambda: pygnn.MLP([128, 128, 128])}


def timed(step):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(15):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
        t = time.perf_counter()
        step()
        host.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return times, host


def peak(step):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


for kind in ("uniform", "power_law"):
    make = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    edge_index = make(200_000, 4_000_000, seed=0, device=dev)
    x, target = torch.randn(200_000, 128, device=dev), torch.randn(200_000, 128, device=dev)
    for net_name, make_net in NETS.items():
        torch.manual_seed(0)
        model = ugnn.GINConv(make_net()).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            o = model(x, edge_index)
            F.mse_loss(o, target).backward()
            opt.step()
        res = {k: ([], []) for k in RUNNERS}
        peaks = {}
        for round_ in range(4):
            for label in (list(RUNNERS) if round_ % 2 == 0 else list(reversed(RUNNERS))):
                gin_conv.network = RUNNERS[label]
                t, h = timed(step)
                res[label][0].extend(t)
                res[label][1].extend(h)
                if round_ == 0:
                    peaks[label] = peak(step)
        gin_conv.network = _dense.network
        torch.manual_seed(0)
        pyg_model = torch.compile(pygnn.GINConv(make_net()).to(dev), dynamic=False)
        pyg_opt = torch.optim.Adam(pyg_model.parameters(), lr=1e-3)

        def pyg_step():
            pyg_opt.zero_grad(set_to_none=True)
            F.mse_loss(pyg_model(x, edge_index), target).backward()
            pyg_opt.step()
        pt, ph = timed(pyg_step)
        say(f"{kind:9s} GIN({net_name}): " + "; ".join(
            f"{k} {statistics.median(v[0]):.3f} ms (host {statistics.median(v[1]):.3f}, peak {peaks[k]:.1f} MiB)"
            for k, v in res.items()) + f"; compiled PyG {statistics.median(pt):.3f} ms (peak {peak(pyg_step):.1f} MiB)")
        torch._dynamo.reset()
say("done")
