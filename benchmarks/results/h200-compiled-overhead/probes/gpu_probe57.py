"""Probe 57: compiled layers with the custom ops' device kernels registered directly (a
``torch.library.Library`` CUDA-key implementation of each op's own function), against the
``torch.library.custom_op`` default (its CompositeExplicitAutograd wrapper with the per-call
aliasing check), and eager. Same step as probe 55.

    python3 gpu_probe57.py <repo> OUT.csv
"""
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import attention, datasets, graph, ops
from pyg_ugrapher.nn import _graph

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
LAYERS = {
    "GCNConv": lambda: ugnn.GCNConv(W, W),
    "GATConv": lambda: ugnn.GATConv(W, W // 4, heads=4),
    "SAGEConv": lambda: ugnn.SAGEConv(W, W, aggr="mean"),
    "GraphConv": lambda: ugnn.GraphConv(W, W, aggr="max"),
    "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))),
}
OPS = [ops.graph_op, ops.gather_with_edge_output, _graph._layer_graph, _graph._looped_graph,
       _graph._spare_row_looped_graph, _graph._padded_looped_graph, attention.softmax_aggregate_op,
       attention._backward_op, graph.graph_structure]


def direct_kernels():
    lib = torch.library.Library("pyg_ugrapher", "IMPL")
    for op in OPS:
        lib.impl(op._name, op._init_fn, "CUDA")
    return lib


def measure(step):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    host = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(4):
            step()
        host.append((time.perf_counter() - t) / 4 * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times), statistics.median(host)


ei = datasets.uniform_graph(N, E, seed=0, device=dev)
torch.manual_seed(0)
x = torch.randn(N, W, device=dev)
target = torch.randn(N, W, device=dev)
rows = []
lib = None
for variant in ("custom_op", "direct", "custom_op again"):
    if variant == "direct":
        lib = direct_kernels()
    elif lib is not None:
        lib._destroy()
        lib = None
    for name, make in LAYERS.items():
        for method in (("eager", "compiled") if variant != "direct" else ("compiled",)):
            torch.manual_seed(0)
            model = make().to(dev)
            runner = model if method == "eager" else torch.compile(model, dynamic=False)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(runner(x, ei), target).backward()
                opt.step()
            try:
                t, h = measure(step)
                rows.append(dict(variant=variant, layer=name, method=method, step_ms=t, host_ms=h))
            except Exception as exc:  # noqa: BLE001
                rows.append(dict(variant=variant, layer=name, method=method, error=repr(exc)[:300]))
            print(rows[-1], flush=True)
            del model, runner, opt
            torch._dynamo.reset()
pd.DataFrame(rows).to_csv(sys.argv[2], index=False)
