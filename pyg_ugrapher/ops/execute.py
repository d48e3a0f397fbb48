"""Run one IR operator on a graph's structure, without autograd.

The Triton kernels run it where they run (a GPU, or the CPU under Triton's interpreter), with the
schedule and launch plan decided for the call (:func:`~pyg_ugrapher.ops.decisions.op_decision`);
the reference executor elsewhere. A gather and a message op's edge output run in one kernel where
the gather's schedule allows it.
"""

from __future__ import annotations

from typing import List

from torch import Tensor

import triton_kernels
from triton_kernels import uses_triton

from .. import reference
from ..structure import GraphStructure
from .decisions import graph_arrays, layout_of, op_decision, parse_op


def run_graph_op(structure: GraphStructure, operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """Run the serialised IR op ``op`` on a graph given by its structure (no autograd)."""
    if not uses_triton(operands[0].device):
        return reference.execute(structure, parse_op(op), operands)
    arrays = graph_arrays(structure)
    info, layout, chosen, dtype, plan = op_decision(arrays, operands, op, schedule)
    if plan is not None and triton_kernels.all_packed(operands):
        out = plan(arrays, operands)
        if out is not None:
            return out
    return triton_kernels.run(info, layout, arrays, operands, chosen, dtype)


def run_gather_with_edge_output(
    structure: GraphStructure,
    gather_operands: List[Tensor],
    gather: str,
    message_operands: List[Tensor],
    message: str,
    gather_schedule: str,
    message_schedule: str,
) -> List[Tensor]:
    """``[run_graph_op(gather), run_graph_op(message)]`` on one graph, in one kernel when the
    gather's schedule allows it (see :func:`triton_kernels.run_with_edge_output`)."""
    if uses_triton(gather_operands[0].device):
        arrays = graph_arrays(structure)
        gather_info, gather_layout, chosen, gather_dtype, plan = op_decision(
            arrays, gather_operands, gather, gather_schedule, (message, message_operands)
        )
        if (
            plan is not None
            and triton_kernels.all_packed(gather_operands)
            and triton_kernels.all_packed(message_operands)
        ):
            both = plan(arrays, gather_operands, message_operands)
            if both is not None:
                return list(both)
        message_layout = layout_of(message, message_operands)
        both = triton_kernels.run_with_edge_output(
            gather_info,
            gather_layout,
            parse_op(message),
            message_layout,
            arrays,
            gather_operands,
            message_operands,
            chosen,
            (gather_dtype, reference.result_dtype(message_operands)),
        )

        if both is not None:
            return list(both)
    return [
        run_graph_op(structure, gather_operands, gather, gather_schedule),
        run_graph_op(structure, message_operands, message, message_schedule),
    ]
