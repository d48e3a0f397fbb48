"""Probe 30: where a GAT and a GIN training step spend their time, kernel by kernel.

For GATConv and GINConv of the layers suite on the 4e6-edge graphs, ours eager, ours compiled and
PyG compiled: the step time with CUDA events (median of 5 batches of 20 steps), the sum of the GPU
kernel times and launches per step (torch.profiler), the host time to issue one step when steps
run back to back, and the kernels by GPU time. ``PROBE_TAG`` names the output
(``$OUT/probe30_<tag>.txt``) so that two code states can be run from their own checkouts and
compared. Run from the repository root:
``PROBE_TAG=new python benchmarks/results/h100-fused-score/probes/gpu_probe30.py``.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch_geometric.nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from benchmarks.layers import LAYERS, WIDTH  # noqa: E402

tag = os.environ.get("PROBE_TAG", "new")
layers = os.environ.get("PROBE_LAYERS", "GATConv GINConv").split()
methods = os.environ.get("PROBE_METHODS", "ours ours_compiled pyg_compiled").split()
out = open(os.path.join(os.environ.get("OUT", "."), f"probe30_{tag}.txt"), "w")


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


cuda = torch.device("cuda")
say(f"code state {tag}; {torch.cuda.get_device_name()}; torch {torch.__version__}")
for spec in layer_graphs():
    loaded = spec.load(cuda)
    x = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    target = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    for name in layers:
        for method in methods:
            ns = torch_geometric.nn if method.startswith("pyg") else pyg_ugrapher.nn
            torch.manual_seed(0)
            model = LAYERS[name](ns, WIDTH).to(cuda)
            runner = torch.compile(model, dynamic=False) if method.endswith("compiled") else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(runner(x, loaded.edge_index), target).backward()
                opt.step()

            for _ in range(5):
                step()
            torch.cuda.synchronize()
            walls, hosts = [], []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t = time.perf_counter()
                for _ in range(20):
                    step()
                hosts.append((time.perf_counter() - t) / 20 * 1e3)
                end.record()
                torch.cuda.synchronize()
                walls.append(start.elapsed_time(end) / 20)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_time_total > 0]
            gpu = sum(e.device_time_total for e in events) / 10 / 1e3
            launches = sum(e.count for e in events) / 10
            say(f"{spec.name:14s} {name:9s} {method:13s} step {statistics.median(walls):6.3f} ms  "
                f"gpu kernels {gpu:6.3f} ms ({launches:.0f} launches)  host issue {statistics.median(hosts):6.3f} ms")
            for e in sorted(events, key=lambda e: -e.device_time_total)[:18]:
                say(f"    {e.device_time_total / 10 / 1e3:7.3f} ms  x{e.count / 10:4.1f}  {e.key[:110]}")
            del model, opt, runner
            torch._dynamo.reset()
    del loaded, x, target
    torch.cuda.empty_cache()
out.close()
