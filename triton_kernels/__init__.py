"""Triton kernel templates, one per parallel strategy, filled in from the IR by a code generator.

No autograd and no PyG here: :func:`run` takes index arrays, operand tensors, an
:class:`~pyg_ugrapher.ir.OpInfo` with its :class:`~pyg_ugrapher.layout.Layout` and a
:class:`~pyg_ugrapher.parallel.ParallelInfo`, and returns the output.
"""

from .codegen import GraphArrays, cache_dir, interpreting, uses_triton
from .dispatch import (
    TEMPLATES,
    PairPlan,
    Plan,
    SoftmaxPlan,
    all_packed,
    kernel_source,
    packed_rows,
    prepare,
    prepare_softmax,
    prepare_with_edge_output,
    read_as,
    reuse_state,
    run,
    run_softmax,
    run_with_edge_output,
    runs_softmax,
    softmax_source,
)
from .space import neighbours, pair_schedule, space

__all__ = [
    "GraphArrays",
    "PairPlan",
    "Plan",
    "SoftmaxPlan",
    "TEMPLATES",
    "all_packed",
    "cache_dir",
    "interpreting",
    "kernel_source",
    "neighbours",
    "packed_rows",
    "pair_schedule",
    "prepare",
    "prepare_softmax",
    "prepare_with_edge_output",
    "read_as",
    "reuse_state",
    "run",
    "run_softmax",
    "run_with_edge_output",
    "runs_softmax",
    "softmax_source",
    "space",
    "uses_triton",
]
