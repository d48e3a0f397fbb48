"""Probe 66: GAT's eager training step with the projection and attention halves as one autograd
node (``nn._dense.projection_attention``) against PyTorch's ops (the previous code, restored here by
patching the layer's module), alternating in one process: new, old, new, old, new, old per graph.
Uniform and power-law graphs of 2e5 nodes and 4e6 edges, 128 features, 4 heads.

    python3 gpu_probe66.py <repo> OUT.csv
"""
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets
from pyg_ugrapher.nn import _dense, gat_conv

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
new = gat_conv.projection_attention


def old(lin, raw, vectors, project=True):
    heads, channels = vectors[0].shape[1:]
    x = lin(raw).view(-1, heads, channels) if project else None
    _, folded = _dense._fold(lin.weight, vectors)
    return x, F.linear(raw, folded).view(-1, len(vectors), heads).unbind(1)


def measure(step):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    host = []
    for _ in range(15):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(4):
            step()
        host.append((time.perf_counter() - t) / 4 * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times), statistics.median(host)


rows = []
for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    outs = {}
    for run in range(6):
        variant = "new" if run % 2 == 0 else "old"
        gat_conv.projection_attention = new if variant == "new" else old
        torch.manual_seed(0)
        model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, ei), target).backward()
            opt.step()
        if run < 2:
            torch.manual_seed(0)
            probe = ugnn.GATConv(W, W // 4, heads=4).to(dev)
            out = probe(x, ei)
            out.square().sum().backward()
            outs[variant] = [out.detach()] + [p.grad for p in probe.parameters()]
        t, h = measure(step)
        rows.append(dict(graph=kind, run=run, variant=variant, step_ms=t, host_ms=h))
        print(rows[-1], flush=True)
    errs = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(outs["new"], outs["old"])]
    print(kind, "new vs old, max relative difference of output and parameter gradients:", errs, flush=True)
gat_conv.projection_attention = new
pd.DataFrame(rows).to_csv(sys.argv[2], index=False)
