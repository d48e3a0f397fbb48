"""Per-head dot products of two ``[rows, H, C]`` tensors, ``[rows, H, 1]``: GAT's backward total
``t_v = <out_v, G_v>`` per destination and head (:mod:`pyg_ugrapher.attention`).

As torch operations it is a product, which writes an ``[rows, H, C]`` intermediate, and a sum over
the last ``C`` features, whose reduction over a few contiguous elements per output runs far below
the memory bandwidth. One kernel reads both tensors once: each program takes ``BLOCK_R``
(row, head) pairs, one per lane, and walks their ``C`` features ``UNROLL`` at a time.

Each lane sums its own pair's features in order, with no reduction across lanes: a ``tl.sum`` over
a tile leaves every lane of a butterfly shuffle a total rounded differently, and the lanes then
write those unequal copies to one shared-memory word (a write-after-write race that
``compute-sanitizer --tool racecheck`` reports, and a last bit that varies from run to run). The
lanes' reads of ``C`` strided elements hit lines that the previous features brought into L1.
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from . import buffers
from .codegen import interpreting
from .launch import cdiv, jit_kernel

BLOCK_R = 128
#: Features each step of the loop reads per pair, as independent loads.
UNROLL = 8


def head_dot_kernel(
    a_ptr, b_ptr, out_ptr, num_pairs, C, DOUBLE: tl.constexpr, BLOCK_R: tl.constexpr, UNROLL: tl.constexpr
):
    pair = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    live = pair < num_pairs
    start = pair * C
    if DOUBLE:
        total = tl.zeros([BLOCK_R], tl.float64)
    else:
        total = tl.zeros([BLOCK_R], tl.float32)
    whole = C - C % UNROLL
    for c0 in range(0, whole, UNROLL):
        for k in tl.static_range(UNROLL):
            a = tl.load(a_ptr + start + c0 + k, mask=live, other=0.0).to(total.dtype)
            b = tl.load(b_ptr + start + c0 + k, mask=live, other=0.0).to(total.dtype)
            total += a * b
    for c in range(whole, C):
        a = tl.load(a_ptr + start + c, mask=live, other=0.0).to(total.dtype)
        b = tl.load(b_ptr + start + c, mask=live, other=0.0).to(total.dtype)
        total += a * b
    tl.store(out_ptr + pair, total.to(out_ptr.dtype.element_ty), mask=live)


def head_dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(-1, keepdim=True)`` for ``a`` and ``b`` of one shape ``[rows, H, C]``, dtype and
    device, accumulated in float32 (float64 for double inputs); on a GPU or through Triton's
    interpreter."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"a, b: expected tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dim() != 3 or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"a, b: expected two [rows, heads, features] tensors of one shape, dtype and device, got "
            f"{list(a.shape)} {a.dtype} {a.device} and {list(b.shape)} {b.dtype} {b.device}"
        )
    if not a.is_floating_point():
        raise TypeError(f"a, b: expected floating-point tensors, got {a.dtype}")
    rows, heads, channels = a.shape
    out = buffers.uninitialised((rows, heads, 1), a.dtype, a.device)
    num_pairs = rows * heads
    if not num_pairs:
        return out
    if not channels:
        return out.zero_()
    kernel = jit_kernel(head_dot_kernel, ("num_pairs",), interpreting())
    kernel[(cdiv(num_pairs, BLOCK_R),)](
        a.contiguous(),
        b.contiguous(),
        out,
        num_pairs,
        channels,
        DOUBLE=a.dtype == torch.float64,
        BLOCK_R=BLOCK_R,
        UNROLL=UNROLL,
    )
    return out
