"""Edge indices clamped into their node ranges on the device, with a flag for any that was not.

A recorded training step (:class:`pyg_ugrapher.RecordedStep`) is replayed on new mini-batch graphs
without the host seeing them: checking their indices there would wait for the GPU at every step.
Instead the recording runs this kernel first: one program per ``BLOCK`` edges clamps both rows of
a ``[2, E]`` edge index in place into ``[0, num_src)`` and ``[0, num_dst)`` (so no later kernel
reads outside its tensors) and sets an int32 flag where any index was outside, which the host
reads once the replay is done.
"""

from __future__ import annotations

import triton.language as tl
from torch import Tensor

from .codegen import interpreting, uses_triton
from .launch import cdiv, jit_kernel

BLOCK = 1024


def clamp_edge_index_kernel(src_ptr, dst_ptr, flag_ptr, num_edges, stride, max_src, max_dst, BLOCK: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = e < num_edges
    u = tl.load(src_ptr + e * stride, mask=live, other=0)
    v = tl.load(dst_ptr + e * stride, mask=live, other=0)
    outside = live & ((u < 0) | (u > max_src) | (v < 0) | (v > max_dst))
    tl.store(src_ptr + e * stride, tl.minimum(tl.maximum(u, 0), max_src), mask=outside)
    tl.store(dst_ptr + e * stride, tl.minimum(tl.maximum(v, 0), max_dst), mask=outside)
    tl.atomic_max(flag_ptr + tl.zeros_like(e), 1, mask=outside, sem="relaxed")


def clamp_edge_index_(index: Tensor, src_row: int, num_src: int, num_dst: int, flag: Tensor) -> None:
    """Clamp row ``src_row`` of the ``[2, E]`` edge index ``index`` into ``[0, num_src)`` and the
    other row into ``[0, num_dst)``, in place; set the int32 scalar ``flag`` to 1 where any index
    was outside (it is never reset here). Without edges or nodes nothing is read."""
    if index.dim() != 2 or index.size(0) != 2:
        raise ValueError(f"index: expected a [2, E] edge index, got shape {list(index.shape)}")
    num_edges = index.size(1)
    if num_edges == 0 or num_src == 0 or num_dst == 0:
        if num_edges:
            flag.fill_(1)
        return
    src, dst = index[src_row], index[1 - src_row]
    if not uses_triton(index.device):
        for row, size in ((src, num_src), (dst, num_dst)):
            if bool(((row < 0) | (row >= size)).any()):
                flag.fill_(1)
            row.clamp_(0, size - 1)
        return
    kernel = jit_kernel(clamp_edge_index_kernel, ("num_edges", "stride", "max_src", "max_dst"), interpreting())
    grid = (cdiv(num_edges, BLOCK),)
    kernel[grid](src, dst, flag, num_edges, index.stride(1), num_src - 1, num_dst - 1, BLOCK=BLOCK)
