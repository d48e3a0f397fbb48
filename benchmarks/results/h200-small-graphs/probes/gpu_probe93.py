"""Probe 93: the edge-parallel gather's segmented scan over run starts (the final template) against
185ef20's scan over the destinations themselves, on sorted structures of large graphs.

The final template loads each edge's predecessor's destination as well and scans start flags; the
old one compared destinations, which is associative only on sorted rows. Both are generated from
the same IR, the old template text taken from ``git show 185ef20:triton_kernels/edge_parallel.py``
(copied below), and timed with ``do_bench`` (median, L2 flushed) under the same schedules:
``copy_u_sum`` and ``copy_u_mean`` at F = 128 on the uniform and power-law graphs of 4e6 edges
(2e5 vertices) and 1.6e7 edges (1e6 vertices). The outputs of both are compared.

    python3 gpu_probe93.py OUT.txt
"""
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
from pyg_ugrapher.datasets import power_law_graph, uniform_graph  # noqa: E402
from triton_kernels import dispatch, edge_parallel  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


OLD_TEMPLATE = """{header}

@triton.jit
def _combine_runs(key_a, val_a, key_b, val_b):
    # Associative for sorted keys: a run restarts wherever the key changes.
    return key_b, tl.where(key_a == key_b, {combine}, val_b)


@triton.jit(do_not_specialize=["num_edges"])
def {name}(rows_ptr, col_ptr, eid_ptr, rowptr_ptr, {operand_params}out_ptr, num_edges, F, C,
           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, GROUPED: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    block_start = tl.program_id(0) * BLOCK_E
    block_end = tl.minimum(block_start + BLOCK_E, num_edges)
    e = block_start + tl.arange(0, BLOCK_E)
    emask = e < block_end
    v = tl.load(rows_ptr + e, mask=emask, other=-1)
{edge_loads}
{message}
    msg = tl.where(emask[:, None], msg, {identity})
    _, res = tl.associative_scan((tl.broadcast_to(v[:, None], [BLOCK_E, BLOCK_F]), msg), 0, _combine_runs)
    next_v = tl.load(rows_ptr + e + 1, mask=e + 1 < block_end, other=-1)
    run_end = emask & (next_v != v)
    row_start = tl.load(rowptr_ptr + v, mask=run_end, other=0)
    row_end = tl.load(rowptr_ptr + v + 1, mask=run_end, other=0)
    degree = row_end - row_start
{finalize}
    owned = (row_start >= block_start) & (row_end <= block_end)
    dest = out_ptr + {out_row}[:, None] * F + f[None, :]
    res = res.to(out_ptr.dtype.element_ty)
    tl.store(dest, res, mask=(run_end & owned)[:, None] & fmask[None, :])
    {atomic_fn}(dest, res, mask=(run_end & (owned == 0))[:, None] & fmask[None, :])
"""
NEW_TEMPLATE = edge_parallel.TEMPLATE
dev = torch.device("cuda")
SCHEDULES = [ug.ParallelInfo("edge", block_f=64, block_e=128, num_warps=8),
             ug.ParallelInfo("edge", block_f=32, block_e=64, num_warps=4),
             ug.ParallelInfo("edge", block_f=128, block_e=32, num_warps=4)]
say("== copy_u_* edge-parallel, F = 128, sorted structures, ms (do_bench): old scan / new scan")
for name, n, e, make in (("uniform 4e6", 200_000, 4_000_000, uniform_graph),
                         ("power-law 4e6", 200_000, 4_000_000, power_law_graph),
                         ("uniform 1.6e7", 1_000_000, 16_000_000, uniform_graph),
                         ("power-law 1.6e7", 1_000_000, 16_000_000, power_law_graph)):
    graph = ug.GraphTensor.from_edge_index(make(n, e, seed=0).to(dev), n)
    x = torch.randn(n, 128, device=dev)
    for op in ("copy_u_sum", "copy_u_mean"):
        cells = []
        for info in SCHEDULES:
            results, times = [], []
            for template in (OLD_TEMPLATE, NEW_TEMPLATE):
                edge_parallel.TEMPLATE = template
                dispatch._kernel.cache_clear()
                results.append(ug.compute(graph, op, x, parallel_info=info))
                times.append(triton.testing.do_bench(lambda: ug.compute(graph, op, x, parallel_info=info),
                                                     warmup=25, rep=100))
            diff = ((results[0] - results[1]).abs().max() / results[0].abs().max()).item()
            cells.append(f"{info.block_e}x{info.block_f}/{info.num_warps}w {times[0]:.3f} / {times[1]:.3f}"
                         f" (diff {diff:.0e})")
        say(f"  {name} {op}: " + "; ".join(cells))
    del graph, x
    torch.cuda.empty_cache()
edge_parallel.TEMPLATE = NEW_TEMPLATE
dispatch._kernel.cache_clear()
say("done")
