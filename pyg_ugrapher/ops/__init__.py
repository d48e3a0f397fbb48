"""``compute``: run one IR operator, differentiably.

A call is checked here, then runs through :func:`~pyg_ugrapher.ops.autograd.differentiable_graph_op`:
the custom op ``pyg_ugrapher::graph_op`` under ``torch.compile`` (:mod:`.custom_ops`), an
``autograd.Function`` around the same implementation in eager mode (:mod:`.autograd`). The schedule
is decided at run time (``"auto"``: the cost model, cached per graph and op; :mod:`.decisions`), so
the same compiled graph serves every graph; the backward is made of the same op
(:mod:`pyg_ugrapher.backward`). Observers (``ug.plan``) see every call (:mod:`.observe`).

Where it runs (:mod:`.execute`): CUDA tensors go to the Triton kernels; CPU tensors go to the
reference executor, or to the Triton kernels through the interpreter when ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..graph import GraphTensor, NumNodes, as_graph
from ..ir import OpInfo
from ..layout import Layout, infer_layout, slot_names
from ..parallel import ParallelInfo
from .autograd import differentiable_graph_op, eager_graph_op, operand_grads
from .custom_ops import call_gather_with_edge_output, call_graph_op, gather_with_edge_output, graph_op
from .decisions import (
    AUTO,
    SHARED_DECISIONS,
    cached_decision,
    decided_schedule,
    graph_arrays,
    layout_of,
    op_decision,
    parse_op,
    schedule_for,
    serialized,
)
from .execute import run_gather_with_edge_output, run_graph_op
from .observe import Call, notify, observe, observed

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


#: Every DGL-style name, parsed once at import: a dictionary lookup is what ``torch.compile`` traces
#: through without a graph break (the parser uses ``re``).
_NAMED: Dict[str, OpInfo] = {name: OpInfo.from_name(name) for name in OpInfo.names()}


def _named(name: str) -> OpInfo:
    op = _NAMED.get(name)
    return op if op is not None else OpInfo.from_name(name)


def _slot_tensors(
    op: OpInfo, lhs: Optional[Tensor], rhs: Optional[Tensor], operands: Optional[Sequence[Tensor]]
) -> List[Tensor]:
    if op.is_builtin:
        if operands is not None:
            raise ValueError("operands: built-in edge ops take lhs= and rhs=, not operands=")
        tensors = []
        for name, kind, value in (("lhs", op.lhs, lhs), ("rhs", op.rhs, rhs)):
            if kind is None and value is not None:
                raise ValueError(f"{name}: {op.name} reads no {name}; pass {name}=None")
            if kind is not None:
                if value is None:
                    raise ValueError(f"{name}: {op.name} reads {name} ({kind}) but it was not given")
                tensors.append(value)
        return tensors
    if lhs is not None or rhs is not None:
        raise ValueError("lhs: an Expr op takes its tensors in operands=[...], in slot order")
    if operands is None or len(operands) != len(op.inputs):
        raise ValueError(
            f"operands: {op.name} reads {len(op.inputs)} operands, got {None if operands is None else len(operands)}"
        )
    return list(operands)


def rows_by_kind(graph: GraphTensor) -> Dict[str, Tuple[str, int]]:
    """For each operand kind, the name and value of the row count an operand of it must have."""
    return {
        "src_v": ("num_src", graph.num_src),
        "dst_v": ("num_dst", graph.num_dst),
        "edge": ("num_edges", graph.num_edges),
    }


def _validate(graph: GraphTensor, op: OpInfo, text: str, tensors: Sequence[Tensor]) -> Layout:
    names = slot_names(op)
    rows_of = rows_by_kind(graph)
    device = None
    for name, kind, tensor in zip(names, op.inputs, tensors):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _FLOATS:
            raise TypeError(f"{name}: features must be float16, bfloat16, float32 or float64, got {tensor.dtype}")
        if tensor.dim() == 0:
            raise ValueError(f"{name}: expected shape [rows, ...], got a scalar")
        label, rows = rows_of[kind]
        if tensor.shape[0] != rows:
            raise ValueError(f"{name}: a {kind} operand needs {rows} rows ({label}), got shape {list(tensor.shape)}")
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise ValueError(f"{name}: on {tensor.device}, but {names[0]} is on {device}")
    if torch.compiler.is_compiling():
        return infer_layout(op, [t.shape for t in tensors])  # traced once; the parse cache is not traceable
    return layout_of(text, tensors)


#: Layouts of calls :func:`_validate` accepted, by op text, the graph's row counts and each operand's
#: feature shape, dtype and device (what it checks): a repeated call is not checked again.
_VALIDATED: Dict[Tuple, Layout] = {}
#: Entries :data:`_VALIDATED` holds at most: a new graph size per mini-batch adds one per op; past
#: this many the dictionary starts afresh.
MAX_VALIDATED = 4096


def _checked_layout(graph: GraphTensor, op: OpInfo, text: str, tensors: Sequence[Tensor]) -> Layout:
    """:func:`_validate`'s layout, once per call signature (see :data:`_VALIDATED`); operands that
    are not tensors, or of a signature not seen, are checked in full (and raise there). Outside
    ``torch.compile`` (which traces :func:`_validate`)."""
    key: Tuple = (text, graph.num_src, graph.num_dst, graph.src.shape[0])
    try:
        for t in tensors:
            key += (t.shape, t.dtype, t.device)
    except AttributeError:  # not a tensor: _validate names it
        key = ()
    layout = _VALIDATED.get(key)
    if layout is None:
        if len(op.inputs) != len(tensors):
            raise ValueError(f"operands: {op.name} reads {len(op.inputs)} operands, got {len(tensors)}")
        layout = _validate(graph, op, text, tensors)
        if len(_VALIDATED) >= MAX_VALIDATED:
            _VALIDATED.clear()
        _VALIDATED[key] = layout
    return layout


def compute_checked(graph: GraphTensor, op: OpInfo, text: str, tensors: List[Tensor]) -> Tensor:
    """:func:`compute` without a schedule, for callers that hold ``op`` with its serialised
    ``text`` and pass a :class:`GraphTensor` and the operands in slot order (the layers): the
    same checks (once per call signature), observers and autograd, fewer steps per call."""
    if torch.compiler.is_compiling():
        layout = _validate(graph, op, text, tensors)
        notify(graph, op, tensors, layout)
        return call_graph_op(graph.structure(tensors[0].device), tensors, text, AUTO)
    layout = _checked_layout(graph, op, text, tensors)
    notify(graph, op, tensors, layout)
    return eager_graph_op(graph.eager_structure(tensors[0].device), tensors, text, AUTO, layout)


def compute(
    graph: Union[GraphTensor, Tensor],
    op: Union[OpInfo, str],
    lhs: Optional[Tensor] = None,
    rhs: Optional[Tensor] = None,
    *,
    operands: Optional[Sequence[Tensor]] = None,
    parallel_info: Optional[ParallelInfo] = None,
    num_nodes: NumNodes = None,
) -> Tensor:
    r"""Run one graph operator; differentiable with respect to every floating operand.

    Args:
        graph: a :class:`GraphTensor`, or an edge index ``[2, E]`` (then ``num_nodes`` applies).
        op: an :class:`OpInfo` or a DGL-style name such as ``"u_mul_e_sum"``.
        lhs: the left operand (``[rows]``, ``[rows, F]`` or ``[rows, H, C]``; rows are ``num_src``,
            ``num_dst`` or ``num_edges`` by the operand's kind).
        rhs: the right operand.
        operands: the operands of an :class:`~pyg_ugrapher.ir.Expr` op, in slot order.
        parallel_info: the schedule; knobs it leaves unset (``ParallelInfo("vertex")``) are chosen
            per graph, op and width as ``None`` chooses the whole schedule: by the cost model, or
            the heuristic without one. A ``block_f`` wider than the op's features is narrowed to
            them, with a ``UserWarning``.

    Returns:
        ``[num_dst, *features]`` for a gather op, ``[num_edges, *features]`` (user edge order) for
        message creation.
    """
    if isinstance(op, str):
        op = _named(op)
    elif not isinstance(op, OpInfo):
        raise TypeError(f"op: expected an OpInfo or an op name, got {type(op).__name__}")
    if parallel_info is not None and not isinstance(parallel_info, ParallelInfo):
        raise TypeError(f"parallel_info: expected a ParallelInfo or None, got {type(parallel_info).__name__}")
    graph = as_graph(graph, num_nodes)
    tensors = _slot_tensors(op, lhs, rhs, operands)
    text = serialized(op)
    compiling = torch.compiler.is_compiling()
    layout = _validate(graph, op, text, tensors) if compiling else _checked_layout(graph, op, text, tensors)
    schedule = AUTO
    if parallel_info is not None:
        fitted, narrowed = parallel_info.narrowed_for(layout.message_width)
        if narrowed and not compiling:
            changes = ", ".join(f"{knob}={value} to {getattr(fitted, knob)}" for knob, value in narrowed.items())
            warnings.warn(
                f"parallel_info: narrowed {changes}: {op.name} has {layout.message_width} features per message",
                UserWarning,
                stacklevel=2,
            )
        schedule = fitted.serialize()
    notify(graph, op, tensors, layout, parallel_info)
    if compiling:
        return call_graph_op(graph.structure(tensors[0].device), tensors, text, schedule)
    return eager_graph_op(graph.eager_structure(tensors[0].device), tensors, text, schedule, layout)


__all__ = [
    "AUTO",
    "Call",
    "SHARED_DECISIONS",
    "cached_decision",
    "call_gather_with_edge_output",
    "call_graph_op",
    "compute",
    "compute_checked",
    "decided_schedule",
    "differentiable_graph_op",
    "eager_graph_op",
    "gather_with_edge_output",
    "graph_arrays",
    "graph_op",
    "layout_of",
    "notify",
    "observe",
    "observed",
    "op_decision",
    "operand_grads",
    "parse_op",
    "rows_by_kind",
    "run_gather_with_edge_output",
    "run_graph_op",
    "schedule_for",
    "serialized",
]
