"""Probe 80: GCN's unit normalisation on a new graph, from node-level factors (now) against the
two graph operators over the padded graph (before), in one process.

A. Per fresh COLLAB mini-batch graph (train_e2e's sampler, 1024 seeds, 10 + 10 neighbours), us
   with a sync around each piece, before / now alternating over the same 40 graphs, 3 rounds: the
   padded graph with its structure (both need it), then each normalisation on it.
B. 2-layer GCN training steps (train_e2e's model, hidden 64) on fresh batches: ours with the
   normalisation of before, ours now, and eager PyG, alternating, 3 rounds.

    python3 gpu_probe80.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher.nn import gcn_conv  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


now_unit_norm = gcn_conv.unit_norm


def before_unit_norm(edge_index, flow, num_nodes, add_self_loops, dtype, kept=None):
    """The normalisation of 50fe5f8 for the padded graph: loop weights, then a copy_e_sum and a
    message op over the graph."""
    assert kept is None and add_self_loops
    graph = gcn_conv.fixed_size_graph(edge_index, flow, num_nodes, True, "sum")
    ones = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    return gcn_conv.gcn_norm_weights(graph, gcn_conv.GCNConv.loop_weights(edge_index, None, True, ones, num_nodes,
                                                                        1.0))


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
say(f"COLLAB batches: {len(batches)}, median edges {statistics.median(b.edge_index.size(1) for b in batches):.0f}")
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731

# -- A ------------------------------------------------------------------------------------------
for b in fresh(batches[:3]):  # warm-up: kernels, decisions
    n = b.node_ids.numel()
    gcn_conv.fixed_size_graph(b.edge_index, "source_to_target", n, True, "sum")
    before_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
    now_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
pieces = {"padded graph + structure": [], "norm before": [], "norm now": []}
maxdiff = 0.0
for rnd in range(3):
    for b in fresh(batches[5:45]):
        n = b.node_ids.numel()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gcn_conv.fixed_size_graph(b.edge_index, "source_to_target", n, True, "sum")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        old = before_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        new = now_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        pieces["padded graph + structure"].append((t1 - t0) * 1e6)
        pieces["norm before"].append((t2 - t1) * 1e6)
        pieces["norm now"].append((t3 - t2) * 1e6)
        maxdiff = max(maxdiff, ((old - new).abs().max() / old.abs().max()).item())
say("\n== A. us per new graph (sync around each piece), median [quartiles] of 3 x 40 graphs")
for label, v in pieces.items():
    q = statistics.quantiles(v, n=4)
    say(f"  {label:28s} {statistics.median(v):8.1f}  [{q[0]:.1f}, {q[2]:.1f}]")
say(f"  largest relative difference of the weights, before / now: {maxdiff:.2e}")


# -- B ------------------------------------------------------------------------------------------
def make(layers):
    torch.manual_seed(0)
    m = te.build_model("gcn", layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    return step


ours, pyg = make(ugnn), make(pygnn)
variants = {"ours, norm before": (ours, before_unit_norm), "ours, norm now": (ours, now_unit_norm),
            "pyg": (pyg, None)}
times = {k: [] for k in variants}
for rnd in range(3):
    for label, (step, norm) in variants.items():
        if norm is not None:
            gcn_conv.unit_norm = norm
        items = fresh(batches[:45])
        for b in items[:5]:
            step(b)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in items[5:]:
            step(b)
        torch.cuda.synchronize()
        times[label].append((time.perf_counter() - t) / 40 * 1e3)
gcn_conv.unit_norm = now_unit_norm
say("\n== B. 2-layer GCN steps on fresh COLLAB batches, ms per step, median [rounds]")
for label, v in times.items():
    say(f"  {label:20s} {statistics.median(v):.3f}  [{', '.join(f'{t:.2f}' for t in v)}]")
say("done")
