"""Both directions' index arrays of a graph from one sort of their row keys, in one kernel.

:func:`build_csr_pair` sorts the keys ``dst`` (first half) and ``src + num_dst`` (second half)
together and stably; the sorted keys and the permutation hold everything else. Done with torch
operations (where kernels do not run), the row offsets (a ``searchsorted``), the two directions'
slices, gathers, subtractions and dtype casts are about fifteen operations of host time for every
new graph (a sampler's mini-batch pays them every step, with the GPU idle); here one program per
``BLOCK`` positions writes, at once, the edge arrays of the position's direction and the row
offsets of the rows numbered like the positions (a binary search over the sorted keys).
:func:`grouped` sorts a structure kept in the user's order the same way, once.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
import triton.language as tl
from torch import Tensor

from pyg_ugrapher.structure import CSR, INT32_MAX, derived_cache, keeps_nothing

from .codegen import interpreting, uses_triton
from .launch import cdiv, jit_kernel

BLOCK = 1024


def csr_pair_kernel(
    keys_ptr,
    perm_ptr,
    src_ptr,
    dst_ptr,
    csr_rowptr_ptr,
    csr_col_ptr,
    csr_eid_ptr,
    csr_rows_ptr,
    csc_rowptr_ptr,
    csc_col_ptr,
    csc_eid_ptr,
    csc_rows_ptr,
    num_edges,
    num_src,
    num_dst,
    search_steps,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    out_dtype = csr_col_ptr.dtype.element_ty

    # Positions [0, E) are the CSR's (rows = destinations), [E, 2E) the CSC's, whose permutation
    # entries and keys are offset by E and num_dst.
    live = i < 2 * num_edges
    key = tl.load(keys_ptr + i, mask=live, other=0)
    p = tl.load(perm_ptr + i, mask=live, other=0)
    in_csr = live & (i < num_edges)
    in_csc = live & (i >= num_edges)
    tl.store(csr_col_ptr + i, tl.load(src_ptr + p, mask=in_csr, other=0).to(out_dtype), mask=in_csr)
    tl.store(csr_eid_ptr + i, p.to(out_dtype), mask=in_csr)
    tl.store(csr_rows_ptr + i, key.to(out_dtype), mask=in_csr)
    j = i - num_edges
    q = p - num_edges
    tl.store(csc_col_ptr + j, tl.load(dst_ptr + q, mask=in_csc, other=0).to(out_dtype), mask=in_csc)
    tl.store(csc_eid_ptr + j, q.to(out_dtype), mask=in_csc)
    tl.store(csc_rows_ptr + j, (key - num_dst).to(out_dtype), mask=in_csc)

    # Row r of the joint numbering (destinations, then sources) starts at the first sorted key
    # >= r; r = num_dst ends the CSR and starts the CSC, so it is written to both.
    num_keys = 2 * num_edges
    is_row = i <= num_dst + num_src
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = tl.where(is_row, num_keys, 0)
    for _ in range(search_steps):
        searching = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(keys_ptr + mid, mask=searching, other=0) < i
        lo = tl.where(searching & below, mid + 1, lo)
        hi = tl.where(searching & (below == 0), mid, hi)
    tl.store(csr_rowptr_ptr + i, lo.to(out_dtype), mask=is_row & (i <= num_dst))
    tl.store(csc_rowptr_ptr + (i - num_dst), (lo - num_edges).to(out_dtype), mask=is_row & (i >= num_dst))


def _allocate(sizes: List[int], like: Tensor) -> List[Tensor]:
    """The outputs, uninitialised: the kernel writes every element."""
    return [torch.empty(size, dtype=like.dtype, device=like.device) for size in sizes]


def fits(num_edges: int, num_src: int, num_dst: int) -> bool:
    """Whether every position and row of the joint numbering fits the kernel's int32 offsets."""
    return max(2 * num_edges, num_src + num_dst + 1) < 2**31


