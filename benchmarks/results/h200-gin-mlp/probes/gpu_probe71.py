"""Probe 71: which allocations are live at the peak of one SAGE and one GraphConv (max) training
step, ours eager against PyG compiled, on the uniform and power-law graphs of 2e5 nodes and 4e6
edges (the layer suite's setup). CUDA's allocator history is recorded over one step after warm-up;
replaying its alloc / free events gives the step's peak above what was allocated before and the
blocks alive there, with their sizes and the innermost Python frame that allocated them.

    python3 gpu_probe71.py OUT.txt
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

import pyg_ugrapher.nn as ug_nn
from benchmarks.layers import LAYERS
from pyg_ugrapher import datasets

dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128
MIB = 2**20
lines = []


def frame(event):
    for f in event.get("frames", []):
        name = f.get("filename", "")
        if name.endswith(".py") and "torch/" not in name:
            return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    frames = event.get("frames", [])
    return f"{os.path.basename(frames[0]['filename'])}:{frames[0]['line']} {frames[0]['name']}" if frames else "?"


def live_at_peak(step):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=200_000)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del result
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live, current, best, best_live = {}, 0, 0, {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            current += e["size"]
            if current > best:
                best, best_live = current, dict(live)
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            current -= live.pop(e["addr"])["size"]
    return peak / MIB, best / MIB, sorted(best_live.values(), key=lambda e: -e["size"])


for kind in ("uniform", "power_law"):
    ei = (datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph)(N, E, seed=0, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(N, W, generator=gen, device=dev)
    target = torch.randn(N, W, generator=gen, device=dev)
    for layer in ("SAGEConv", "GraphConv"):
        for label, namespace, compiled in (("ours", ug_nn, False), ("pyg_compiled", pyg_nn, True)):
            torch.manual_seed(0)
            model = LAYERS[layer](namespace, W).to(dev)
            runner = torch.compile(model, dynamic=False) if compiled else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                out = runner(x, ei)
                F.mse_loss(out, target).backward()
                opt.step()
                return out.detach()
            for _ in range(5):
                step()
            peak, replayed, blocks = live_at_peak(step)
            lines.append(f"=== {kind} {layer} {label}: max_memory_allocated - before {peak:.3f} MiB; "
                         f"replayed peak of the step's own allocations {replayed:.3f} MiB in {len(blocks)} blocks")
            for e in blocks[:12]:
                lines.append(f"    {e['size'] / MIB:10.4f} MiB  {frame(e)}")
            print("\n".join(lines[-13:]), flush=True)
            torch._dynamo.reset()
            del model, runner, opt
            torch.cuda.empty_cache()
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
