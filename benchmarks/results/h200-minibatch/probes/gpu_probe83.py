"""Probe 83: GCN's unit normalisation on a new graph, three ways in one process: the two graph
operators over the padded graph (50fe5f8), node-level factors with torch operations (aafdd69,
now ``unit_norm_torch``), and the two kernels of ``triton_kernels.unit_norm`` (now ``unit_norm``
on a GPU).

A. Per fresh COLLAB mini-batch graph (train_e2e's sampler, 1024 seeds, 10 + 10 neighbours), us
   with a sync around each piece, the three alternating over the same 40 graphs, 3 rounds: the
   padded graph (all need it), then each normalisation.
B. 2-layer GCN training steps (train_e2e's model, hidden 64) on fresh batches with each
   normalisation, and eager PyG, alternating, 3 rounds.

    python3 gpu_probe83.py OUT.txt
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


def torch_unit_norm(edge_index, flow, num_nodes, add_self_loops, dtype, kept=None):
    """aafdd69's normalisation: node-level factors with torch operations."""
    index = edge_index.detach().long()
    return gcn_conv.unit_norm_torch(index[0], index[1], num_nodes, add_self_loops, dtype, kept)


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
    torch_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
    now_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
pieces = {"padded graph": [], "norm before (graph ops)": [], "norm, torch factors": [], "norm, kernels": []}
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
        factors = torch_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        new = now_unit_norm(b.edge_index, "source_to_target", n, True, torch.float32)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        pieces["padded graph"].append((t1 - t0) * 1e6)
        pieces["norm before (graph ops)"].append((t2 - t1) * 1e6)
        pieces["norm, torch factors"].append((t3 - t2) * 1e6)
        pieces["norm, kernels"].append((t4 - t3) * 1e6)
        for other in (factors, new):
            maxdiff = max(maxdiff, ((old - other).abs().max() / old.abs().max()).item())
say("\n== A. us per new graph (sync around each piece), median [quartiles] of 3 x 40 graphs")
for label, v in pieces.items():
    q = statistics.quantiles(v, n=4)
    say(f"  {label:28s} {statistics.median(v):8.1f}  [{q[0]:.1f}, {q[2]:.1f}]")
say(f"  largest relative difference of the weights from before's: {maxdiff:.2e}")


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
variants = {"ours, graph ops": (ours, before_unit_norm), "ours, torch factors": (ours, torch_unit_norm),
            "ours, kernels": (ours, now_unit_norm), "pyg": (pyg, None)}
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
    say(f"  {label:22s} {statistics.median(v):.3f}  [{', '.join(f'{t:.2f}' for t in v)}]")
say("done")
