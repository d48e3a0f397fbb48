"""The schedule rules used when no trained cost model is available, and for small graphs.

:func:`small_graph_schedule` decides from the operator and width alone, for GPU graphs of up to
:data:`autotune.selection.SMALL_GRAPH_EDGES` edges: edge-parallel, 128 edges of 64 features per
program for gathers (64 edges for message creation). It needs no statistics (a device sync and
~30 small operations per new graph) and no chunk table, and edge-parallel work is balanced
whatever the degrees. On the H100 data's 1620 cases of graphs of up to 2^18 edges, its strategy
and tiles (with four warps for gathers, measured in every case) came within 1.72x of the best
measured schedule (geometric mean; the best static schedule per width 1.60x, the rules below
2.06x), a median of ~13 us per call on kernels that take 10-70 us: less than
statistics and a model scoring cost a new graph on the host (1-3 ms).

:func:`heuristic`'s rules, in order (``stats.rows`` are the in-degrees of the rows an operator reduces into); the GPU
rules come from sweeps on an H100 (``benchmarks/``):

1. Triton's CPU interpreter pays per program and per loop step, not per element: the fewest,
   largest programs win: vertex-parallel with 64 rows side by side for gathers (its segmented scan
   makes edge-parallel slow there), edge-parallel with the largest tile for message creation.
2. Message creation of wide messages (32 features or more) that read a destination operand: it
   is loaded once per row in CSR order, by vertex-parallel programs, or where a row is a hub by
   neighbour groups of 128 edges, 16 side by side (one program per row serialises a hub: on the
   power-law graph of 1.6e7 edges the vertex form took 2.8x / 4.2x the neighbour groups' time for
   ``u_add_v`` at F = 128 / ``u_dot_v`` over 4 heads of 32, and edge-parallel 1.22x / 1.16x,
   ``benchmarks/results/h100-group-message``). Otherwise edge-parallel (contiguous output in the
   user's order; for GAT's per-head scalar scores the CSR-ordered forms were 4x slower).
3. Gather on a skewed graph (the largest row holds over 8x the mean degree): neighbour groups of
   512 edges, 16 chunks side by side, 4 edges of each per step. Hubs split into balanced pieces
   and the many tiny rows share programs (the chunk table is ordered by length).
4. Otherwise vertex-parallel, 16 rows side by side, 4 edges of each per step.

Feature tiles cover up to 64 features; warps give each thread about 16 tile elements.
"""
from __future__ import annotations

import functools

import triton

from pyg_ugrapher.graph import GraphStats
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo


def _warps(tile: int) -> int:
    return max(1, min(8, tile // (32 * 16)))


@functools.lru_cache(maxsize=None)
def small_graph_schedule(op: OpInfo, width: int) -> ParallelInfo:
    """The schedule of ``op`` with ``width`` message features on a small GPU graph."""
    block_f = min(triton.next_power_of_2(max(width, 1)), 64)
    if op.gather_op is None:
        return ParallelInfo("edge", block_f=block_f, block_e=64, num_warps=_warps(64 * block_f))
    return ParallelInfo("edge", block_f=block_f, block_e=128, num_warps=_warps(128 * block_f))


def heuristic(stats: GraphStats, op: OpInfo, width: int, on_gpu: bool) -> ParallelInfo:
    """A reasonable schedule for ``op`` with ``width`` message features on a graph of ``stats``."""
    tile_f = triton.next_power_of_2(max(width, 1))
    if not on_gpu:
        block_f = min(tile_f, 64)
        if op.gather_op is None:
            return ParallelInfo("edge", block_f=block_f, block_e=min(1024, (1 << 14) // block_f))
        return ParallelInfo("vertex", block_f=block_f, block_v=64, block_e=max(1, (1 << 8) // block_f))
    rows = stats.rows
    skewed = rows.max > 8 * max(rows.mean, 1.0)
    if op.gather_op is None:
        block_f = min(tile_f, 64)
        if "dst_v" in op.inputs and width >= 32:
            if skewed:
                return ParallelInfo("group", block_f=32, group_size=128, block_v=16, block_e=2, num_warps=4)
            return ParallelInfo("vertex", block_f=block_f, block_v=1, block_e=16, num_warps=4)
        return ParallelInfo("edge", block_f=block_f, block_e=64, num_warps=_warps(64 * block_f))
    if skewed:
        block_f = min(tile_f, 32)
        return ParallelInfo("group", block_f=block_f, group_size=512, block_v=16, block_e=4,
                            num_warps=_warps(64 * block_f))
    block_f = min(tile_f, 64)
    return ParallelInfo("vertex", block_f=block_f, block_v=16, block_e=4, num_warps=_warps(64 * block_f))
