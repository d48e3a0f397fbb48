"""Both directions' index arrays of a graph from one sort of their row keys, in one kernel.

``GraphTensor`` sorts the keys ``dst`` (first half) and ``src + num_dst`` (second half) together
and stably; the sorted keys and the permutation hold everything else. Done with torch operations,
the row offsets (a ``searchsorted``), the two directions' slices, gathers, subtractions and dtype
casts are about fifteen operations of host time for every new graph (a sampler's mini-batch pays
them every step, with the GPU idle); here one program per ``BLOCK`` positions writes, at once, the
edge arrays of the position's direction and the row offsets of the rows numbered like the
positions (a binary search over the sorted keys).
"""
from __future__ import annotations

from typing import List, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .codegen import interpreting
from .launch import jit_kernel

BLOCK = 1024


def csr_pair_kernel(keys_ptr, perm_ptr, src_ptr, dst_ptr,
                    csr_rowptr_ptr, csr_col_ptr, csr_eid_ptr, csr_rows_ptr,
                    csc_rowptr_ptr, csc_col_ptr, csc_eid_ptr, csc_rows_ptr,
                    num_edges, num_src, num_dst, search_steps, BLOCK: tl.constexpr):
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


def csr_pair_arrays(sorted_keys: Tensor, perm: Tensor, src: Tensor, dst: Tensor, num_src: int,
                    num_dst: int) -> Tuple[Tensor, ...]:
    """``(rowptr, col, eid, rows)`` of the destination-sorted CSR, then of the source-sorted CSC,
    in ``src``'s dtype, from the stable sort ``(sorted_keys, perm)`` of ``cat([dst, src +
    num_dst])``, on a GPU or through Triton's interpreter (see :func:`interpreting`)."""
    num_edges = src.numel()
    if dst.numel() != num_edges or sorted_keys.numel() != 2 * num_edges or perm.numel() != 2 * num_edges:
        raise ValueError(f"sorted_keys, perm: expected {2 * num_edges} entries (both directions of "
                         f"{num_edges} edges), got {sorted_keys.numel()} and {perm.numel()}")
    if not fits(num_edges, num_src, num_dst):
        raise ValueError(f"src: {num_edges} edges over {num_src} + {num_dst} vertices overflow the "
                         f"kernel's int32 offsets")
    csr_rowptr, csc_rowptr, *edge_arrays = _allocate([num_dst + 1, num_src + 1] + [num_edges] * 6, src)
    positions = max(2 * num_edges, num_src + num_dst + 1)
    search_steps = (2 * num_edges).bit_length() + 1
    kernel = jit_kernel(csr_pair_kernel, ("num_edges", "num_src", "num_dst", "search_steps"), interpreting())
    kernel[(triton.cdiv(positions, BLOCK),)](
        sorted_keys, perm, src, dst, csr_rowptr, *edge_arrays[:3], csc_rowptr, *edge_arrays[3:],
        num_edges, num_src, num_dst, search_steps, BLOCK=BLOCK)
    return (csr_rowptr, *edge_arrays[:3], csc_rowptr, *edge_arrays[3:])
