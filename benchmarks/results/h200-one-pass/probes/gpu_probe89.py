"""Probe 89: probe 87 on the two-loop kernel (the row's largest logit first, then the sums), with
E timing the online kernel of 0a3b074 (``vertex_softmax_online.py``, a copy) under the same schedules.

The "three operators" variant patches ``attention._forward`` to always run ``_three_passes`` (the
forward of 47ca234). A. Route and schedule the forward's decision takes on the issue's layer
graphs (2e5 vertices, 4e6 edges, uniform and power-law; GATConv(128, 32, heads=4)). B. GPU time of
the forward's graph kernels per variant (torch.profiler, one forward). C. The layer step (forward +
backward + Adam), eager: host ms (no sync in the loop) and ms per step, 5 alternating rounds per
graph. D. 2-layer GAT mini-batch steps on fresh COLLAB batches (small graphs: three operators in both
variants; the new code only adds the one-pass decision's lookup), 3 rounds. E. On the uniform graph,
the one-pass kernel against the three operators' output kernel under the same vertex schedules
(``triton.testing.do_bench``, median ms), with the layer's operands.

    python3 gpu_probe89.py OUT.txt
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

    for label, forward in VARIANTS.items():
        attention._forward = forward
        for _ in range(3):
            layer_step()
    outputs = {}
    for label, forward in VARIANTS.items():
        attention._forward = forward
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

# -- E ------------------------------------------------------------------------------------------
import itertools  # noqa: E402

import triton  # noqa: E402
import triton_kernels  # noqa: E402
from pyg_ugrapher import GraphTensor, ParallelInfo  # noqa: E402
from pyg_ugrapher.ops import graph_arrays, layout_of, serialized  # noqa: E402
from triton_kernels.space import warps_for  # noqa: E402

spec = layer_graphs()[0]
loaded = spec.load(dev)
graph = GraphTensor.from_edge_index(loaded.edge_index, loaded.num_nodes)
arrays = graph_arrays(graph.structure(dev))
gen = torch.Generator(device=dev).manual_seed(0)
n = loaded.num_nodes
a_src, a_dst = (torch.randn(n, 4, 1, device=dev, generator=gen) for _ in range(2))
x = torch.randn(n, 4, 32, device=dev, generator=gen)
score = attention.OpInfo(attention.Expr.apply("leaky_relu", attention.Expr.input(0) + attention.Expr.input(1), 0.2),
                         None, operands=("src_v", "dst_v"))
ops = attention.attention_ops(score.serialize(), False)
operands = [x, a_src, a_dst]
layout = layout_of(serialized(ops.one_pass), operands)
_, normaliser = triton_kernels.run_softmax(ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands,
                                           ParallelInfo("vertex", block_v=4, block_e=4, block_f=32), (x.dtype,) * 2)
output_operands = [x, a_src, a_dst, normaliser]
output_layout = layout_of(serialized(ops.output), output_operands)
import importlib.util  # noqa: E402

from triton_kernels import dispatch  # noqa: E402

spec_online = importlib.util.spec_from_file_location(
    "vertex_softmax_online", os.path.join(os.path.dirname(os.path.abspath(__file__)), "vertex_softmax_online.py"))
online = importlib.util.module_from_spec(spec_online)
spec_online.loader.exec_module(online)
two_loops = dispatch.vertex_softmax


def online_pass(info):
    dispatch.vertex_softmax = online
    try:
        return triton_kernels.run_softmax(ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, info,
                                          (x.dtype,) * 2)
    finally:
        dispatch.vertex_softmax = two_loops


check = ParallelInfo("vertex", block_v=4, block_e=2, block_f=64, num_warps=1)
a = triton_kernels.run_softmax(ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, check,
                               (x.dtype,) * 2)
b = online_pass(check)
say("\nE. two loops against online: out differs by "
    f"{((a[0] - b[0]).abs().max() / b[0].abs().max()).item():.2e}, normaliser by {(a[1] - b[1]).abs().max().item():.2e}")
say("E. uniform-4M, ms (median of do_bench): schedule | two loops | online (0a3b074) | output kernel of the three "
    "operators")
rows = []
for block_v, block_e, block_f in itertools.product((4, 8, 16), (2, 4, 8), (32, 64, 128)):
    for warps in warps_for(block_v * block_e * block_f)[:2]:
        info = ParallelInfo("vertex", block_v=block_v, block_e=block_e, block_f=block_f, num_warps=warps)
        one = triton.testing.do_bench(lambda: triton_kernels.run_softmax(
            ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, info, (x.dtype,) * 2))
        first = triton.testing.do_bench(lambda: online_pass(info))
        three = triton.testing.do_bench(lambda: triton_kernels.run(ops.output, output_layout, arrays,
                                                                   output_operands, info))
        rows.append((one, first, three, info))
for one, first, three, info in sorted(rows, key=lambda r: r[0]):
    say(f"  {info}  {one:.3f}  {first:.3f}  {three:.3f}")
say(f"  best two loops {min(r[0] for r in rows):.3f}, best online {min(r[1] for r in rows):.3f}, "
    f"best output kernel {min(r[2] for r in rows):.3f}")
del graph, arrays, loaded, x, operands, output_operands
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
