"""Probe 50: where GIN's eager training step reaches its peak memory (the layer suite: 718 MiB
against 586 for compiled PyG and for ours compiled).

Every ATen call of one step (after warm-up) is logged with the memory allocated after it and the
shapes it returned; the calls around the peak are printed, for our GINConv and for PyG's eager
GINConv.

    python3 gpu_probe50.py <repo>
"""
import sys

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_geometric.nn as pygnn
from torch.utils._python_dispatch import TorchDispatchMode

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
MIB = 2 ** 20


class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        self.rows.append((str(func), shapes, torch.cuda.memory_allocated() / MIB))
        return out


def case(name, module):
    ei = datasets.uniform_graph(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    model = module.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated() / MIB
    torch.cuda.reset_peak_memory_stats()
    log = Log()
    with log:
        step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / MIB - base
    print(f"\n=== {name}: peak {peak:.1f} MiB over {base:.1f} MiB allocated before; {len(log.rows)} calls")
    top = max(range(len(log.rows)), key=lambda i: log.rows[i][2])
    for i in range(max(0, top - 14), min(len(log.rows), top + 4)):
        func, shapes, mem = log.rows[i]
        print(f"{'>>' if i == top else '  '} {mem - base:8.1f} {func} {shapes}")
    del model, opt, x, target, ei
    torch.cuda.empty_cache()


def mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W))


case("ours", ugnn.GINConv(mlp()))
case("pyg eager", pygnn.GINConv(mlp()))
