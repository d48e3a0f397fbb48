"""The design space: every schedule the cost model may choose for an operator.

It is data, a list of :class:`~pyg_ugrapher.parallel.ParallelInfo`, filtered by what makes sense
for the operator: message creation walks one row per vertex-parallel program, feature tiles
never exceed the operator's width, tiles stay within the register budget, and ``num_warps`` keeps
between 8 and 32 tile elements per thread (the range that held every measured winner).
``num_stages`` is fixed at 1: the edge loops load through computed indices, which Triton does not
software-pipeline, so more stages change nothing.
"""

from __future__ import annotations

import functools
import itertools
from typing import List

import triton

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo

BLOCK_F = (8, 16, 32, 64, 128, 256)
VERTEX_BLOCK_V = (1, 2, 4, 8, 16, 32, 64)
VERTEX_BLOCK_E = (1, 2, 4, 8, 16, 32, 64)
EDGE_BLOCK_E = (32, 64, 128, 256, 512)
GROUP_SIZE = (32, 128, 512)
GROUP_BLOCK_V = (4, 16, 64)
GROUP_BLOCK_E = (1, 2, 4, 8, 16)
NUM_WARPS = (1, 2, 4, 8)
#: Largest tile (rows x edges x features) in the space: past it registers spill.
MAX_TILE = 1 << 13
#: Smallest tile of a multi-row program: below it a program has too few loads in flight.
MIN_TILE = 1 << 9
#: Largest tile of a gather that also writes an edge output (two live tiles per edge block).
PAIR_TILE = 1 << 11
#: Narrowest feature tile of a gather with an edge output (where the message is that wide).
PAIR_BLOCK_F = 128
#: Largest group of a gather with an edge output: its programs do twice the work per edge.
PAIR_GROUP = 128


def feature_tiles(message_width: int) -> List[int]:
    """Feature tile sizes for a message of ``message_width`` features."""
    top = triton.next_power_of_2(max(message_width, 1))
    tiles = [b for b in BLOCK_F if b <= top]
    return tiles or [top]


def warps_for(tile: int) -> List[int]:
    """Warp counts that give each thread between 8 and 32 elements of a ``tile``-element tile."""
    fitting = [w for w in NUM_WARPS if 8 <= tile / (32 * w) <= 32]
    return fitting or [NUM_WARPS[0] if tile < 256 else NUM_WARPS[-1]]


@functools.lru_cache(maxsize=None)
def pair_schedule(info: ParallelInfo, message_width: int, edge_group: int) -> ParallelInfo:
    """The schedule of a gather that also writes an edge output summing ``edge_group`` message
    features per value (``triton_kernels.run_with_edge_output``), derived from the gather's own.

    The feature tile grows to hold whole sums and at least :data:`PAIR_BLOCK_F` features (a
    tile inside a sum adds its partial sum atomically, which costs more than whole rows; narrower
    tiles re-read the edge list and recompute the edge function once per tile), then edges and
    rows per program shrink until the tile fits :data:`PAIR_TILE`, with four warps and groups of
    at most :data:`PAIR_GROUP` edges. Timed fused schedules on uniform and power-law graphs favour
    whole 128-feature tiles of 8 rows x 2 edges or 4 x 4.
    """
    if info.strategy not in ("vertex", "group"):
        return info
    top = triton.next_power_of_2(max(message_width, 1))
    whole = top if edge_group >= message_width else triton.next_power_of_2(edge_group)
    block_f = min(top, max(info.block_f, whole, PAIR_BLOCK_F))
    block_v, block_e = info.block_v, info.block_e
    while block_v * block_e * block_f > PAIR_TILE and (block_e > 2 or block_v > 1):
        if block_e > 2:
            block_e //= 2
        else:
            block_v //= 2
    tile = block_v * block_e * block_f
    knobs = dict(block_f=block_f, block_v=block_v, block_e=block_e, num_warps=max(1, min(8, tile // 512)))
    if info.strategy == "group":
        knobs["group_size"] = min(info.group_size, PAIR_GROUP)
    return info.with_knobs(**knobs)


#: Knobs that set a program's tile size, stepped also together with ``num_warps``.
TILE_KNOBS = ("block_v", "block_e", "block_f")


def neighbours(info: ParallelInfo, op: OpInfo, message_width: int) -> List[ParallelInfo]:
    """The valid schedules one knob step away from ``info``: one of its knobs (not ``num_stages``)
    doubled or halved, ``group_size`` four times larger or smaller, or a tile knob doubled or halved
    with ``num_warps``, which keeps the tile elements per thread. A measured search walks this way
    from the shortlist's winner; it may leave :func:`space`'s grid (a timed schedule needs no model
    features), but not its limits on tiles and warps, nor its single-row vertex-parallel message
    programs. (Tile size and warps are coupled: with single-knob steps alone, a search can stop at
    a schedule that halving rows and warps together improves on.)"""
    steps = []
    for knob, value in info.knobs.items():
        if knob == "num_stages":
            continue
        factor = 4 if knob == "group_size" else 2
        steps += [{knob: value * factor}, {knob: value // factor}]
        if knob in TILE_KNOBS:
            steps += [
                {knob: value * 2, "num_warps": info.num_warps * 2},
                {knob: value // 2, "num_warps": info.num_warps // 2},
            ]
    found: List[ParallelInfo] = []
    for step in steps:
        try:
            candidate = info.with_knobs(**step).validate_for(message_width)
        except ValueError:
            continue
        rows = candidate.block_v or 1
        limit = 2 * MAX_TILE if candidate.strategy == "edge" else MAX_TILE
        if (
            candidate.num_warps <= NUM_WARPS[-1]
            and rows * candidate.block_e * candidate.block_f <= limit
            and not (op.gather_op is None and candidate.strategy == "vertex" and rows > 1)
        ):
            found.append(candidate)
    return found


def space(op: OpInfo, message_width: int) -> List[ParallelInfo]:
    """Every valid schedule of ``op`` for messages of ``message_width`` features (the flat
    broadcast feature size; for ``dot``, the features summed times the outputs)."""
    found: List[ParallelInfo] = []
    message = op.gather_op is None
    for block_f in feature_tiles(message_width):
        for block_v, block_e in itertools.product(VERTEX_BLOCK_V, VERTEX_BLOCK_E):
            tile = block_v * block_e * block_f
            # Message creation walks rows one at a time: more rows per program only coarsen.
            if tile > MAX_TILE or (message and block_v > 1) or (block_v > 1 and tile < MIN_TILE):
                continue
            for warps in warps_for(tile):
                found.append(ParallelInfo("vertex", block_f=block_f, block_v=block_v, block_e=block_e, num_warps=warps))
        for block_e in EDGE_BLOCK_E:
            if block_e * block_f > 2 * MAX_TILE:
                continue
            for warps in warps_for(block_e * block_f):
                found.append(ParallelInfo("edge", block_f=block_f, block_e=block_e, num_warps=warps))
        for group, block_v, block_e in itertools.product(GROUP_SIZE, GROUP_BLOCK_V, GROUP_BLOCK_E):
            tile = block_v * block_e * block_f
            if tile > MAX_TILE or tile < min(MIN_TILE, block_v * block_f):
                continue
            for warps in warps_for(tile):
                found.append(
                    ParallelInfo(
                        "group", block_f=block_f, group_size=group, block_v=block_v, block_e=block_e, num_warps=warps
                    )
                )
    return found
