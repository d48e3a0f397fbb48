"""Probe 82: where a GCN step on a new mini-batch graph spends its extra time.

For GCN and GIN (train_e2e's models, hidden 64) in one process: the stack of every host sync in
one new-graph step, then forward / backward / optimizer phases timed with a sync after each, on
fresh COLLAB batches and on one batch every step (medians of 40 steps, 2 rounds), and for GCN the
pieces of its first layer's forward on a new graph, each timed with a sync after it.

    python3 gpu_probe82.py OUT.txt
"""
import os
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher.nn import _graph, gcn_conv  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731


def make(model_name):
    torch.manual_seed(0)
    m = te.build_model(model_name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return m, opt


def sync_ms(t):
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


for model_name in ("gcn", "gin"):
    say(f"\n######## {model_name}")
    m, opt = make(model_name)
    for b in fresh(batches[:5]):
        opt.zero_grad()
        F.cross_entropy(m(task.x[b.node_ids], b.edge_index)[:b.num_seeds],
                        task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    torch.cuda.synchronize()
    stacks = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            stacks.append("".join(traceback.format_stack(limit=14)[:-2]))

    b = fresh(batches[10:11])[0]
    x_b, y_b = task.x[b.node_ids], task.y[b.node_ids[:b.num_seeds]]
    torch.cuda.synchronize()
    saved = warnings.showwarning
    warnings.showwarning = show
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        opt.zero_grad()
        F.cross_entropy(m(x_b, b.edge_index)[:b.num_seeds], y_b).backward()
        opt.step()
        torch.cuda.set_sync_debug_mode(0)
    warnings.showwarning = saved
    say(f"  {len(stacks)} host syncs in one new-graph step")
    for s in stacks:
        say("  ---- sync at\n" + "\n".join("    " + line for line in s.splitlines()[-16:]))

    for rnd in range(2):
        for label, items in (("new", fresh(batches[5:45])), ("same", fresh(batches[:1]) * 40)):
            phases = {"forward": [], "backward": [], "optimizer": []}
            for b in items:
                x_b, y_b = task.x[b.node_ids], task.y[b.node_ids[:b.num_seeds]]
                torch.cuda.synchronize()
                t = time.perf_counter()
                opt.zero_grad()
                loss = F.cross_entropy(m(x_b, b.edge_index)[:b.num_seeds], y_b)
                phases["forward"].append(sync_ms(t))
                t = time.perf_counter()
                loss.backward()
                phases["backward"].append(sync_ms(t))
                t = time.perf_counter()
                opt.step()
                phases["optimizer"].append(sync_ms(t))
            say(f"  round {rnd} {label:4s} " + "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in phases.items()))

    if model_name == "gcn":
        conv = m.first
        pieces = {k: [] for k in ("index_select x", "fixed_size_graph", "structure", "unit_norm", "lin",
                                  "u_mul_e_sum", "bias", "whole first layer, new graph", "same graph")}
        for b in fresh(batches[5:45]):
            n = b.node_ids.numel()
            torch.cuda.synchronize()
            t = time.perf_counter()
            x_b = task.x[b.node_ids]
            pieces["index_select x"].append(sync_ms(t))
            t = time.perf_counter()
            g = gcn_conv.fixed_size_graph(b.edge_index, conv.flow, n, True, "sum")
            pieces["fixed_size_graph"].append(sync_ms(t))
            t = time.perf_counter()
            g.tensor.structure(dev)
            pieces["structure"].append(sync_ms(t))
            t = time.perf_counter()
            w = gcn_conv.fixed_size_unit_norm(b.edge_index, conv.flow, n, True, "sum", x_b.dtype)
            pieces["unit_norm"].append(sync_ms(t))
            t = time.perf_counter()
            h = conv.lin(x_b)
            pieces["lin"].append(sync_ms(t))
            t = time.perf_counter()
            o = _graph.run(g, _graph.named, ("u_mul_e_sum",), [h, w])
            pieces["u_mul_e_sum"].append(sync_ms(t))
            t = time.perf_counter()
            gcn_conv.add_bias(o, conv.bias)
            pieces["bias"].append(sync_ms(t))
            e2 = b.edge_index.clone()
            t = time.perf_counter()
            conv(x_b, e2)
            pieces["whole first layer, new graph"].append(sync_ms(t))
            t = time.perf_counter()
            conv(x_b, e2)
            pieces["same graph"].append(sync_ms(t))
        say("  first GCN layer's forward on new graphs, ms with a sync after each piece (median of 40):")
        for k, v in pieces.items():
            say(f"    {k:32s} {statistics.median(v):.3f}")
say("done")
