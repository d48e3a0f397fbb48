"""Both directions' row offsets of a graph whose edges stay in the user's order, without a sort.

A small graph's operators run edge-parallel kernels that read the edges in the user's order
(:func:`autotune.selection.reads_user_order`), so its structure needs no sort: only each row's
degree, for means and for which rows have edges. One program per ``BLOCK`` edges counts both
endpoints' degrees by atomics into one zeroed buffer, each count one slot after its row, so that
the running sum of each half is that direction's ``rowptr``; :func:`build_user_order_pair` makes
both directions' structures of them.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton.language as tl
from torch import Tensor

from pyg_ugrapher.structure import CSR, mark_user_order

from .codegen import interpreting, uses_triton
from .launch import cdiv, jit_kernel

BLOCK = 1024


def degree_count_kernel(src_ptr, dst_ptr, counts_ptr, num_edges, num_dst, BLOCK: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = e < num_edges
    v = tl.load(dst_ptr + e, mask=live, other=0)
    u = tl.load(src_ptr + e, mask=live, other=0)
    # Destinations' counts from slot 1, sources' from slot num_dst + 2: slot 0 of each half stays 0.
    tl.atomic_add(counts_ptr + 1 + v, 1, mask=live)
    tl.atomic_add(counts_ptr + num_dst + 2 + u, 1, mask=live)


def row_offsets(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> Tuple[Tensor, Tensor]:
    """``(rowptr, csc_rowptr)``: the offsets of the rows of destinations and of sources, in
    ``src``'s dtype, for the edges ``(src, dst)`` in any order, on a GPU or through Triton's
    interpreter (see :func:`interpreting`). Indices must be in range (the graph checked them)."""
    if src.dtype != dst.dtype or src.device != dst.device or src.numel() != dst.numel():
        raise ValueError(
            f"src, dst: expected index tensors of one dtype, device and length, got "
            f"{src.dtype} / {dst.dtype}, {src.device} / {dst.device}, {src.numel()} / {dst.numel()}"
        )
    counts = torch.zeros(num_dst + num_src + 2, dtype=src.dtype, device=src.device)
    num_edges = src.numel()
    if num_edges:
        kernel = jit_kernel(degree_count_kernel, ("num_edges", "num_dst"), interpreting())
        kernel[(cdiv(num_edges, BLOCK),)](src, dst, counts, num_edges, num_dst, BLOCK=BLOCK)
    return counts[: num_dst + 1].cumsum(0, dtype=src.dtype), counts[num_dst + 1 :].cumsum(0, dtype=src.dtype)


def build_user_order_pair(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> Tuple[CSR, CSR]:
    """Both directions of the edges ``(src, dst)`` (in the index dtype) kept in the user's order
    (:attr:`CSR.user_order`), with each direction's row offsets: what an edge-parallel kernel that
    combines every row by atomics reads (:func:`autotune.selection.reads_user_order`). No sort:
    on a GPU, a zeroed buffer, one kernel counting both directions' degrees (:func:`row_offsets`),
    two running sums and the edge ids, against :func:`~triton_kernels.csr_pair.build_csr_pair`'s
    sort and its kernel with eight outputs. Every array but the offsets and the edge ids is ``src``
    or ``dst`` itself; the offsets are remembered (:func:`~pyg_ugrapher.structure.mark_user_order`)."""
    if uses_triton(src.device):
        rowptr, csc_rowptr = row_offsets(src, dst, num_src, num_dst)
    else:
        counts = [torch.bincount(index.to(torch.int64), minlength=n) for index, n in ((dst, num_dst), (src, num_src))]
        rowptr, csc_rowptr = (torch.cat([c.new_zeros(1), c.cumsum(0)]).to(src.dtype) for c in counts)
    eid = torch.arange(src.numel(), dtype=src.dtype, device=src.device)
    for offsets in (rowptr, csc_rowptr):
        mark_user_order(offsets)
    return CSR(rowptr, src, eid, dst, num_src, True), CSR(csc_rowptr, dst, eid, src, num_dst, True)
