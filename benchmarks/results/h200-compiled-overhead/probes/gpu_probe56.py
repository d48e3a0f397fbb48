"""Probe 56: where the host time of a compiled GCN / SAGE step goes (cProfile of the forward and
of the backward, 30 steps each, synchronised between phases).

    python3 gpu_probe56.py <repo> OUT_DIR
"""
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F

import pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets

out = Path(sys.argv[2])
dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
ei = datasets.uniform_graph(N, E, seed=0, device=dev)
torch.manual_seed(0)
x = torch.randn(N, W, device=dev)
target = torch.randn(N, W, device=dev)
for name, make in (("GCNConv", lambda: ugnn.GCNConv(W, W)), ("SAGEConv", lambda: ugnn.SAGEConv(W, W, aggr="mean"))):
    for method in ("eager", "compiled"):
        torch.manual_seed(0)
        model = make().to(dev)
        runner = model if method == "eager" else torch.compile(model, dynamic=False)
        for _ in range(5):
            F.mse_loss(runner(x, ei), target).backward()
        torch.cuda.synchronize()
        fwd, bwd = cProfile.Profile(), cProfile.Profile()
        for _ in range(30):
            fwd.enable(); o = runner(x, ei); fwd.disable()
            loss = F.mse_loss(o, target)
            torch.cuda.synchronize()
            bwd.enable(); loss.backward(); bwd.disable()
            torch.cuda.synchronize()
        with open(out / f"{name}_{method}.txt", "w") as f:
            for label, prof in (("forward", fwd), ("backward", bwd)):
                for order in ("tottime", "cumulative"):
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats(order).print_stats(40)
                    f.write(f"\n===== {label} by {order} (30 steps)\n{s.getvalue()}")
        print(name, method, "done", flush=True)
        torch._dynamo.reset()
