"""Run one operator under one schedule: pick the template, generate and compile its kernel, launch.

This is the only entry point the frontend calls; it takes plain tensors and IR values and knows
nothing of autograd or PyG.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.layout import Layout
from pyg_ugrapher.parallel import ParallelInfo

from . import edge_message, edge_parallel, neighbor_group, vertex_message, vertex_parallel
from .codegen import GraphArrays, KernelSpec, load_kernel

#: (gather or message creation, strategy) -> template module.
TEMPLATES = {
    ("gather", "vertex"): vertex_parallel,
    ("gather", "edge"): edge_parallel,
    ("gather", "group"): neighbor_group,
    ("message", "vertex"): vertex_message,
    ("message", "edge"): edge_message,
}

_INT32_LIMIT = 2**31 - 1
_IDENTITY = {"max": float("-inf"), "min": float("inf")}
#: Edge operands with at most this many features per edge are permuted into CSR order before a
#: CSR-ordered kernel reads them: reading one scalar through ``eid`` costs a 32-byte sector per
#: 4-byte value, while the permutation costs a few bytes per edge once.
NARROW_EDGE = 4


def template_for(op: OpInfo, info: ParallelInfo):
    return TEMPLATES[("gather" if op.gather_op else "message", info.strategy)]


def operand_kinds(op: OpInfo, layout: Layout, info: ParallelInfo) -> Tuple[str, ...]:
    """The kind each slot is read as: narrow edge operands of CSR-ordered kernels become
    ``edge_csr`` (the dispatcher permutes them)."""
    if template_for(op, info) is edge_message:
        return op.inputs
    widths = {"full": layout.message_width, "head": layout.message_width // max(layout.inner, 1),
              "inner": layout.inner, "scalar": 1}
    return tuple("edge_csr" if kind == "edge" and widths[pattern] <= NARROW_EDGE else kind
                 for kind, pattern in zip(op.inputs, layout.patterns))


_PERMUTED: "WeakIdKeyDictionary" = WeakIdKeyDictionary()


def in_csr_order(tensor: Tensor, eid: Tensor) -> Tensor:
    """``tensor`` (rows in user edge order) with its rows in CSR order, flattened to 2-D.

    Cached per tensor object while its version is unchanged: static edge weights (GCN's
    normalisation, a fixed ``edge_weight``) are permuted once, not once per call.
    """
    hit = _PERMUTED.get(tensor)
    if hit is not None and hit[0] == tensor._version and hit[1] is eid:
        return hit[2]
    permuted = _as_rows(tensor).index_select(0, eid)
    _PERMUTED[tensor] = (tensor._version, eid, permuted)
    return permuted


def kernel_spec(op: OpInfo, layout: Layout, info: ParallelInfo, acc64: bool = False,
                wide: bool = False) -> KernelSpec:
    return KernelSpec(template=template_for(op, info).__name__.rsplit(".", 1)[-1],
                      expr=op.expr.serialize(), kinds=operand_kinds(op, layout, info),
                      patterns=layout.patterns, gather_op=op.gather_op, reduce=op.reduces,
                      acc64=acc64, wide=wide)


def kernel_source(op: OpInfo, layout: Layout, info: ParallelInfo, acc64: bool = False,
                  wide: bool = False) -> str:
    """The generated Triton source that runs ``op`` under ``info``."""
    return template_for(op, info).source(kernel_spec(op, layout, info, acc64, wide))


def _as_rows(tensor: Tensor) -> Tensor:
    """``[rows, *features]`` as ``[rows, width]`` with unit feature stride (rows may be strided)."""
    flat = tensor.reshape(tensor.shape[0], -1)
    if flat.shape[1] > 1 and flat.stride(1) != 1:
        flat = flat.contiguous()
    return flat


def _needs_wide(tensors: Sequence[Tensor]) -> bool:
    return any(t.shape[0] * max(t.stride(0), 1) + t.shape[1] > _INT32_LIMIT for t in tensors)


def run(op: OpInfo, layout: Layout, graph: GraphArrays, operands: Sequence[Tensor],
        info: ParallelInfo, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Compute ``op`` on ``graph`` with the Triton kernel of ``info``.

    ``operands`` are in slot order, on the graph's device. The result has shape
    ``[rows, *layout.out_shape]`` (rows: destinations, or edges in the user's order for message
    creation) and dtype ``out_dtype`` (default: the operands' promoted dtype).
    """
    info.validate_for(op.gather_op, layout.message_width)
    template = template_for(op, info)
    kinds = operand_kinds(op, layout, info)
    flat = [in_csr_order(t, graph.csr.eid) if kind == "edge_csr" else _as_rows(t)
            for t, kind in zip(operands, kinds)]
    if out_dtype is None:
        out_dtype = flat[0].dtype
        for t in flat[1:]:
            out_dtype = torch.promote_types(out_dtype, t.dtype)
    rows = graph.csr.num_rows if op.gather_op else graph.csr.num_edges
    width = layout.width
    shape = (rows,) + layout.out_shape
    device = graph.csr.device
    if rows == 0 or width == 0:
        return torch.zeros(shape, dtype=out_dtype, device=device)
    out = _allocate(op, graph, template, rows, width, out_dtype)
    if graph.csr.num_edges or (op.gather_op and not template.ATOMIC):
        acc64 = any(t.dtype == torch.float64 for t in flat)
        spec = kernel_spec(op, layout, info, acc64=acc64, wide=_needs_wide(flat + [out]))
        kernel = load_kernel(template.source(spec))
        args: List = []
        for t in flat:
            args += [t, t.stride(0)]
        template.launch(kernel, graph, args, out, width, layout, info)
    return out.to(out_dtype).view(shape)


def _allocate(op: OpInfo, graph: GraphArrays, template, rows: int, width: int,
              out_dtype: torch.dtype) -> Tensor:
    device = graph.csr.device
    if not template.ATOMIC:
        return torch.empty((rows, width), dtype=out_dtype, device=device)
    # Atomics accumulate partial results: half types would lose precision across many partials.
    dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    if op.gather_op not in _IDENTITY:
        return torch.zeros((rows, width), dtype=dtype, device=device)
    rowptr = graph.csr.rowptr
    has_edges = (rowptr[1:] - rowptr[:-1]) > 0
    init = torch.where(has_edges, _IDENTITY[op.gather_op], 0.0).to(dtype)
    return init[:, None].expand(rows, width).contiguous()


__all__: Tuple[str, ...] = ("run", "kernel_source", "kernel_spec", "TEMPLATES", "GraphArrays")
