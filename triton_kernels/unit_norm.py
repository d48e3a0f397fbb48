"""GCN's edge weights when every edge weighs 1, from node-level degree factors, in two kernels.

Each edge ``(u, v)`` weighs ``d_u^-1/2 d_v^-1/2``, where ``d`` counts a node's incoming edges. With
self loops, stored loops do not count and weigh 0 in place, and each node's own loop counts once
and weighs ``1 / d_v``, after the edges. As torch operations that is about a dozen calls (a mask,
an ``index_add_``, ``rsqrt``, two gathers, products, the loops' ``cat``), each with its host cost,
and a sampler pays it for every new mini-batch graph.

Here one kernel sums the degrees with atomics, and one writes every weight. The sums are counts of
1.0 in float32 (float64 for double weights), exact up to 2**24 per node in any order, so the
result does not depend on the order of the atomics.
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from . import buffers
from .codegen import interpreting
from .launch import cdiv, jit_kernel

BLOCK = 1024


def degree_kernel(src_ptr, dst_ptr, degree_ptr, num_edges, LOOPS: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    counted = e < num_edges
    d = tl.load(dst_ptr + e, mask=counted, other=0)
    if LOOPS:
        counted = counted & (tl.load(src_ptr + e, mask=counted, other=0) != d)
    tl.atomic_add(degree_ptr + d, tl.full([BLOCK], 1.0, degree_ptr.dtype.element_ty), mask=counted, sem="relaxed")


def weight_kernel(
    src_ptr,
    dst_ptr,
    degree_ptr,
    out_ptr,
    num_edges,
    num_nodes,
    LOOPS: tl.constexpr,
    DOUBLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    out_dtype = out_ptr.dtype.element_ty
    # Positions [0, E) are the edges; with loops, [E, E + N) the nodes' own loops.
    is_edge = i < num_edges
    u = tl.load(src_ptr + i, mask=is_edge, other=0)
    v = tl.load(dst_ptr + i, mask=is_edge, other=0)
    degree_u = tl.load(degree_ptr + u, mask=is_edge, other=1.0)
    degree_v = tl.load(degree_ptr + v, mask=is_edge, other=1.0)
    # Correctly rounded square roots: Triton's default one is approximate in float32.
    if DOUBLE:
        root_u, root_v = tl.sqrt(degree_u), tl.sqrt(degree_v)
    else:
        root_u, root_v = tl.sqrt_rn(degree_u), tl.sqrt_rn(degree_v)
    # A node without edges (only without loops) has degree 0: PyG's gcn_norm maps its inf to 0.
    weight = tl.where(degree_u > 0, 1.0 / root_u, 0.0) * tl.where(degree_v > 0, 1.0 / root_v, 0.0)
    if LOOPS:
        weight = tl.where(u != v, weight, 0.0)
    tl.store(out_ptr + i, weight.to(out_dtype), mask=is_edge)
    if LOOPS:
        node = i - num_edges
        is_loop = (i >= num_edges) & (node < num_nodes)
        degree = tl.load(degree_ptr + node, mask=is_loop, other=1.0)
        if DOUBLE:
            factor = 1.0 / tl.sqrt(degree)
        else:
            factor = 1.0 / tl.sqrt_rn(degree)
        tl.store(out_ptr + i, (factor * factor).to(out_dtype), mask=is_loop)


def degree_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where the degrees of weights in ``dtype`` are summed: float64 for double weights, else
    float32 (exact counts up to 2**24, where float16 overflows at 65504)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fits(num_edges: int, num_nodes: int) -> bool:
    """Whether every position (edges, then loops) fits the kernels' int32 offsets."""
    return num_edges + num_nodes < 2**31


def unit_norm_weights(src: Tensor, dst: Tensor, num_nodes: int, add_self_loops: bool, dtype: torch.dtype) -> Tensor:
    """The ``[E]`` weights of the edges ``(src, dst)`` (in range: the caller checked them), then,
    with ``add_self_loops``, the ``[num_nodes]`` weights of the nodes' loops, in ``dtype``; on a GPU
    or through Triton's interpreter."""
    if src.dim() != 1 or src.shape != dst.shape:
        raise ValueError(
            f"src, dst: expected two 1-D tensors of one length, got shapes {list(src.shape)} and {list(dst.shape)}"
        )
    if src.dtype not in (torch.int32, torch.int64) or dst.dtype != src.dtype:
        raise TypeError(f"src, dst: expected int32 or int64 indices of one dtype, got {src.dtype} and {dst.dtype}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point dtype, got {dtype}")
    num_edges = src.numel()
    if not fits(num_edges, num_nodes):
        raise ValueError(f"src: {num_edges} edges and {num_nodes} loops overflow the kernels' int32 offsets")
    src, dst = src.contiguous(), dst.contiguous()
    acc = degree_dtype(dtype)
    degree = (torch.ones if add_self_loops else torch.zeros)(num_nodes, dtype=acc, device=src.device)
    # Uninitialised, as the generated kernels' outputs: the weight kernel writes every element.
    out = buffers.uninitialised((num_edges + (num_nodes if add_self_loops else 0),), dtype, src.device)
    interpreted = interpreting()
    degree_fn = jit_kernel(degree_kernel, ("num_edges",), interpreted)
    weight_fn = jit_kernel(weight_kernel, ("num_edges", "num_nodes"), interpreted)
    if num_edges:
        degree_fn[(cdiv(num_edges, BLOCK),)](src, dst, degree, num_edges, LOOPS=add_self_loops, BLOCK=BLOCK)
    if out.numel():
        weight_fn[(cdiv(out.numel(), BLOCK),)](
            src, dst, degree, out, num_edges, num_nodes, LOOPS=add_self_loops, DOUBLE=acc == torch.float64, BLOCK=BLOCK
        )
    return out