def csr_pair_arrays(
    sorted_keys: Tensor, perm: Tensor, src: Tensor, dst: Tensor, num_src: int, num_dst: int
) -> Tuple[Tensor, ...]:
    """``(rowptr, col, eid, rows)`` of the destination-sorted CSR, then of the source-sorted CSC,
    in ``src``'s dtype, from the stable sort ``(sorted_keys, perm)`` of ``cat([dst, src +
    num_dst])``, on a GPU or through Triton's interpreter (see :func:`interpreting`)."""
    num_edges = src.numel()
    if dst.numel() != num_edges or sorted_keys.numel() != 2 * num_edges or perm.numel() != 2 * num_edges:
        raise ValueError(
            f"sorted_keys, perm: expected {2 * num_edges} entries (both directions of "
            f"{num_edges} edges), got {sorted_keys.numel()} and {perm.numel()}"
        )
    if not fits(num_edges, num_src, num_dst):
        raise ValueError(
            f"src: {num_edges} edges over {num_src} + {num_dst} vertices overflow the kernel's int32 offsets"
        )
    csr_rowptr, csc_rowptr, *edge_arrays = _allocate([num_dst + 1, num_src + 1] + [num_edges] * 6, src)
    positions = max(2 * num_edges, num_src + num_dst + 1)
    search_steps = (2 * num_edges).bit_length() + 1
    kernel = jit_kernel(csr_pair_kernel, ("num_edges", "num_src", "num_dst", "search_steps"), interpreting())
    kernel[(cdiv(positions, BLOCK),)](
        sorted_keys,
        perm,
        src,
        dst,
        csr_rowptr,
        *edge_arrays[:3],
        csc_rowptr,
        *edge_arrays[3:],
        num_edges,
        num_src,
        num_dst,
        search_steps,
        BLOCK=BLOCK,
    )
    return (csr_rowptr, *edge_arrays[:3], csc_rowptr, *edge_arrays[3:])


def build_csr_pair(src: Tensor, dst: Tensor, num_src: int, num_dst: int, dtype: torch.dtype) -> Tuple[CSR, CSR]:
    """The destination-sorted CSR and the source-sorted CSC of the edges ``(src, dst)``, by one
    stable sort of both directions' row keys at once (``dst``, then ``src + num_dst``).

    A sampler's mini-batch is a new graph every step and needs both directions (the backward walks
    the CSC), so their build is host time every step: one sort and a ``searchsorted`` for the row
    offsets instead of two of :func:`~pyg_ugrapher.structure.build_csr`'s sort, ``bincount`` (a
    device sync) and ``cumsum`` halves the operations and leaves no sync. Where the operators'
    kernels run, one kernel then writes every array (:func:`csr_pair_arrays`), instead of about
    fifteen torch operations. ``src`` and ``dst`` are in ``dtype``.
    """
    num_edges = src.numel()
    key_dtype = dtype if num_src + num_dst <= INT32_MAX else torch.int64
    keys = torch.cat([dst.to(key_dtype), src.to(key_dtype) + num_dst])
    sorted_keys, perm = torch.sort(keys, stable=True)
    if uses_triton(src.device) and fits(num_edges, num_src, num_dst):
        arrays = csr_pair_arrays(sorted_keys, perm, src, dst, num_src, num_dst)
        return CSR(*arrays[:4], num_src), CSR(*arrays[4:], num_dst)
    bounds = torch.arange(num_dst + num_src + 1, dtype=key_dtype, device=src.device)
    rowptr = torch.searchsorted(sorted_keys, bounds, out_int32=dtype == torch.int32)
    csr_perm, csc_perm = perm[:num_edges], perm[num_edges:] - num_edges
    # Every array has a storage of its own, never a view of a buffer of both directions: the
    # graph_structure op and the layers' graph ops return both directions, and a custom op's outputs
    # may not alias one another; and caches keyed by an array's identity (statistics and decisions
    # by ``rowptr``, permuted edge operands by ``eid``) miss when a compiled graph's backward gets a
    # saved view back as a new tensor object (a compiled GAT step then recomputed its statistics).
    csr = CSR(
        rowptr[: num_dst + 1].clone(),
        src[csr_perm],
        csr_perm.to(dtype, copy=True),
        sorted_keys[:num_edges].to(dtype, copy=True),
        num_src,
    )
    csc = CSR(
        rowptr[num_dst:] - num_edges,
        dst[csc_perm],
        csc_perm.to(dtype),
        (sorted_keys[num_edges:] - num_dst).to(dtype),
        num_dst,
    )
    return csr, csc


def grouped(csr: CSR) -> CSR:
    """``csr`` with its edges grouped by row (stably: each row's edges in the user's order), as
    :func:`build_csr_pair` builds it; a user-order structure's (:attr:`CSR.user_order`), sorted
    once and cached with it, for a kernel that walks rows (a schedule the user named on a small
    graph, the one-pass softmax of :func:`autotune.heuristic.small_graph_softmax_schedule`);
    ``csr`` itself otherwise."""
    if not csr.user_order:
        return csr
    cache = derived_cache(csr.rowptr)
    found = cache.get("grouped")
    if found is None:
        found = build_csr_pair(csr.col, csr.rows, csr.num_cols, csr.num_rows, csr.col.dtype)[0]
        # Sorted inside a CUDA graph capture, it is recorded (sorted at every replay) and never
        # kept: the recording's memory pool is overwritten by later replays (see keeps_nothing).
        if not keeps_nothing(csr.rowptr):
            cache["grouped"] = found
    return found
