"""Probe 99: the neighbour-group one pass (``group_softmax`` + ``softmax_combine``) against GAT's
three forward operators on the power-law layer graph (2e5 nodes, 4e6 edges, 4 heads of 32), GPU
time by ``do_bench`` (median, ms). Probe 98's measured decision picked group_size=512, block_v=32,
block_e=4, block_f=32, 8 warps: 0.59 ms for the pass and 0.10 ms for the (first) combining kernel
against 0.46 ms for the three operators. Here: the three operators under their own decisions; the
one pass under a grid of schedules; each kernel of the best one under torch.profiler.

    python3 gpu_probe99.py OUT.txt
"""
import collections
import itertools
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
import triton_kernels  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher import attention  # noqa: E402
from pyg_ugrapher.attention import attention_ops  # noqa: E402
from pyg_ugrapher.ir import Expr, OpInfo  # noqa: E402
from pyg_ugrapher.ops import graph_arrays, layout_of, serialized  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
SCORE = OpInfo(Expr.apply("leaky_relu", Expr.input(0) + Expr.input(1), 0.2), None, operands=("src_v", "dst_v"))
for spec in reversed(layer_graphs()):
    loaded = spec.load(dev)
    n = loaded.num_nodes
    graph = ug.GraphTensor.from_edge_index(loaded.edge_index, n)
    structure = graph.structure(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, 4, 32, generator=gen, device=dev)
    columns = [torch.randn(n, 4, 1, generator=gen, device=dev) for _ in range(2)]
    ops = attention_ops(SCORE.serialize(), False)
    operands = [x] + columns
    layout = layout_of(serialized(ops.one_pass), operands)
    arrays = graph_arrays(structure)

    def one_pass(info):
        return triton_kernels.run_softmax(ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, info,
                                          (torch.float32, torch.float32))

    three = lambda: attention._three_passes(structure, ops, columns, x, [])  # noqa: E731
    want_out, want_norm = three()
    three_ms = do_bench(three, warmup=50, rep=300, return_mode="median")
    say(f"== {spec.name}: three operators {three_ms:.3f} ms")
    results = []
    grid = itertools.product((64, 128, 256, 512), ((2, 2), (4, 2), (8, 1), (16, 1), (4, 4), (8, 2)), (64, 128),
                             (2, 4))
    for group_size, (block_v, block_e), block_f, warps in grid:
        info = ug.ParallelInfo("group", group_size=group_size, block_v=block_v, block_e=block_e, block_f=block_f,
                               num_warps=warps)
        got_out, got_norm = one_pass(info)
        error = ((got_out - want_out).abs().max() / want_out.abs().max()).item()
        ms = do_bench(lambda: one_pass(info), warmup=25, rep=150, return_mode="median")
        results.append((ms, info.serialize(), error))
    results.sort()
    for ms, text, error in results[:12]:
        say(f"  one pass {ms:.3f} ms  {text}  (rel err {error:.1e})")
    say(f"  slowest: {results[-1][0]:.3f} ms {results[-1][1]}; worst error {max(r[2] for r in results):.1e}")
    best = ug.ParallelInfo.deserialize(results[0][1])
    for info in (best, ug.ParallelInfo.deserialize("vertex:block_v=4,block_e=2,block_f=64,num_warps=2")):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                one_pass(info)
            torch.cuda.synchronize()
        kernels = collections.defaultdict(float)
        for average in prof.key_averages():
            us = getattr(average, "self_device_time_total", 0) or getattr(average, "self_cuda_time_total", 0)
            if us > 0:
                kernels[average.key[:70]] += us / 5
        say(f"  kernels of {info.serialize()}: " + ", ".join(f"{k} {v:.1f} us" for k, v in kernels.items()))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            three()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(float)
    for average in prof.key_averages():
        us = getattr(average, "self_device_time_total", 0) or getattr(average, "self_cuda_time_total", 0)
        if us > 0:
            kernels[average.key[:70]] += us / 5
    say("  kernels of the three operators: " + ", ".join(f"{k} {v:.1f} us" for k, v in kernels.items()))
    del loaded, graph, structure, x, columns, operands, arrays
    torch.cuda.empty_cache()
say("done")
