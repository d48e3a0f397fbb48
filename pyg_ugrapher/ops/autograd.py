"""The backward of one IR operator, through either of its two doors.

Every gradient is computed by IR operators derived from the op (:mod:`pyg_ugrapher.backward`) in
:func:`operand_grads`. Under ``torch.compile`` it is the autograd registered on the custom op
``pyg_ugrapher::graph_op``, whose backward steps are that custom op again; in eager mode
:class:`_EagerGraphOp`, an ``autograd.Function`` around the same implementation, skips the custom
op's dispatch cost. :func:`differentiable_graph_op` picks the door.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..backward import Backward, GradStep, derive, on_reversed
from ..ir import OpInfo
from ..layout import Layout, infer_layout
from ..structure import GraphStructure, derived_cache, keeps_nothing
from .custom_ops import call_gather_with_edge_output, call_graph_op, graph_op, recordable_graph_op
from .decisions import AUTO, cached_layout, layout_of, parse_op, parse_schedule, serialized
from .execute import run_gather_with_edge_output, run_graph_op

#: How a backward step runs an IR op: :func:`~pyg_ugrapher.ops.custom_ops.call_graph_op` (traceable,
#: differentiable) or :func:`~pyg_ugrapher.ops.execute.run_graph_op` (eager, cheapest).
Runner = Callable[[GraphStructure, List[Tensor], str, str], Tensor]


#: How a backward runs a gather and a message op in one pass:
#: :func:`~pyg_ugrapher.ops.custom_ops.call_gather_with_edge_output` (traceable, not differentiable)
#: or :func:`~pyg_ugrapher.ops.execute.run_gather_with_edge_output` (eager).
PairRunner = Callable[[GraphStructure, List[Tensor], str, List[Tensor], str, str, str], List[Tensor]]


def _save(
    ctx,
    structure: Sequence[Tensor],
    operands: Sequence[Tensor],
    out: Tensor,
    op: str,
    schedule: str,
    needed: Optional[Tuple[bool, ...]] = None,
    layout: Optional[Layout] = None,
) -> None:
    """What both autograd paths keep for the backward pass: given the ``needed`` gradients, only
    the operands and output their backward reads (a sum's output and a weight-free sum's operands
    are not: keeping them held two ``[N, F]`` tensors past their use in every eager GCN step).
    ``structure``: the structure tensors to save with them (the custom op's; see
    :class:`_EagerGraphOp` for the eager path's); ``layout``: the operands' (looked up if not given)."""
    ctx.op, ctx.schedule, ctx.num_structure = op, schedule, len(structure)
    ctx.shapes = [t.shape for t in operands]
    if needed is not None:
        half = out.dtype in (torch.float16, torch.bfloat16)
        kept, keep_out = _kept(op, layout_of(op, operands) if layout is None else layout, needed, half)
        if False in kept:
            operands = [t if keep else None for t, keep in zip(operands, kept)]
        if not keep_out:
            out = None
    ctx.save_for_backward(*structure, *operands, out)


@lru_cache(maxsize=4096)
def _kept(op_text: str, layout: Layout, needed: Tuple[bool, ...], half: bool) -> Tuple[Tuple[bool, ...], bool]:
    """Which operands, and whether the output, :func:`operand_grads` reads for the ``needed``
    gradients of ``op_text``."""
    op = parse_op(op_text)
    if op.gather_op in ("max", "min") and half:
        return (True,) * len(op.inputs), True  # the output is recomputed in float32 from every operand
    plan = _backward_of(op, layout)
    steps = [step for step, need in zip(plan.slots, needed) if need]
    if plan.count is not None and steps:
        steps.append(plan.count)
    sources = {source for step in steps for source in step.sources}
    return tuple(i in sources for i in range(len(op.inputs))), "out" in sources


def _saved_grads(
    ctx,
    grad: Tensor,
    needed: Sequence[bool],
    run: Runner,
    run_pair: Optional[PairRunner],
    structure: Optional[GraphStructure] = None,
) -> List[Optional[Tensor]]:
    """The operand gradients from what :func:`_save` kept, on ``structure`` where it was not saved."""
    saved = ctx.saved_tensors
    structure = GraphStructure.from_flat(saved[: ctx.num_structure]) if structure is None else structure
    operands = list(saved[ctx.num_structure : -1])
    return operand_grads(structure, operands, saved[-1], grad, ctx.op, ctx.schedule, needed, run, run_pair, ctx.shapes)


def _setup_context(ctx, inputs, output) -> None:
    structure, operands, op, schedule = inputs
    _save(ctx, structure, operands, output, op, schedule)


def _backward(ctx, grad: Tensor):
    # Traced by torch.compile: the backward's IR ops must be custom ops too; a double backward
    # (grad mode on) needs them differentiable, which the fused pair is not.
    run_pair = None if torch.is_grad_enabled() else call_gather_with_edge_output
    return (
        [None] * ctx.num_structure,
        _saved_grads(ctx, grad, ctx.needs_input_grad[1], call_graph_op, run_pair),
        None,
        None,
    )


for _op in (graph_op, recordable_graph_op):
    _op.register_autograd(_backward, setup_context=_setup_context)


class _EagerGraphOp(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls that need gradients.

    Dispatching a custom op costs host time per call (argument flattening, dispatcher round trips,
    the aliasing check of its outputs), comparable to the kernel itself on a graph of 1e6 edges.
    Outside ``torch.compile`` this Function skips it, and so do the backward's IR ops unless a
    double backward needs them differentiable (``create_graph=True``). The structure record is an
    argument autograd does not look into, kept as an attribute: as tensor arguments saved for the
    backward, its tensors would add per-call bookkeeping.
    """

    @staticmethod
    def forward(
        ctx, op: str, schedule: str, layout: Optional[Layout], structure: GraphStructure, *operands: Tensor
    ) -> Tensor:
        out = run_graph_op(structure, list(operands), op, schedule)
        ctx.structure = structure
        _save(ctx, (), operands, out, op, schedule, ctx.needs_input_grad[4:], layout)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        double = torch.is_grad_enabled()
        grads = _saved_grads(
            ctx,
            grad,
            ctx.needs_input_grad[4:],
            call_graph_op if double else run_graph_op,
            None if double else run_gather_with_edge_output,
            ctx.structure,
        )
        return (None, None, None, None, *grads)


#: ``autograd.Function``'s own ``apply`` below its Python wrapper, which binds default arguments
#: where ``setup_context`` is defined (``_EagerGraphOp`` defines none), checks for functorch
#: transforms and unwraps dead functorch wrappers: a dozen Python calls per operator call.
#: :func:`differentiable_graph_op` does the last two itself and calls this.
_APPLY_EAGER = torch._C._FunctionBase.__dict__["apply"].__get__(None, _EagerGraphOp)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def differentiable_graph_op(
    structure: GraphStructure, operands: List[Tensor], op: str, schedule: str, layout: Optional[Layout] = None
) -> Tensor:
    """:func:`~pyg_ugrapher.ops.custom_ops.graph_op` with autograd; outside ``torch.compile``
    without the custom op's dispatch cost (:func:`eager_graph_op`). ``layout``: the operands'
    where the caller has it."""
    if torch.compiler.is_compiling():
        return call_graph_op(structure, operands, op, schedule)
    return eager_graph_op(structure, operands, op, schedule, layout)


def eager_graph_op(
    structure: GraphStructure, operands: List[Tensor], op: str, schedule: str, layout: Optional[Layout] = None
) -> Tensor:
    """:func:`differentiable_graph_op` outside ``torch.compile``: :class:`_EagerGraphOp` where a
    gradient is needed, else the op itself."""
    if torch.is_grad_enabled():
        for t in operands:
            if t.requires_grad:
                if torch._C._are_functorch_transforms_active():
                    return _EagerGraphOp.apply(op, schedule, layout, structure, *operands)
                return _APPLY_EAGER(op, schedule, layout, structure, *[_unwrap_if_dead(t) for t in operands])
    return run_graph_op(structure, operands, op, schedule)


def operand_grads(
    structure: GraphStructure,
    operands: List[Optional[Tensor]],
    out: Optional[Tensor],
    grad: Tensor,
    op_text: str,
    schedule: str,
    needed: Sequence[bool],
    run: Runner = call_graph_op,
    run_pair: Optional[PairRunner] = None,
    shapes: Optional[Sequence[torch.Size]] = None,
) -> List[Optional[Tensor]]:
    """Gradients of every operand slot, each computed by IR ops (see :mod:`pyg_ugrapher.backward`)
    run through ``run``; the :attr:`~Backward.shared_pass` pair through ``run_pair`` if given.
    Operands (and ``out``) the needed gradients do not read may be ``None`` (see :func:`_kept`),
    given the ``shapes`` of all."""
    shapes = [t.shape for t in operands] if shapes is None else shapes
    try:
        op, layout, plan, texts = _backward_steps(op_text, tuple([shape[1:] for shape in shapes]))
    except TypeError:  # symbolic feature sizes (see layout_of)
        op, layout, plan, texts = _backward_steps(op_text, tuple(tuple(int(d) for d in s[1:]) for s in shapes))
    reversed_ = structure.reverse()
    values = {"out": out}
    if op.gather_op == "mean":
        values["grad"] = grad / _degree(structure.csr.rowptr, grad.dtype).view((-1,) + (1,) * (grad.dim() - 1))
    elif op.gather_op in ("max", "min"):
        if out.dtype in (torch.float16, torch.bfloat16):
            # Messages are compared in float32, so compare them with the float32 result (the
            # kernels upcast every operand on load, so this recomputes exactly that result).
            values["out"] = run(structure, [t.float() for t in operands], op_text, schedule)
        count = _run_step(plan.count, texts[-1], structure, reversed_, operands, values, schedule, run)
        values["grad"] = grad / count.clamp_min(1).to(grad.dtype)
    else:
        values["grad"] = grad
    results: Dict[int, Tensor] = {}
    if run_pair is not None and plan.shared_pass is not None and all(needed[i] for i in plan.shared_pass):
        i, j = plan.shared_pass
        gather, message = plan.slots[i], plan.slots[j]
        gather_inputs, message_inputs = (_inputs(step, operands, values) for step in (gather, message))
        message_op = on_reversed(message.op)
        results[i], results[j] = run_pair(
            reversed_,
            gather_inputs,
            serialized(gather.op),
            message_inputs,
            serialized(message_op),
            _inherit(schedule, gather.op, gather_inputs),
            _inherit(schedule, message_op, message_inputs),
        )
    grads: List[Optional[Tensor]] = []
    for slot, step in enumerate(plan.slots):
        shape = shapes[slot]
        if not needed[slot]:
            grads.append(None)
            continue
        if not step.sources:  # the derivative is identically 0 (an operand only inside gt or eq)
            grads.append(grad.new_zeros(shape))
            continue
        result = results.get(slot) if results else None
        if result is None:
            result = _run_step(step, texts[slot], structure, reversed_, operands, values, schedule, run)
        if not (
            layout.reduce_size > 1
            and step.op.reduces
            and layout_of(texts[slot], _inputs(step, operands, values)).reduce_size > 1
        ):
            result = _over_summed(result, layout.patterns[slot], layout)
        grads.append(_sum_to(result, shape, layout))
    return grads


@lru_cache(maxsize=4096)
def _backward_steps(
    op_text: str, features: Tuple[Tuple[int, ...], ...]
) -> Tuple[OpInfo, Layout, Backward, Tuple[str, ...]]:
    """The op ``op_text``, its layout on operands of these feature shapes, its backward and the
    serialised op of each slot's step then of the tie-count step: what every backward call of
    that op reads, looked up once."""
    op = parse_op(op_text)
    layout = cached_layout(op_text, tuple((0,) + tuple(int(d) for d in f) for f in features))
    plan = _backward_of(op, layout)
    steps = plan.slots + ((plan.count,) if plan.count is not None else ())
    return op, layout, plan, tuple(serialized(step.op) for step in steps)


@lru_cache(maxsize=4096)
def _backward_of(op: OpInfo, layout: Layout) -> Backward:
    """The backward of ``op`` with operands of ``layout``: edge operands with one value per head
    or per edge get their gradients from reducing message ops."""
    return derive(
        op, tuple(kind == "edge" and pattern in ("head", "scalar") for kind, pattern in zip(op.inputs, layout.patterns))
    )


def _degree(rowptr: Tensor, dtype: torch.dtype) -> Tensor:
    """Row degrees at least 1, in ``dtype``: cached per structure (three kernels fewer per mean
    backward), except for the stand-ins of a traced backward pass, which are never the same."""
    cacheable = type(rowptr) is Tensor and not keeps_nothing(rowptr)
    cache = derived_cache(rowptr) if cacheable else {}
    key = ("degree", dtype)
    if key not in cache:
        cache[key] = (rowptr[1:] - rowptr[:-1]).clamp_min(1).to(dtype)
    return cache[key]


def _inputs(step: GradStep, operands: List[Tensor], values: dict) -> List[Tensor]:
    return [operands[s] if isinstance(s, int) else values[s] for s in step.sources]


def _run_step(
    step: GradStep,
    text: str,
    structure: GraphStructure,
    reversed_: GraphStructure,
    operands: List[Tensor],
    values: dict,
    schedule: str,
    run: Runner,
) -> Tensor:
    """Run ``step`` (its op serialised as ``text``)."""
    inputs = _inputs(step, operands, values)
    graph = reversed_ if step.reverse else structure
    step_schedule = schedule if schedule == AUTO else _inherit(schedule, step.op, inputs)
    return run(graph, inputs, text, step_schedule)


def _inherit(schedule: str, op: OpInfo, inputs: Sequence[Tensor]) -> str:
    """An explicit forward schedule also runs the backward ops, each as a schedule of its own width
    (:func:`_fitted`)."""
    if schedule == AUTO:
        return AUTO
    return _fitted(schedule, infer_layout(op, [t.shape for t in inputs]).message_width)


@lru_cache(maxsize=4096)
def _fitted(schedule: str, width: int) -> str:
    """``schedule`` for an op of ``width`` features: as it is, or where its feature tile is wider,
    with that knob unset, so that the selection chooses it (and the other unset knobs) for this op
    and width (:func:`autotune.selection.resolve`); the strategy and other knobs stay the user's."""
    named = parse_schedule(schedule)
    return named.with_knobs(block_f=None).serialize() if named.narrowed_for(width)[1] else schedule


def _over_summed(grad: Tensor, pattern: str, layout: Layout) -> Tensor:
    """The gradient of an operand of a reducing op (``layout.reduce_size`` features summed per
    output) from a gradient message that does not vary along the summed features (its last size is
    1: no operand of the derivative has them), computed once instead of once per feature: the same
    for each of them where the operand has them (``pattern`` full or inner), their sum where it is
    broadcast along them. A reducing step's result has last size 1 either way: the caller passes
    it only where that step's message did not span the summed features (a double backward's
    reducing op, whose gradient steps reduce over them, came out that many times too large)."""
    size = layout.reduce_size
    if size == 1 or grad.shape[-1] != 1:
        return grad
    if pattern in ("full", "inner"):
        return grad.expand(grad.shape[:-1] + (size,))
    return grad * size


def _sum_to(grad: Tensor, shape: torch.Size, layout: Layout) -> Tensor:
    """Reduce a gradient over the feature dimensions its operand (of ``shape``) was broadcast along."""
    if grad.shape == shape:
        return grad
    feature = tuple(shape[1:])
    padded = (1,) * (len(layout.message_shape) - len(feature)) + feature
    return grad.sum_to_size((shape[0],) + padded).reshape(shape)
