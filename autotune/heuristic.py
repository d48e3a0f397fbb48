"""The schedule rule used when no trained cost model is available.

Rules, in order (``stats.rows`` are the in-degrees of the rows an operator reduces into):

1. Triton's CPU interpreter pays per program and per loop step, not per element: the fewest,
   largest programs win: vertex-parallel with 64 rows side by side for gathers (its segmented scan
   makes edge-parallel slow there), edge-parallel with the largest tile for message creation.
2. Message creation: vertex-parallel when a destination operand is read (it is loaded once per
   row), edge-parallel otherwise (contiguous output in the user's order).
3. Gather on a skewed graph (the largest row holds over 32x the mean degree and at least 256
   edges): neighbour groups of 128 edges, so hubs are split into balanced pieces.
4. Gather on a very sparse graph (mean degree under 4): edge-parallel, since most vertex-parallel
   programs would idle on a tiny row.
5. Otherwise vertex-parallel with 4 rows per program and an edge chunk near the mean degree.

Feature tiles cover up to 64 features (128 for the interpreter).
"""
from __future__ import annotations

import triton

from pyg_ugrapher.graph import GraphStats
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo


def heuristic(stats: GraphStats, op: OpInfo, width: int, on_gpu: bool) -> ParallelInfo:
    """A reasonable schedule for ``op`` with ``width`` message features on a graph of ``stats``."""
    tile_f = triton.next_power_of_2(max(width, 1))
    if not on_gpu:
        block_f = min(tile_f, 64)
        if op.gather_op is None:
            return ParallelInfo("edge", block_f=block_f, block_e=min(1024, (1 << 14) // block_f))
        return ParallelInfo("vertex", block_f=block_f, block_v=64, block_e=max(1, (1 << 8) // block_f))
    block_f = min(tile_f, 64)
    if op.gather_op is None:
        if "dst_v" in op.inputs:
            return ParallelInfo("vertex", block_f=block_f, block_v=4, block_e=16)
        return ParallelInfo("edge", block_f=block_f, block_e=64)
    rows = stats.rows
    if rows.max >= 256 and rows.max > 32 * max(rows.mean, 1.0):
        return ParallelInfo("group", block_f=block_f, group_size=128, block_e=32)
    if rows.mean < 4:
        return ParallelInfo("edge", block_f=block_f, block_e=128)
    block_e = 16 if rows.mean < 24 else 32
    return ParallelInfo("vertex", block_f=block_f, block_v=4, block_e=block_e)
