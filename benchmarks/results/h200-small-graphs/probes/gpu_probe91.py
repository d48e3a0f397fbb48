"""Probe 91: structures kept in the user's order on small GPU graphs against sorted ones, switched
in one process (``autotune.selection.reads_user_order`` patched).

A. Per new COLLAB batch graph (train_e2e's sampler, 1024 seeds, 10 + 10 neighbours): the
   structure of ``GraphTensor(src, dst, validate=False)``, sorted or in the user's order, us per
   graph with a sync around each (median of 3 rounds of 40 graphs).
B. GPU time of one edge-parallel gather on a batch graph, each order (``do_bench``, F = 64):
   ``copy_u_sum``, ``copy_u_mean``, ``copy_u_max``, and on the reversed graph ``copy_u_sum``.
C. 2-layer mini-batch steps (train_e2e's models, hidden 64) on fresh COLLAB batches: ours with
   each order and eager PyG, alternating, 5 rounds of 40 steps (ms per step, sync at the end).

    python3 gpu_probe91.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from autotune import selection  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher.graph import in_user_order  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


ORDERS = {"user order": selection.reads_user_order, "sorted": lambda num_edges, device: False}
dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731
say(f"COLLAB batches: {statistics.median(b.edge_index.size(1) for b in batches):.0f} edges, "
    f"{statistics.median(b.node_ids.numel() for b in batches):.0f} nodes (medians)")

# -- A ------------------------------------------------------------------------------------------
say("== A. structure of a new batch graph, us per graph (sync around each), median [rounds]")
pieces = {k: [] for k in ORDERS}
for rnd in range(3):
    for label, rule in ORDERS.items():
        selection.reads_user_order = rule
        graphs = [ug.GraphTensor(b.edge_index[0], b.edge_index[1], b.node_ids.numel(), b.node_ids.numel(),
                                 validate=False) for b in fresh(batches[5:45])]
        torch.cuda.synchronize()
        total = 0.0
        for g in graphs:
            t = time.perf_counter()
            structure = g.structure(dev)
            torch.cuda.synchronize()
            total += time.perf_counter() - t
            assert in_user_order(structure[0]) == (label == "user order")
        pieces[label].append(total / len(graphs) * 1e6)
for label, values in pieces.items():
    say(f"  {label:12s} {statistics.median(values):7.1f} [{', '.join(f'{v:.1f}' for v in values)}]")

# -- B ------------------------------------------------------------------------------------------
say("== B. GPU time of one edge-parallel gather on a batch graph, F = 64, us (do_bench)")
b = batches[10]
n = b.node_ids.numel()
x = torch.randn(n, 64, device=dev)
info = ug.ParallelInfo("edge", block_f=64, block_e=128, num_warps=8)
for label, rule in ORDERS.items():
    selection.reads_user_order = rule
    g = ug.GraphTensor(b.edge_index[0].clone(), b.edge_index[1].clone(), n, n)
    row = []
    for name, graph in (("copy_u_sum", g), ("copy_u_mean", g), ("copy_u_max", g), ("copy_u_sum reversed", g.reverse())):
        op = name.split()[0]
        ms = triton.testing.do_bench(lambda: ug.compute(graph, op, x, parallel_info=info), warmup=20, rep=200)
        row.append(f"{name} {ms * 1e3:.1f}")
    say(f"  {label:12s} " + ", ".join(row))
# Both orders compute the same sums (atomics change the order of additions only).
selection.reads_user_order = ORDERS["sorted"]
g_sorted = ug.GraphTensor(b.edge_index[0].clone(), b.edge_index[1].clone(), n, n)
selection.reads_user_order = ORDERS["user order"]
g_user = ug.GraphTensor(b.edge_index[0].clone(), b.edge_index[1].clone(), n, n)
for op in ("copy_u_sum", "copy_u_mean", "copy_u_max"):
    a, c = ug.compute(g_sorted, op, x, parallel_info=info), ug.compute(g_user, op, x, parallel_info=info)
    say(f"  {op}: largest relative difference between the orders "
        f"{((a - c).abs().max() / a.abs().max().clamp_min(1e-30)).item():.1e}")

# -- C ------------------------------------------------------------------------------------------


def make(model_name, layers):
    torch.manual_seed(0)
    m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    return step


def timed(step, items):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in items:
        step(b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / len(items) * 1e3


say("== C. 2-layer mini-batch steps on fresh COLLAB batches, ms per step, median [rounds]")
for model_name in ("gcn", "gat", "sage", "gin"):
    ours, pyg = make(model_name, ugnn), make(model_name, pygnn)
    for label, rule in ORDERS.items():
        selection.reads_user_order = rule
        for b in fresh(batches[:5]):
            ours(b)
    for b in fresh(batches[:5]):
        pyg(b)
    res = {k: [] for k in list(ORDERS) + ["pyg"]}
    for rnd in range(5):
        for label, rule in ORDERS.items():
            selection.reads_user_order = rule
            res[label].append(timed(ours, fresh(batches[5:45])))
        res["pyg"].append(timed(pyg, fresh(batches[5:45])))
    say(f"  {model_name}: " + "; ".join(f"{k} {statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]"
                                        for k, v in res.items()))
selection.reads_user_order = ORDERS["user order"]
say("done")
