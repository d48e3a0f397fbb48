"""The design space: every schedule the cost model may choose for an operator.

It is data, a list of :class:`~pyg_ugrapher.parallel.ParallelInfo`, filtered by what makes sense
for the operator: message creation has no ``group`` form, feature tiles never exceed the
operator's width, and ``num_warps`` keeps between 4 and 128 tile elements per thread.
"""
from __future__ import annotations

import itertools
from typing import List

import triton

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo

BLOCK_F = (8, 16, 32, 64, 128, 256)
VERTEX_BLOCK_V = (1, 2, 4, 8, 16, 32)
VERTEX_BLOCK_E = (4, 8, 16, 32, 64)
#: Largest vertex tile (rows x edges x features) in the space: past it registers spill.
VERTEX_MAX_TILE = 1 << 13
EDGE_BLOCK_E = (32, 64, 128, 256, 512)
GROUP_SIZE = (32, 128, 512)
GROUP_BLOCK_E = (16, 32, 64)
NUM_WARPS = (1, 2, 4, 8)
NUM_STAGES = (1, 2)


def feature_tiles(message_width: int) -> List[int]:
    """Feature tile sizes for a message of ``message_width`` features."""
    top = triton.next_power_of_2(max(message_width, 1))
    tiles = [b for b in BLOCK_F if b <= top]
    return tiles or [top]


def warps_for(tile: int) -> List[int]:
    """Warp counts that give each thread between 4 and 128 elements of a ``tile``-element tile."""
    fitting = [w for w in NUM_WARPS if 4 <= tile / (32 * w) <= 128]
    return fitting or [NUM_WARPS[0]]


def space(op: OpInfo, message_width: int) -> List[ParallelInfo]:
    """Every valid schedule of ``op`` for messages of ``message_width`` features (the flat
    broadcast feature size; for ``dot``, the features summed times the outputs)."""
    found: List[ParallelInfo] = []
    for block_f in feature_tiles(message_width):
        for block_v, block_e, stages in itertools.product(VERTEX_BLOCK_V, VERTEX_BLOCK_E, NUM_STAGES):
            tile = block_v * block_e * block_f
            if tile > VERTEX_MAX_TILE or (block_v > 1 and op.gather_op is None):
                continue
            for warps in warps_for(tile):
                found.append(ParallelInfo("vertex", block_f=block_f, block_v=block_v, block_e=block_e,
                                          num_warps=warps, num_stages=stages))
        for block_e in EDGE_BLOCK_E:
            if block_e * block_f > 1 << 14:
                continue
            for warps in warps_for(block_e * block_f):
                found.append(ParallelInfo("edge", block_f=block_f, block_e=block_e, num_warps=warps))
        if op.gather_op is None:
            continue
        for group, block_e, stages in itertools.product(GROUP_SIZE, GROUP_BLOCK_E, NUM_STAGES):
            if block_e > group:
                continue
            for warps in warps_for(block_e * block_f):
                found.append(ParallelInfo("group", block_f=block_f, group_size=group, block_e=block_e,
                                          num_warps=warps, num_stages=stages))
    return found
