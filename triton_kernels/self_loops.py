"""The edge index of a graph with a self loop added per node, in one kernel.

A layer that adds self loops on a graph of fixed sizes appends one loop per node after the edges:
GCN's and GIN's sums keep the stored loops (:func:`looped_index`,
:func:`pyg_ugrapher.graph_argument.padded_looped_graph`); GAT's and GATv2's softmax, and GCN's
other aggregations, send each stored self loop to a spare row past the last destination and move
a destination out of range one row further, out of the graph's rows too, so that its range check
still fails on it (:func:`spare_row_index`,
:func:`pyg_ugrapher.graph_argument.spare_row_looped_graph`). With torch operations that is three
to fifteen operations of host time (a comparison, a cast, a sum, a ``where``, copies into the
rows, an ``arange``, a ``repeat``, a ``cat``); a sampler's mini-batch pays them every step, with
the GPU idle. Here one program per ``BLOCK`` columns writes the whole ``[2, E + num_loops]``
index.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton.language as tl
from torch import Tensor

from .codegen import interpreting
from .launch import cdiv, jit_kernel

BLOCK = 1024


def looped_index_kernel(
    index_ptr,
    row_stride,
    column_stride,
    out_ptr,
    num_edges,
    num_loops,
    num_dst,
    num_src,
    ROUTE: tl.constexpr,
    DST_ROW: tl.constexpr,
    SPARE_SRC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    column = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    total = num_edges + num_loops
    is_edge = column < num_edges
    first = tl.load(index_ptr + column * column_stride, mask=is_edge, other=0).to(tl.int64)
    second = tl.load(index_ptr + row_stride + column * column_stride, mask=is_edge, other=0).to(tl.int64)
    if DST_ROW == 1:
        dst, src = second, first
    else:
        dst, src = first, second
    if ROUTE:
        # A stored self loop goes to the spare row num_dst; a destination out of range moves one
        # further, past it.
        dst = tl.where(first == second, num_dst, dst + (dst >= num_dst).to(tl.int64))
        if SPARE_SRC:
            src = src + (src >= num_src).to(tl.int64)
    loop = column - num_edges
    dst = tl.where(is_edge, dst, loop)
    src = tl.where(is_edge, src, loop)
    live = column < total
    tl.store(out_ptr + DST_ROW * total + column, dst, mask=live)
    tl.store(out_ptr + (1 - DST_ROW) * total + column, src, mask=live)


def _checked(index: Tensor, num_loops: int) -> None:
    if index.dim() != 2 or index.size(0) != 2:
        raise ValueError(f"index: expected shape [2, E], got {list(index.shape)}")
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise TypeError(f"index: expected an integer tensor, got {index.dtype}")
    if num_loops < 0:
        raise ValueError(f"num_loops: expected a count, got {num_loops}")


def _launch(
    index: Tensor,
    num_loops: int,
    route: bool,
    dst_row: int = 1,
    num_dst: int = 0,
    spare_src_row_of: Optional[int] = None,
) -> Tensor:
    num_edges = index.size(1)
    total = num_edges + num_loops
    out = torch.empty(2, total, dtype=torch.int64, device=index.device)
    if total:
        kernel = jit_kernel(looped_index_kernel, ("num_edges", "num_loops", "num_dst", "num_src"), interpreting())
        num_src = -1 if spare_src_row_of is None else spare_src_row_of  # read only with SPARE_SRC
        kernel[(cdiv(total, BLOCK),)](
            index, index.stride(0), index.stride(1), out, num_edges, num_loops, num_dst, num_src,
            ROUTE=route, DST_ROW=dst_row, SPARE_SRC=spare_src_row_of is not None, BLOCK=BLOCK,
        )  # fmt: skip
    return out


def looped_index(index: Tensor, num_loops: int) -> Tensor:
    """The ``[2, E + num_loops]`` int64 index of the ``[2, E]`` integer index ``index`` followed by
    the loops ``(k, k)`` of ``k < num_loops``, on a GPU or through Triton's interpreter; a new
    tensor, sharing nothing with ``index``."""
    _checked(index, num_loops)
    return _launch(index, num_loops, route=False)


def spare_row_index(
    index: Tensor, dst_row: int, num_dst: int, num_loops: int, spare_src_row_of: Optional[int] = None
) -> Tensor:
    """The ``[2, E + num_loops]`` int64 index of the spare-row graph of the ``[2, E]`` integer index
    ``index`` whose destinations are row ``dst_row`` (1 for ``flow="source_to_target"``, 0 for
    ``"target_to_source"``): each stored self loop's destination is ``num_dst``, a destination of
    ``num_dst`` or more moves one further, the sources are kept (with ``spare_src_row_of``, a source
    of that many or more moves one further too, past a spare source row), then the loops
    ``(k, k)`` of ``k < num_loops``. On a GPU or through Triton's interpreter (see
    :func:`~triton_kernels.codegen.interpreting`); the result is a new tensor, sharing nothing with
    ``index``."""
    _checked(index, num_loops)
    if dst_row not in (0, 1):
        raise ValueError(f"dst_row: expected 0 or 1, got {dst_row}")
    if num_dst < 0:
        raise ValueError(f"num_dst: expected a count, got {num_dst}")
    return _launch(index, num_loops, True, dst_row, num_dst, spare_src_row_of)
