"""Scores of rows under an ensemble of binary decision trees (the cost model), in one kernel.

Runtime selection scores every schedule of the design space (468-814 rows) under the cost model's
trees (400, up to 19 deep). XGBoost walks them on the host, over the millisecond a selection may
take. Here each program walks ``BLOCK_R`` rows through ``BLOCK_T`` trees side by side, one level per
step, and sums the leaves it lands on.

The trees are flat arrays over all their nodes (:class:`autotune.forest.Forest`): a split sends a
row left when its feature is below the threshold, or is missing (NaN) and the split's default is
left; a leaf is its own child, so a row that reached one stays there for the remaining steps.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .codegen import interpreting
from .launch import cdiv, jit_kernel

#: (row, tree) pairs per program.
LANES = 1024
#: Most trees one program walks side by side; more are walked a block after another. The shipped
#: 400 trees fit one block, which is faster than two smaller ones.
MAX_BLOCK_T = 512
#: Fewest trees a program walks side by side: a forest of fewer walks dead lanes. Compiled for an
#: H200 by Triton 3.6, blocks of 2 and 4 trees summed wrong leaves, blocks of 1 and of 8 or more
#: the right ones (``tests/autotune/test_forest.py`` scores forests of 1 to 9 trees on the GPU).
MIN_BLOCK_T = 8


def tree_ensemble_kernel(
    x_ptr,
    feature_ptr,
    threshold_ptr,
    left_ptr,
    right_ptr,
    default_left_ptr,
    value_ptr,
    roots_ptr,
    out_ptr,
    num_rows,
    num_trees,
    num_nodes,
    num_features,
    depth,
    base,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_live = rows < num_rows
    row_start = rows.to(tl.int64) * num_features
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    for first in range(0, num_trees, BLOCK_T):
        trees = first + tl.arange(0, BLOCK_T)
        tree_live = trees < num_trees
        live = row_live[:, None] & tree_live[None, :]
        root = tl.load(roots_ptr + trees, mask=tree_live, other=0)
        node = tl.broadcast_to(root[None, :], (BLOCK_R, BLOCK_T))
        for _ in range(depth):
            # Masked on the arrays' sizes too: malformed trees read nothing outside them.
            at = live & (node >= 0) & (node < num_nodes)
            feature = tl.load(feature_ptr + node, mask=at, other=0)
            x = tl.load(
                x_ptr + row_start[:, None] + feature, mask=at & (feature >= 0) & (feature < num_features), other=0.0
            )
            threshold = tl.load(threshold_ptr + node, mask=at, other=0.0)
            default_left = tl.load(default_left_ptr + node, mask=at, other=0)
            left = (x < threshold) | ((x != x) & (default_left != 0))
            node = tl.where(
                left, tl.load(left_ptr + node, mask=at, other=0), tl.load(right_ptr + node, mask=at, other=0)
            )
        at = live & (node >= 0) & (node < num_nodes)
        total += tl.sum(tl.load(value_ptr + node, mask=at, other=0.0), axis=1)
    tl.store(out_ptr + rows, total + base, mask=row_live)


def tree_ensemble_scores(
    x: Tensor,
    feature: Tensor,
    threshold: Tensor,
    left: Tensor,
    right: Tensor,
    default_left: Tensor,
    value: Tensor,
    roots: Tensor,
    depth: int,
    base: float,
    out: Optional[Tensor] = None,
) -> Tensor:
    """``base`` plus the sum over trees of the leaf each row of ``x`` (``[rows, features]``,
    float32) reaches, as a float32 vector; on a GPU or through Triton's interpreter.

    Node arrays (int32 ``feature``, ``left``, ``right``, ``default_left``; float32 ``threshold``,
    ``value``) are indexed by global node number; ``roots`` (int32) holds each tree's first node;
    ``depth`` is at least the deepest tree's number of splits. Node and feature numbers outside
    the arrays are not followed (the kernel masks them), but a forest with any is malformed and
    its scores meaningless. ``out``: a float32 vector of one entry per row to write into.
    """
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"x: expected a 2-D float32 matrix, got {x.dtype} of shape {list(x.shape)}")
    nodes = feature.numel()
    for name, array, dtype in (
        ("feature", feature, torch.int32),
        ("threshold", threshold, torch.float32),
        ("left", left, torch.int32),
        ("right", right, torch.int32),
        ("default_left", default_left, torch.int32),
        ("value", value, torch.float32),
        ("roots", roots, torch.int32),
    ):
        if array.dtype != dtype or array.dim() != 1 or array.device != x.device:
            raise ValueError(
                f"{name}: expected a 1-D {dtype} tensor on {x.device}, got {array.dtype} "
                f"of shape {list(array.shape)} on {array.device}"
            )
        if name != "roots" and array.numel() != nodes:
            raise ValueError(f"{name}: expected {nodes} entries (one per node), got {array.numel()}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth: must be a non-negative int, got {depth!r}")
    x = x.contiguous()
    if out is None:
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    elif out.shape != (x.shape[0],) or out.dtype != torch.float32 or out.device != x.device:
        raise ValueError(
            f"out: expected a float32 vector of {x.shape[0]} entries on {x.device}, got "
            f"{out.dtype} of shape {list(out.shape)} on {out.device}"
        )
    num_trees = roots.numel()
    if x.shape[0] == 0:
        return out
    if num_trees == 0:
        return out.fill_(base)
    block_t = min(max(triton.next_power_of_2(num_trees), MIN_BLOCK_T), MAX_BLOCK_T)
    block_r = max(1, LANES // block_t)
    kernel = jit_kernel(
        tree_ensemble_kernel, ("num_rows", "num_trees", "num_nodes", "num_features", "depth"), interpreting()
    )
    kernel[(cdiv(x.shape[0], block_r),)](
        x,
        feature,
        threshold,
        left,
        right,
        default_left,
        value,
        roots,
        out,
        x.shape[0],
        num_trees,
        nodes,
        x.shape[1],
        depth,
        float(base),
        BLOCK_R=block_r,
        BLOCK_T=block_t,
    )
    return out
