"""The schedule rules used when no trained cost model is available, and for small graphs.

:func:`small_graph_schedule` decides from the operator and width alone, for GPU graphs of up to
:data:`autotune.selection.SMALL_GRAPH_EDGES` edges: edge-parallel, 32 edges of 32 features per
program for gathers (64 edges of up to 64 features for message creation). It needs no statistics
(a device sync and ~30 small operations per new graph) and no chunk table, and edge-parallel work
is balanced whatever the degrees. Of the edge-parallel schedules of the design space, timed on
small graphs with their edges in the user's order (real citation graphs, batches of small graphs,
a padded mini-batch, uniform and power-law graphs; three gathers at 32 to 128 features), the
gathers' rule is within a few percent of the best in the geometric mean, and half the time of
128-edge programs; the time it loses to the vertex- and group-parallel schedules, which need the
edges sorted and a graph's statistics, is less than a sort and a model scoring would cost a new
graph on the host.

:func:`small_graph_softmax_schedule` is the one pass of a softmax aggregation on such graphs
(vertex-parallel over the rows, grouped once per structure): one kernel where the edge-parallel
rule takes three operators.

:func:`heuristic`'s rules, in order (``stats.rows`` are the in-degrees of the rows an operator
reduces into); the GPU rules come from sweeps of the design space (``benchmarks/``):

1. Triton's CPU interpreter pays per program and per loop step, not per element: the fewest,
   largest programs win: vertex-parallel with 64 rows side by side for gathers (its segmented scan
   makes edge-parallel slow there), edge-parallel with the largest tile for message creation.
2. Message creation of wide messages (32 features or more) that read a destination operand: it
   is loaded once per row in CSR order, by vertex-parallel programs, or where a row is a hub by
   neighbour groups of 128 edges, 16 side by side (one program per row serialises a hub, and
   edge-parallel programs load the destination row once per edge). Otherwise edge-parallel
   (contiguous output in the user's order; for per-head scalar scores such as GAT's the
   CSR-ordered forms scatter their narrow writes).
3. Gather on a skewed graph (the largest row holds over 8x the mean degree): neighbour groups of
   512 edges, 16 chunks side by side, 4 edges of each per step. Hubs split into balanced pieces
   and the many tiny rows share programs (the chunk table is ordered by length).
4. Otherwise vertex-parallel, 16 rows side by side, 4 edges of each per step.

Feature tiles cover up to 64 features; warps give each thread about 16 tile elements.

A partial schedule that names its strategy (``ParallelInfo("group")``) gets, without a model, the
rules' schedule of that strategy: rule 1's largest programs in the interpreter (but edge-parallel
gathers of at most 64 edges per program, since the interpreter steps through their scan edge by
edge); on a GPU the programs of rules 2-4 (gathers edge-parallel as :func:`small_graph_schedule`).
"""

from __future__ import annotations

import functools
from typing import Optional

import triton

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import GraphStats


def _warps(tile: int) -> int:
    return max(1, min(8, tile // (32 * 16)))


@functools.lru_cache(maxsize=None)
def small_graph_schedule(op: OpInfo, width: int) -> ParallelInfo:
    """The schedule of ``op`` with ``width`` message features on a small GPU graph."""
    tile_f = triton.next_power_of_2(max(width, 1))
    if op.gather_op is None:
        block_f = min(tile_f, 64)
        return ParallelInfo("edge", block_f=block_f, block_e=64, num_warps=_warps(64 * block_f))
    # Short programs of 32 edges: rows in the user's order are scattered, and an edge block adds
    # into as many rows as it holds edges, by atomics that more programs spread over the GPU.
    block_f = min(tile_f, 32)
    # Eight tile elements per thread, as the design space's edge schedules of this tile have.
    return ParallelInfo("edge", block_f=block_f, block_e=32, num_warps=max(1, 32 * block_f // 256))


#: Rows of more edges make :func:`small_graph_softmax_schedule`'s pass slower than the three
#: edge-parallel operators (a row is one program's work); a graph known to have one runs those.
SOFTMAX_ONE_PASS_MAX_ROW = 1 << 12


def small_graph_softmax_schedule(width: int) -> ParallelInfo:
    """The schedule of a softmax aggregation's one pass (GAT's forward,
    :mod:`triton_kernels.vertex_softmax`) with ``width`` message features on a small GPU graph:
    vertex-parallel, one row per program, 32 of its edges per step. Under the edge-parallel
    :func:`small_graph_schedule` the same forward takes three operators (a gather-max, a gather-sum
    and the output gather), each with its decision, launch and zeroed output, plus three torch
    operations for the log-normaliser: on a small graph, where the host sets the pace, that costs
    more than the row grouping this pass reads (one sort per structure, kept with it). One row per
    program keeps a hub's edges 32 to a step rather than 4 (the heuristic's vertex rule): the
    rows are not split, so a hub is one program's work, and a graph with a row of more than
    :data:`SOFTMAX_ONE_PASS_MAX_ROW` edges runs the three operators instead."""
    block_f = min(triton.next_power_of_2(max(width, 1)), 64)
    return ParallelInfo("vertex", block_f=block_f, block_v=1, block_e=32, num_warps=_warps(32 * block_f))


def heuristic(stats: GraphStats, op: OpInfo, width: int, on_gpu: bool, strategy: Optional[str] = None) -> ParallelInfo:
    """A reasonable schedule for ``op`` with ``width`` message features on a graph of ``stats``;
    with ``strategy``, the rules' schedule of that strategy."""
    tile_f = triton.next_power_of_2(max(width, 1))
    block_f, narrow_f = min(tile_f, 64), min(tile_f, 32)
    message = op.gather_op is None
    if not on_gpu:
        rows = 1 if message else 64  # message creation walks one row per vertex-parallel program
        # The interpreter runs an edge-parallel gather's segmented scan one edge at a time: past the
        # graph's edges a larger block only adds steps.
        edges = min(1024, (1 << 14) // block_f) if message else min(64, triton.next_power_of_2(max(stats.num_edges, 1)))
        rules = {
            "edge": ParallelInfo("edge", block_f=block_f, block_e=edges, num_warps=4),
            "vertex": ParallelInfo(
                "vertex", block_f=block_f, block_v=rows, block_e=min(1024, (1 << 14) // (rows * block_f)), num_warps=4
            ),
            "group": ParallelInfo(
                "group", block_f=block_f, group_size=512, block_v=64, block_e=max(1, (1 << 8) // block_f), num_warps=4
            ),
        }
        return rules[strategy or ("edge" if message else "vertex")]
    rows = stats.rows
    skewed = rows.max > 8 * max(rows.mean, 1.0)
    if message:
        rules = {
            "edge": ParallelInfo("edge", block_f=block_f, block_e=64, num_warps=_warps(64 * block_f)),
            "vertex": ParallelInfo("vertex", block_f=block_f, block_v=1, block_e=16, num_warps=4),
            "group": ParallelInfo("group", block_f=narrow_f, group_size=128, block_v=16, block_e=2, num_warps=4),
        }
        wide_dst = "dst_v" in op.inputs and width >= 32
        return rules[strategy or (("group" if skewed else "vertex") if wide_dst else "edge")]
    rules = {
        "edge": small_graph_schedule(op, width),
        "vertex": ParallelInfo("vertex", block_f=block_f, block_v=16, block_e=4, num_warps=_warps(64 * block_f)),
        "group": ParallelInfo(
            "group", block_f=narrow_f, group_size=512, block_v=16, block_e=4, num_warps=_warps(64 * narrow_f)
        ),
    }
    return rules[strategy or ("group" if skewed else "vertex")]
