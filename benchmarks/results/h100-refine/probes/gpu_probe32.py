"""Probe 32: what the first training step of a layer costs (schedule decisions, measured selection
with its refinement, kernel compilation) and what the steps after it cost, on the 4e6-edge graphs.

Fresh process, empty Triton cache: what a user sees on the first epoch. For each layer and graph,
ours eager: wall time of step 1 (synchronised), of step 2, then the median of 20 steps; the
schedules decided (``derived_cache(...)['decisions']``). Run from the repository root:
``python benchmarks/results/h100-refine/probes/gpu_probe32.py``.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from benchmarks.layers import LAYERS, WIDTH  # noqa: E402
from pyg_ugrapher.graph import _DERIVED  # noqa: E402

layers = os.environ.get("PROBE_LAYERS", "GATConv GCNConv").split()
out = open(os.path.join(os.environ.get("OUT", "."), "probe32.txt"), "w")


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


cuda = torch.device("cuda")
say(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
for spec in layer_graphs():
    loaded = spec.load(cuda)
    x = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    target = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    for name in layers:
        torch.manual_seed(0)
        model = LAYERS[name](pyg_ugrapher.nn, WIDTH).to(cuda)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, loaded.edge_index), target).backward()
            opt.step()

        walls = []
        for _ in range(22):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t) * 1e3)
        say(f"{spec.name:14s} {name:9s} step1 {walls[0]:9.1f} ms  step2 {walls[1]:7.2f} ms  "
            f"median of 20 {statistics.median(walls[2:]):6.2f} ms")
        for cache in list(_DERIVED.values()):
            for key, decision in cache.get("decisions", {}).items():
                say(f"    {key[0][:70]:70s} {str(key[3])[:30]:30s} {decision[2]}")
            cache.pop("decisions", None)
        del model, opt
    del loaded, x, target
    torch.cuda.empty_cache()
out.close()
