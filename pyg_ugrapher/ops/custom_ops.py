"""The ``torch.library`` custom ops of one IR operator: what ``torch.compile`` traces.

``pyg_ugrapher::graph_op`` receives only tensors and strings (the graph's structure flattened by
:meth:`~pyg_ugrapher.structure.GraphStructure.flat`, the operands, the serialised op and schedule),
so a compiled graph holds it as one opaque node with a fake implementation for shapes, and a new
graph per mini-batch is just new tensors: no recompilation and no graph break.
``pyg_ugrapher::gather_with_edge_output`` runs a backward pass's gather and message op together.
:func:`call_graph_op` and :func:`call_gather_with_edge_output` call them on a structure record; their
autograd is registered in :mod:`pyg_ugrapher.ops.autograd`.
"""

from __future__ import annotations

from typing import List

from torch import Tensor

from .. import reference
from ..graph import recordable, recordable_pair
from ..structure import GraphStructure
from .decisions import layout_of, parse_op
from .execute import run_gather_with_edge_output, run_graph_op


def _graph_op(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """:func:`~pyg_ugrapher.ops.execute.run_graph_op` as a custom op: opaque to ``torch.compile``, differentiable."""
    return run_graph_op(GraphStructure.from_flat(structure), operands, op, schedule)


def _graph_op_fake(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    return _empty_result(GraphStructure.from_flat(structure, user_order=False), operands, op)


def _empty_result(structure: GraphStructure, operands: List[Tensor], op: str) -> Tensor:
    info = parse_op(op)
    layout = layout_of(op, operands)
    rows = structure.num_dst if info.gather_op else structure.num_edges
    return operands[0].new_empty((rows,) + layout.out_shape, dtype=reference.result_dtype(operands))


def _gather_with_edge_output(
    structure: List[Tensor],
    gather_operands: List[Tensor],
    gather: str,
    message_operands: List[Tensor],
    message: str,
    gather_schedule: str,
    message_schedule: str,
) -> List[Tensor]:
    """:func:`~pyg_ugrapher.ops.execute.run_gather_with_edge_output` as a custom op (for compiled
    backward passes; it has no gradient of its own, so a double backward runs the two ops
    separately)."""
    return run_gather_with_edge_output(
        GraphStructure.from_flat(structure),
        gather_operands,
        gather,
        message_operands,
        message,
        gather_schedule,
        message_schedule,
    )


def _gather_with_edge_output_fake(
    structure: List[Tensor],
    gather_operands: List[Tensor],
    gather: str,
    message_operands: List[Tensor],
    message: str,
    gather_schedule: str,
    message_schedule: str,
) -> List[Tensor]:
    graph = GraphStructure.from_flat(structure, user_order=False)
    return [_empty_result(graph, gather_operands, gather), _empty_result(graph, message_operands, message)]


graph_op, recordable_graph_op = recordable_pair("graph_op", _graph_op, _graph_op_fake)
gather_with_edge_output, recordable_gather_with_edge_output = recordable_pair(
    "gather_with_edge_output", _gather_with_edge_output, _gather_with_edge_output_fake
)


def call_graph_op(structure: GraphStructure, operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """:func:`graph_op` on a structure record (the custom op takes it flattened); its recordable
    twin on a graph that :func:`recordable` admits."""
    call = recordable_graph_op if recordable(structure) else graph_op
    return call(structure.flat(), operands, op, schedule)


def call_gather_with_edge_output(
    structure: GraphStructure,
    gather_operands: List[Tensor],
    gather: str,
    message_operands: List[Tensor],
    message: str,
    gather_schedule: str,
    message_schedule: str,
) -> List[Tensor]:
    """:func:`gather_with_edge_output` on a structure record (the custom op takes it flattened); its
    recordable twin on a graph that :func:`recordable` admits."""
    call = recordable_gather_with_edge_output if recordable(structure) else gather_with_edge_output
    return call(structure.flat(), gather_operands, gather, message_operands, message, gather_schedule, message_schedule)
