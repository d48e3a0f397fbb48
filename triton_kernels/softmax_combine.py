"""The softmax aggregation of rows split into neighbour groups, from each chunk's partial sums.

:mod:`~triton_kernels.group_softmax` leaves, for every chunk ``c`` of a split row and per head, the
chunk's largest logit ``m_c``, the sum ``z_c`` of ``exp(logit - m_c)`` and, per feature, the
values weighted by those exponentials ``a_c``. With ``M = max_c m_c``, the row's denominator is
``z = sum_c z_c exp(m_c - M)``, its output ``sum_c a_c exp(m_c - M) / (z + 1e-16)`` and its
log-normaliser ``M + log(z + 1e-16)``: what one program walking the whole row computes
(:mod:`~triton_kernels.vertex_softmax`). One program combines one split row's chunks for a tile of
features, ``BLOCK_C`` chunks per step of two loops (a hub of 1e5 edges in chunks of 128 has 782),
as independent loads of one contiguous row of partials each.

Each lane folds its own feature's chunks in order, with no reduction across lanes: a ``tl.sum``
over a ``[chunks, features]`` tile leaves the lanes of a butterfly shuffle totals rounded
differently, which they then write to one shared-memory word (a write-after-write race that
``compute-sanitizer --tool racecheck`` reports, and a last bit that varies from run to run).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .codegen import interpreting
from .launch import cdiv, jit_kernel

#: Chunks whose partials one step of the loops reads, unrolled.
BLOCK_C = 16
MAX_BLOCK_F = 128


def combine_kernel(
    split_row_ptr,
    slot_start_ptr,
    rowptr_ptr,
    part_ptr,
    part_max_ptr,
    part_sum_ptr,
    out_ptr,
    normaliser_ptr,
    group_size,
    F,
    C,
    H,
    BLOCK_C: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    row = tl.load(split_row_ptr + tl.program_id(0)).to(tl.int64)
    first = tl.load(slot_start_ptr + tl.program_id(0)).to(tl.int64)
    count = (tl.load(rowptr_ptr + row + 1) - tl.load(rowptr_ptr + row) + group_size - 1) // group_size
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    h = f // C
    acc_type = part_ptr.dtype.element_ty
    whole = count - count % BLOCK_C
    largest = tl.full([BLOCK_F], float("-inf"), acc_type)
    for c0 in range(0, whole, BLOCK_C):
        for k in tl.static_range(BLOCK_C):
            largest = tl.maximum(
                largest, tl.load(part_max_ptr + (first + c0 + k) * H + h, mask=fmask, other=float("-inf"))
            )
    for c in range(whole, count):
        largest = tl.maximum(largest, tl.load(part_max_ptr + (first + c) * H + h, mask=fmask, other=float("-inf")))
    total = tl.zeros([BLOCK_F], acc_type)
    weighted = tl.zeros([BLOCK_F], acc_type)
    for c0 in range(0, whole, BLOCK_C):
        for k in tl.static_range(BLOCK_C):
            slot = first + c0 + k
            scale = tl.exp(tl.load(part_max_ptr + slot * H + h, mask=fmask, other=0.0) - largest)
            total += tl.load(part_sum_ptr + slot * H + h, mask=fmask, other=0.0) * scale
            weighted += tl.load(part_ptr + slot * F + f, mask=fmask, other=0.0) * scale
    for c in range(whole, count):
        slot = first + c
        scale = tl.exp(tl.load(part_max_ptr + slot * H + h, mask=fmask, other=0.0) - largest)
        total += tl.load(part_sum_ptr + slot * H + h, mask=fmask, other=0.0) * scale
        weighted += tl.load(part_ptr + slot * F + f, mask=fmask, other=0.0) * scale
    total += 1e-16
    tl.store(out_ptr + row * F + f, (weighted / total).to(out_ptr.dtype.element_ty), mask=fmask)
    tl.store(
        normaliser_ptr + row * H + h,
        (largest + tl.log(total)).to(normaliser_ptr.dtype.element_ty),
        mask=fmask & (f % C == 0),
    )


def combine(
    split_rows: Tensor,
    slot_start: Tensor,
    rowptr: Tensor,
    part: Tensor,
    part_max: Tensor,
    part_sum: Tensor,
    out: Tensor,
    normaliser: Tensor,
    group_size: int,
    inner: int,
) -> None:
    """Write the output rows ``split_rows`` of ``out`` (``[rows, F]``) and ``normaliser``
    (``[rows, H]``) from the partials ``part`` (``[slots, F]``), ``part_max`` and ``part_sum``
    (``[slots, H]``) of chunks of ``group_size`` edges, each split row's from ``slot_start`` on;
    ``inner`` features per head."""
    num_split, width = split_rows.numel(), out.shape[1]
    if width % inner or normaliser.shape[1] * inner != width or part.shape[1] != width:
        raise ValueError(
            f"out, normaliser, part: expected {width // max(inner, 1)} heads of {inner} features, got "
            f"{list(out.shape)}, {list(normaliser.shape)}, {list(part.shape)}"
        )
    if not num_split:
        return
    kernel = jit_kernel(combine_kernel, ("group_size",), interpreting())
    block_f = min(MAX_BLOCK_F, triton.next_power_of_2(width))
    grid = (num_split, cdiv(width, block_f))
    kernel[grid](
        split_rows,
        slot_start,
        rowptr,
        part,
        part_max,
        part_sum,
        out,
        normaliser,
        group_size,
        width,
        inner,
        width // inner,
        BLOCK_C=BLOCK_C,
        BLOCK_F=block_f,
        num_warps=4,
    )
