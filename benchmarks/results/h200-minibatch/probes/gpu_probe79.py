"""Probe 79: where a same-graph 2-layer step's host time goes, ours against eager PyG.

On one COLLAB mini-batch graph (train_e2e's sampler, 1024 seeds, 10 + 10 neighbours) every step,
for GCN, GAT, SAGE and GIN (train_e2e's models, hidden 64): host ms per step (no sync inside the
loop), host syncs in one step (CUDA sync debug mode), and torch.profiler's self-CPU table of 20
steps of each implementation, with the count of kernel launches per step.

    python3 gpu_probe79.py OUT.txt
"""
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batch = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][0]
say(f"COLLAB batch: {batch.edge_index.size(1)} edges, {batch.node_ids.numel()} nodes")
x_b = task.x[batch.node_ids]
y_b = task.y[batch.node_ids[:batch.num_seeds]]


def make(model_name, layers):
    torch.manual_seed(0)
    m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    ei = batch.edge_index.clone()

    def step():
        opt.zero_grad()
        o = m(x_b, ei)[:batch.num_seeds]
        F.cross_entropy(o, y_b).backward()
        opt.step()
    return step


def host_ms(step, n=60):
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            step()
        times.append((time.perf_counter() - t) / n * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times), times


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemsetAsync", "cudaMemcpyAsync")
for model_name in ("gat", "gcn", "gin", "sage"):
    say(f"\n######## {model_name}")
    steps = {"ours": make(model_name, ugnn), "pyg": make(model_name, pygnn)}
    for step in steps.values():
        for _ in range(10):
            step()
    for rnd in range(2):
        for label, step in steps.items():
            med, times = host_ms(step)
            say(f"  round {rnd} {label:4s} host ms/step {med:.3f}  [{', '.join(f'{t:.2f}' for t in times)}]")
    for label, step in steps.items():
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            step()
            torch.cuda.set_sync_debug_mode(0)
        say(f"  {label}: {len(caught)} host syncs in one step")
        for w in caught[:4]:
            say("     ", str(w.message)[:160])
    for label, step in steps.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        avg = p.key_averages()
        launches = {k.key: k.count / 20 for k in avg if k.key in LAUNCHES}
        gpu = sum(k.self_device_time_total for k in avg) / 20 / 1e3
        say(f"\n  == {model_name} {label}: launches per step {launches}, GPU ms per step {gpu:.3f}")
        say(avg.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=55))
say("done")
