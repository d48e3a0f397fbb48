"""Probe 29: is a layer training step bound by the GPU or by the host? Where does the host go?

For each layer of the layers suite on the 4e6-edge graphs (ours eager): the step time with CUDA
events, the sum of its GPU kernel times (torch.profiler), and the host time to issue one step
when steps run back to back; then cProfile of the eager GAT and SAGE steps (uniform graph), top
functions by own time. Writes ``$OUT/probe29.txt``. Run from the repository root:
``python benchmarks/results/h100-model-everywhere/probes/gpu_probe29.py``.
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch
import torch.nn.functional as F
import torch_geometric.nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from benchmarks.layers import LAYERS, WIDTH  # noqa: E402

out = open(os.path.join(os.environ.get("OUT", "."), "probe29.txt"), "w")


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


cuda = torch.device("cuda")
for spec in layer_graphs():
    loaded = spec.load(cuda)
    x = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    target = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    for name in LAYERS:
        for label, ns in (("ours", pyg_ugrapher.nn), ("pyg", torch_geometric.nn)):
            torch.manual_seed(0)
            model = LAYERS[name](ns, WIDTH).to(cuda)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(model(x, loaded.edge_index), target).backward()
                opt.step()

            for _ in range(5):
                step()
            torch.cuda.synchronize()
            n = 30
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.perf_counter()
            for _ in range(n):
                step()
            host = (time.perf_counter() - t) / n * 1e3
            end.record()
            torch.cuda.synchronize()
            wall = start.elapsed_time(end) / n
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            gpu = sum(e.device_time_total for e in prof.key_averages()) / 10 / 1e3
            kernels = sum(e.count for e in prof.key_averages() if e.device_time_total > 0) / 10
            say(f"{spec.name:14s} {name:10s} {label:5s} step {wall:6.2f} ms  gpu kernels {gpu:6.2f} ms "
                f"({kernels:.0f} launches)  host issue {host:6.2f} ms")
            if spec.kind == "uniform" and label == "ours" and name in ("GATConv", "SAGEConv"):
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
                profile.disable()
                text = io.StringIO()
                stats = pstats.Stats(profile, stream=text)
                stats.sort_stats("tottime").print_stats(35)
                stats.sort_stats("cumtime").print_stats(45)
                out.write(f"---- cProfile {name} x20 steps ----\n" + text.getvalue())
            del model, opt
    del loaded, x, target
    torch.cuda.empty_cache()
out.close()
