"""Probe 85: GAT's forward in one pass (``triton_kernels.vertex_softmax``) against the three
forward operators, switched in one process.

The "three operators" variant patches ``attention._forward`` to always run ``_three_passes`` (the
forward of 47ca234). A. Route and schedule the forward's decision takes on the issue's layer
graphs (2e5 vertices, 4e6 edges, uniform and power-law; GATConv(128, 32, heads=4)). B. GPU time of
the forward's graph kernels per variant (torch.profiler, one forward). C. The layer step (forward +
backward + Adam), eager: host ms (no sync in the loop) and ms per step, 5 alternating rounds per
graph. D. 2-layer GAT mini-batch steps on fresh COLLAB batches (small graphs: three operators in both
variants; the new code only adds the one-pass decision's lookup), 3 rounds.

    python3 gpu_probe85.py OUT.txt
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher import attention  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


one_pass = attention._forward


def three_operators(structure, score, scores, x, keep, graph=None):
    ops = attention.attention_ops(score, keep is not None)
    return attention._three_passes(structure, ops, [attention._column(t) for t in scores], x,
                                   [] if keep is None else [attention._column(keep)], graph)


VARIANTS = {"one pass (now)": one_pass, "three operators (before)": three_operators}
dev = torch.device("cuda")
say(torch.cuda.get_device_name(), torch.__version__)

for spec in layer_graphs():
    loaded = spec.load(dev)
    edge_index, n = loaded.edge_index, loaded.num_nodes
    torch.manual_seed(0)
    x = torch.randn(n, 128, device=dev)
    conv = ugnn.GATConv(128, 32, heads=4).to(dev)
    opt = torch.optim.Adam(conv.parameters(), lr=1e-3)

    def layer_step():
        opt.zero_grad()
        conv(x, edge_index).square().mean().backward()
        opt.step()

    outputs = {}
    for label, forward in VARIANTS.items():
        attention._forward = forward
        for _ in range(3):
            layer_step()
        with torch.no_grad():
            outputs[label] = conv(x, edge_index)
    attention._forward = one_pass
    a, b = outputs.values()
    say(f"\n=== {spec.name}: outputs of the two variants differ by {((a - b).abs().max() / b.abs().max()).item():.2e} "
        "(relative to the largest)")
    # A. the route
    calls = []
    from pyg_ugrapher import ops as ug_ops
    with ug_ops.observe(calls.append), torch.no_grad():
        conv(x, edge_index)
    say("A. forward operators observed: " + "; ".join(f"{c.op.name[:60]} -> {c.parallel_info}" for c in calls))
    # B. GPU time of the forward's kernels
    for label, forward in VARIANTS.items():
        attention._forward = forward
        with torch.no_grad():
            conv(x, edge_index)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    conv(x, edge_index)
                torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 5 / 1e3) for e in prof.key_averages()
                if e.device_time_total > 0 and ("vertex" in e.key or "edge" in e.key or "neighbor" in e.key)]
        say(f"B. {label}: graph kernels of one forward, ms: "
            + "; ".join(f"{k[:70]} {t:.3f}" for k, t in sorted(rows, key=lambda r: -r[1]))
            + f"; total {sum(t for _, t in rows):.3f}")
    attention._forward = one_pass
    # C. the layer step
    host = {k: [] for k in VARIANTS}
    step = {k: [] for k in VARIANTS}
    for rnd in range(5):
        for label, forward in (VARIANTS.items() if rnd % 2 == 0 else reversed(VARIANTS.items())):
            attention._forward = forward
            for _ in range(5):
                layer_step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                layer_step()
            host[label].append((time.perf_counter() - t) / 30 * 1e3)
            torch.cuda.synchronize()
            step[label].append((time.perf_counter() - t) / 30 * 1e3)
    attention._forward = one_pass
    say("C. GAT layer step, ms: host (loop without sync) / step, median [rounds]")
    for label in VARIANTS:
        say(f"  {label:26s} host {statistics.median(host[label]):.3f} [{', '.join(f'{t:.2f}' for t in host[label])}]"
            f"  step {statistics.median(step[label]):.3f} [{', '.join(f'{t:.2f}' for t in step[label])}]")
    del conv, opt, x, loaded, edge_index
    torch.cuda.empty_cache()

# -- D ------------------------------------------------------------------------------------------
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
torch.manual_seed(0)
model = te.build_model("gat", ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
opt_b = torch.optim.Adam(model.parameters(), lr=1e-3)


def batch_step(b):
    opt_b.zero_grad()
    o = model(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
    F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
    opt_b.step()


times = {k: [] for k in VARIANTS}
for rnd in range(3):
    for label, forward in VARIANTS.items():
        attention._forward = forward
        items = [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches]
        for b in items[:5]:
            batch_step(b)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in items[5:]:
            batch_step(b)
        torch.cuda.synchronize()
        times[label].append((time.perf_counter() - t) / 40 * 1e3)
attention._forward = one_pass
say("\nD. 2-layer GAT steps on fresh COLLAB batches, ms per step, median [rounds]")
for label, v in times.items():
    say(f"  {label:26s} {statistics.median(v):.3f}  [{', '.join(f'{t:.2f}' for t in v)}]")
say("done")
