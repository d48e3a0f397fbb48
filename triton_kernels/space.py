"""The design space: every schedule the cost model may choose for an operator.

It is data, a list of :class:`~pyg_ugrapher.parallel.ParallelInfo`, filtered by what makes sense
for the operator: message creation has no ``group`` form, feature tiles never exceed the
operator's width, tiles stay within the register budget, and ``num_warps`` keeps between 8 and 32
tile elements per thread (the range where the H100 probe found every winner). ``num_stages`` is
fixed at 1: the edge loops load through computed indices, which Triton does not software-pipeline,
and the probe measured no difference for 2.
"""
from __future__ import annotations

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


def feature_tiles(message_width: int) -> List[int]:
    """Feature tile sizes for a message of ``message_width`` features."""
    top = triton.next_power_of_2(max(message_width, 1))
    tiles = [b for b in BLOCK_F if b <= top]
    return tiles or [top]


def warps_for(tile: int) -> List[int]:
    """Warp counts that give each thread between 8 and 32 elements of a ``tile``-element tile."""
    fitting = [w for w in NUM_WARPS if 8 <= tile / (32 * w) <= 32]
    return fitting or [NUM_WARPS[0] if tile < 256 else NUM_WARPS[-1]]


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
                found.append(ParallelInfo("vertex", block_f=block_f, block_v=block_v, block_e=block_e,
                                          num_warps=warps))
        for block_e in EDGE_BLOCK_E:
            if block_e * block_f > 2 * MAX_TILE:
                continue
            for warps in warps_for(block_e * block_f):
                found.append(ParallelInfo("edge", block_f=block_f, block_e=block_e, num_warps=warps))
        if message:
            continue
        for group, block_v, block_e in itertools.product(GROUP_SIZE, GROUP_BLOCK_V, GROUP_BLOCK_E):
            tile = block_v * block_e * block_f
            if tile > MAX_TILE or tile < min(MIN_TILE, block_v * block_f):
                continue
            for warps in warps_for(tile):
                found.append(ParallelInfo("group", block_f=block_f, group_size=group, block_v=block_v,
                                          block_e=block_e, num_warps=warps))
    return found
