"""Both directions' row offsets of a graph whose edges stay in the user's order, without a sort.

A small graph's operators run edge-parallel kernels that read the edges in the user's order
(:func:`autotune.selection.reads_user_order`), so its structure needs no sort: only each row's
degree, for means and for which rows have edges. One kernel over the edges does everything a new
graph needs of the device (:func:`build_user_order_pair`): it copies both endpoints into the index
dtype, writes the edge ids, counts both endpoints' degrees by atomics into one zeroed buffer (each
count one slot after its row, so that each half's running sum is that direction's ``rowptr``), and
optionally keeps the extremes of the indices, which the graph's range check reads. An index out of
range is clamped into its side's range in the copies and the counts (the extremes keep it as
given), so a structure built of a bad edge index is a graph's all the same: no kernel that reads it
reads or writes out of bounds, whenever the range check reports the bad index
(:class:`~pyg_ugrapher.graph.GraphTensor` reads the extremes without waiting for the GPU).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton.language as tl
from torch import Tensor

from pyg_ugrapher.structure import CSR, mark_user_order

from .codegen import interpreting, uses_triton
from .launch import cdiv, jit_kernel

BLOCK = 256
#: Slots of the extremes ahead of the degree counts in the kernel's buffer (:data:`UserOrderPair.extremes`).
EXTREMES = 4
#: Up to this many rows per direction, both directions' running sums are one scan of a ``[2, rows]``
#: tensor, each row by one block: one launch where two 1-D scans take two (each a multi-block
#: scan, with more host time per call). A longer row is scanned faster across the whole GPU.
PAIRED_SCAN_ROWS = 1 << 14


def user_order_kernel(
    src_ptr,
    dst_ptr,
    src_stride,
    dst_stride,
    src_out_ptr,
    dst_out_ptr,
    eid_ptr,
    buffer_ptr,
    num_edges,
    num_src,
    num_dst,
    half,
    BLOCK: tl.constexpr,
    EXTREMA: tl.constexpr,
    WIDE: tl.constexpr,
    SLOTS: tl.constexpr,
):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = e < num_edges
    u = tl.load(src_ptr + e.to(tl.int64) * src_stride, mask=live, other=0).to(tl.int64)
    v = tl.load(dst_ptr + e.to(tl.int64) * dst_stride, mask=live, other=0).to(tl.int64)
    # Clamped into range (a side of no vertex to 0: the caller refuses edges there), so that the
    # copies, the counts and every kernel reading them stay in bounds.
    u_in = tl.minimum(tl.maximum(u, 0), tl.maximum(num_src - 1, 0))
    v_in = tl.minimum(tl.maximum(v, 0), tl.maximum(num_dst - 1, 0))
    tl.store(src_out_ptr + e, u_in, mask=live)
    tl.store(dst_out_ptr + e, v_in, mask=live)
    tl.store(eid_ptr + e, e, mask=live)
    # The buffer is in the index dtype (WIDE: int64): counts in int32 where indices fit it, whose
    # atomics contend less on a hub's counter. Destinations' counts from slot 1 of the counts,
    # sources' from slot half + 1: slot 0 of each half stays 0. Every atomic here is relaxed, as
    # the generated kernels' are (:data:`~triton_kernels.codegen.ATOMIC_SEM`): nothing reads the
    # buffer before the kernel ends.
    counts_ptr = buffer_ptr + SLOTS  # past the extremes' slots (EXTREMES)
    tl.atomic_add(counts_ptr + 1 + v_in, 1, mask=live, sem="relaxed")
    tl.atomic_add(counts_ptr + half + 1 + u_in, 1, mask=live, sem="relaxed")
    if EXTREMA:
        # Slots 0-3: the lowest source and destination index (or 0 if none is lower), the highest
        # (or 0 if none is higher), saturated at the buffer's range. Combined per program first:
        # four atomics per block of edges.
        low_u = tl.min(tl.where(live, u, 0), axis=0)
        low_v = tl.min(tl.where(live, v, 0), axis=0)
        high_u = tl.max(tl.where(live, u, 0), axis=0)
        high_v = tl.max(tl.where(live, v, 0), axis=0)
        if WIDE:
            tl.atomic_min(buffer_ptr, low_u, sem="relaxed")
            tl.atomic_min(buffer_ptr + 1, low_v, sem="relaxed")
            tl.atomic_max(buffer_ptr + 2, high_u, sem="relaxed")
            tl.atomic_max(buffer_ptr + 3, high_v, sem="relaxed")
        else:
            tl.atomic_min(buffer_ptr, tl.maximum(low_u, -2147483648).to(tl.int32), sem="relaxed")
            tl.atomic_min(buffer_ptr + 1, tl.maximum(low_v, -2147483648).to(tl.int32), sem="relaxed")
            tl.atomic_max(buffer_ptr + 2, tl.minimum(high_u, 2147483647).to(tl.int32), sem="relaxed")
            tl.atomic_max(buffer_ptr + 3, tl.minimum(high_v, 2147483647).to(tl.int32), sem="relaxed")


class UserOrderPair(NamedTuple):
    """What :func:`build_user_order_pair` builds of a graph's edges ``(src, dst)``."""

    csr: CSR  #: destinations' rows; ``col`` is ``src`` in the index dtype
    csc: CSR  #: sources' rows; ``col`` is ``dst`` in the index dtype
    #: ``[4]`` in the index dtype on the device, with ``extrema=True``: the lowest source and
    #: destination index (or 0 if none is lower) and the highest (or 0 if none is higher), saturated
    #: at the index dtype's range: all a range check needs (an error message that names the index
    #: reads the edges again); else ``None``.
    extremes: Optional[Tensor]


