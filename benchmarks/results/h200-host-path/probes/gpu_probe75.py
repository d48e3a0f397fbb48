"""Probe 75: this tree's host-path changes switched on and off in one process (a process per tree
read up to 60% apart on one machine in probe 74), and what a new mini-batch graph costs, piece by
piece.

A/B, alternating ``old`` and ``new`` five times: ``old`` puts back ``torch.utils.weak``'s
``WeakIdKeyDictionary`` for the four identity-keyed caches and plans without reused operands
(their calls go through ``dispatch.run``), with the caches and decisions emptied at each switch.
The structure list as an autograd attribute stays in both. Measured: host us per call on a COLLAB
mini-batch graph (F = 64), and one GATConv / GCNConv training step on a uniform graph of 2e5
nodes, 4e6 edges, F = 128 (decisions by the cost model alone, ``PYG_UGRAPHER_MEASURE=0``).

Pieces: host + GPU time (synchronised around each) per fresh COLLAB batch graph of the steps
that build a new graph, and one layer's forward on it, ours against PyG's.

    python3 gpu_probe75.py OUT.txt
"""
import os
import statistics
import sys
import time

os.environ["PYG_UGRAPHER_MEASURE"] = "0"
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
import triton_kernels  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher import datasets, graph as graph_module, message_passing, ops  # noqa: E402
from pyg_ugrapher.nn import _graph as nn_graph, gcn_conv  # noqa: E402
from triton_kernels import dispatch  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
MAPS = [(graph_module, "_DERIVED"), (nn_graph, "_DERIVED"), (message_passing, "_GRAPHS"), (dispatch, "_PERMUTED")]
prepare = triton_kernels.prepare


def configure(label):
    for module, name in MAPS:
        setattr(module, name, WeakIdKeyDictionary() if label == "old" else graph_module.IdentityMap())
    triton_kernels.prepare = prepare if label == "new" else \
        (lambda *args, reused=None, **kwargs: prepare(*args, **kwargs))
    ops._SHARED_DECISIONS.clear()


def host_us(fn, reps=1500):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn()
        times.append((time.perf_counter() - t) / (reps // 5) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
b0 = batches[0]
n0 = b0.node_ids.numel()
x = torch.randn(n0, 64, device=dev)
xg = x.clone().requires_grad_()
g = torch.randn(n0, 64, device=dev)
edge_index = datasets.uniform_graph(200_000, 4_000_000, seed=0, device=dev)
xs, target = torch.randn(200_000, 128, device=dev), torch.randn(200_000, 128, device=dev)
layers = {"GATConv": ugnn.GATConv(128, 32, heads=4).to(dev), "GCNConv": ugnn.GCNConv(128, 128).to(dev)}
optimizers = {k: torch.optim.Adam(v.parameters(), lr=1e-3) for k, v in layers.items()}
results = {}


def note(label, name, value):
    results.setdefault(name, {"old": [], "new": []})[label].append(value)


for round_ in range(5):
    for label in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
        configure(label)
        graph = ug.GraphTensor(b0.edge_index[0], b0.edge_index[1], n0, n0)
        w = torch.rand(graph.num_edges, device=dev)
        note(label, "A copy_u_sum forward (us)", host_us(lambda: ug.compute(graph, "copy_u_sum", x)))
        note(label, "A copy_u_sum forward, autograd node (us)", host_us(lambda: ug.compute(graph, "copy_u_sum", xg)))
        note(label, "A copy_u_sum forward + backward (us)",
             host_us(lambda: ug.compute(graph, "copy_u_sum", xg).backward(g), 600))
        note(label, "A u_mul_e_sum forward, static weight (us)",
             host_us(lambda: ug.compute(graph, "u_mul_e_sum", x, w)))
        for name, layer in layers.items():
            opt = optimizers[name]

            def big_step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(layer(xs, edge_index), target).backward()
                opt.step()
            for _ in range(5):
                big_step()
            torch.cuda.synchronize()
            times, host = [], []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                big_step()
                big_step()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) / 2)
                t = time.perf_counter()
                big_step()
                host.append((time.perf_counter() - t) * 1e3)
                torch.cuda.synchronize()
            note(label, f"C {name} 4e6 edges step (ms)", statistics.median(times))
            note(label, f"C {name} 4e6 edges host to issue a step (ms)", statistics.median(host))
say("== A/B in one process, median of 5 alternations [each run]")
for name, per in results.items():
    o, n = statistics.median(per["old"]), statistics.median(per["new"])
    say(f"  {name:50s} old {o:8.3f}  new {n:8.3f}  new/old {n / o:.3f}   "
        f"old {[round(v, 2) for v in per['old']]} new {[round(v, 2) for v in per['new']]}")

configure("new")
say("\n== pieces of a new mini-batch graph, us per graph (host + GPU, synchronised), median of 3 passes over 30 graphs")


def per_graph(label, fn):
    runs = []
    for _ in range(3):
        items = [b.edge_index.clone() for b in batches[10:40]]
        sizes = [b.node_ids.numel() for b in batches[10:40]]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i, (ei, n) in enumerate(zip(items, sizes)):
            fn(ei, n, i)
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) / len(items) * 1e6)
    say(f"  {label:70s} {statistics.median(runs):8.1f}  {[round(r) for r in runs]}")


flow = "source_to_target"
per_graph("GraphTensor(src, dst) (validated: one sync)", lambda ei, n, i: ug.GraphTensor(ei[0], ei[1], n, n))
per_graph("GraphTensor + structure()", lambda ei, n, i: ug.GraphTensor(ei[0], ei[1], n, n).structure(dev))
per_graph("torch.sort of the [2E] keys (scale)", lambda ei, n, i: torch.cat([ei[1], ei[0] + n]).sort(stable=True))
per_graph("SAGE: layer_graph + structure", lambda ei, n, i: nn_graph.layer_graph(ei, flow, n, n).tensor.structure(dev))
per_graph("GCN: padded_looped_graph + structure", lambda ei, n, i: nn_graph.padded_looped_graph(ei, flow, n).tensor.structure(dev))
per_graph("GCN: fixed_size_unit_norm (graph, structure, normalisation)",
          lambda ei, n, i: gcn_conv.fixed_size_unit_norm(ei, flow, n, True, "sum", torch.float32))
per_graph("GAT: looped_graph + structure", lambda ei, n, i: nn_graph.looped_graph(ei, flow, n, n, n).graph.tensor.structure(dev))
feats = [task.x[b.node_ids] for b in batches[10:40]]
for name, ours, theirs in (("GCNConv", ugnn.GCNConv(task.x.size(1), 64), pygnn.GCNConv(task.x.size(1), 64)),
                           ("GATConv", ugnn.GATConv(task.x.size(1), 8, heads=8), pygnn.GATConv(task.x.size(1), 8, heads=8)),
                           ("SAGEConv", ugnn.SAGEConv(task.x.size(1), 64), pygnn.SAGEConv(task.x.size(1), 64))):
    ours, theirs = ours.to(dev), theirs.to(dev)
    for impl, layer in (("ours", ours), ("PyG", theirs)):
        with torch.no_grad():
            layer(feats[0], batches[10].edge_index)
            per_graph(f"{name} forward (no grad), {impl}", lambda ei, n, i: layer(feats[i], ei))
say("done")
