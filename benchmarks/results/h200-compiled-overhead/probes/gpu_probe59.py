"""Probe 59: tracebacks of our layers under torch.compile(mode="reduce-overhead") (CUDA graphs).

    python3 gpu_probe59.py <repo> [layer ...]
"""
import sys
import traceback

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn as nn
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 20_000, 400_000, 128
LAYERS = {
    "GCNConv": lambda: ugnn.GCNConv(W, W),
    "GATConv": lambda: ugnn.GATConv(W, W // 4, heads=4),
    "SAGEConv": lambda: ugnn.SAGEConv(W, W, aggr="mean"),
    "GraphConv": lambda: ugnn.GraphConv(W, W, aggr="max"),
    "GINConv": lambda: ugnn.GINConv(nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))),
}
ei = datasets.uniform_graph(N, E, seed=0, device=dev)
x = torch.randn(N, W, device=dev)
target = torch.randn(N, W, device=dev)
for name in sys.argv[2:] or list(LAYERS):
    torch.manual_seed(0)
    model = LAYERS[name]().to(dev)
    eager = [model(x, ei).detach().clone()]
    runner = torch.compile(model, dynamic=False, mode="reduce-overhead")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    try:
        for i in range(5):
            opt.zero_grad(set_to_none=True)
            out = runner(x, ei)
            if i == 0:
                print(name, "first output rel err", ((out - eager[0]).norm() / eager[0].norm()).item())
            F.mse_loss(out, target).backward()
            opt.step()
        torch.cuda.synchronize()
        print(name, "OK", flush=True)
    except Exception:  # noqa: BLE001
        print(name, "FAILED\n" + "".join(traceback.format_exc().splitlines(True)[-40:]), flush=True)
    torch._dynamo.reset()