def build_user_order_pair(
    src: Tensor,
    dst: Tensor,
    num_src: int,
    num_dst: int,
    index_dtype: torch.dtype,
    *,
    extrema: bool = False,
) -> UserOrderPair:
    """Both directions of the edges ``(src, dst)`` (integer tensors of one length, on one device)
    kept in the user's order (:attr:`CSR.user_order`), in ``index_dtype``, with each direction's row
    offsets: what an edge-parallel kernel that combines every row by atomics reads
    (:func:`autotune.selection.reads_user_order`). No sort: on a GPU, one zeroed buffer, one kernel
    (:func:`user_order_kernel`) and a running sum per direction, against
    :func:`~triton_kernels.csr_pair.build_csr_pair`'s sort and its kernel with eight outputs. With
    ``extrema``, the same kernel keeps the indices' extremes for the caller's range check, which
    then costs one read of four numbers. An index out of range is clamped into its side's range
    (one of a side of no vertex becomes 0, which the caller must refuse). The offsets are
    remembered (:func:`~pyg_ugrapher.structure.mark_user_order`)."""
    if src.device != dst.device or src.numel() != dst.numel() or src.dim() != 1 or dst.dim() != 1:
        raise ValueError(
            f"src, dst: expected one-dimensional index tensors of one length and device, got shapes "
            f"{list(src.shape)} / {list(dst.shape)} on {src.device} / {dst.device}"
        )
    if index_dtype not in (torch.int32, torch.int64):
        raise TypeError(f"index_dtype: must be torch.int32 or torch.int64, got {index_dtype}")
    device, num_edges = src.device, src.numel()
    extremes: Optional[Tensor] = None
    if uses_triton(device):
        half = max(num_src, num_dst) + 1
        buffer = torch.zeros(EXTREMES + 2 * half, dtype=index_dtype, device=device)
        src_out = torch.empty(num_edges, dtype=index_dtype, device=device)
        dst_out = torch.empty(num_edges, dtype=index_dtype, device=device)
        eid = torch.empty(num_edges, dtype=index_dtype, device=device)
        if num_edges:
            # The strides are specialised (a stride of 1 is compiled as a constant): a row of an
            # edge index is contiguous unless the index was transposed.
            kernel = jit_kernel(user_order_kernel, ("num_edges", "num_src", "num_dst", "half"), interpreting())
            kernel[(cdiv(num_edges, BLOCK),)](
                src, dst, src.stride(0), dst.stride(0), src_out, dst_out, eid, buffer,
                num_edges, num_src, num_dst, half,
                BLOCK=BLOCK, EXTREMA=extrema, WIDE=index_dtype == torch.int64, SLOTS=EXTREMES,
            )  # fmt: skip
        # A running sum per direction (PAIRED_SCAN_ROWS): torch scans a 1-D tensor across the
        # whole GPU, the rows of a 2-D one each in one block.
        if half <= PAIRED_SCAN_ROWS:
            both = buffer[EXTREMES:].view(2, half).cumsum(1, dtype=index_dtype)
            rowptr, csc_rowptr = both[0, : num_dst + 1], both[1, : num_src + 1]
        else:
            rowptr = buffer[EXTREMES : EXTREMES + num_dst + 1].cumsum(0, dtype=index_dtype)
            csc_rowptr = buffer[EXTREMES + half : EXTREMES + half + num_src + 1].cumsum(0, dtype=index_dtype)
        if extrema:
            extremes = buffer[:EXTREMES]
    else:
        src_out = src.clamp(0, max(num_src - 1, 0)).to(index_dtype)
        dst_out = dst.clamp(0, max(num_dst - 1, 0)).to(index_dtype)
        eid = torch.arange(num_edges, dtype=index_dtype, device=device)
        counts = [torch.bincount(t.to(torch.int64), minlength=n) for t, n in ((dst_out, num_dst), (src_out, num_src))]
        rowptr, csc_rowptr = (torch.cat([c.new_zeros(1), c.cumsum(0)]).to(index_dtype) for c in counts)
        if extrema:
            # A zero column: the extremes are "or 0", as the kernel's.
            ends = torch.stack([src, dst]).to(torch.int64)
            ends = torch.cat([ends, ends.new_zeros(2, 1)], dim=1)
            limits = torch.iinfo(index_dtype)
            extremes = torch.cat([ends.amin(1), ends.amax(1)]).clamp(limits.min, limits.max).to(index_dtype)
    for offsets_of_rows in (rowptr, csc_rowptr):
        mark_user_order(offsets_of_rows)
    csr = CSR(rowptr, src_out, eid, dst_out, num_src, True)
    csc = CSR(csc_rowptr, dst_out, eid, src_out, num_dst, True)
    return UserOrderPair(csr, csc, extremes)
