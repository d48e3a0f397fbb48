"""``compute``: run one IR operator, differentiably, as a ``torch.library`` custom op.

Every call goes through the custom op ``pyg_ugrapher::graph_op``. It receives only tensors and
strings (the graph's index arrays, the operands, the serialised :class:`OpInfo` and schedule),
so ``torch.compile`` traces it as one opaque node with a fake implementation for shapes, and a
new graph per mini-batch is just new tensors: no recompilation and no graph break. The schedule is
decided inside the op at run time (``"auto"``: the cost model, cached per graph and op), so the
same compiled graph serves every graph. Its backward, registered with
``torch.library.register_autograd``, is made of the same custom op (:mod:`pyg_ugrapher.backward`).

Where it runs: CUDA tensors go to the Triton kernels; CPU tensors go to the reference executor,
or to the Triton kernels through the interpreter when ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import triton_kernels
from triton_kernels import GraphArrays, uses_triton

from . import reference
from .backward import Backward, GradStep, derive, on_reversed
from .graph import CSR, OP_TAGS, GraphTensor, NumNodes, as_graph, capturing, derived_cache, in_user_order
from .ir import OpInfo
from .layout import Layout, infer_layout, slot_names
from .parallel import ParallelInfo

AUTO = "auto"
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: How a backward step runs an IR op: :func:`graph_op` (traceable, differentiable) or
#: :func:`run_graph_op` (eager, cheapest).
Runner = Callable[[List[Tensor], List[Tensor], str, str], Tensor]
#: How a backward runs a gather and a message op in one pass: :func:`gather_with_edge_output`
#: (traceable, not differentiable) or :func:`run_gather_with_edge_output` (eager).
PairRunner = Callable[[List[Tensor], List[Tensor], str, List[Tensor], str, str, str], List[Tensor]]


@lru_cache(maxsize=4096)
def _op(text: str) -> OpInfo:
    return OpInfo.deserialize(text)


#: Every DGL-style name, parsed once (~2 ms): a dictionary lookup is what ``torch.compile`` traces
#: through without a graph break (the parser uses ``re``).
_NAMED: Dict[str, OpInfo] = {name: OpInfo.from_name(name) for name in OpInfo.names()}


def _named(name: str) -> OpInfo:
    op = _NAMED.get(name)
    return op if op is not None else OpInfo.from_name(name)


@lru_cache(maxsize=4096)
def _layout(op_text: str, shapes: Tuple[Tuple[int, ...], ...]) -> Layout:
    return infer_layout(_op(op_text), shapes)


def layout_of(op_text: str, operands: Sequence[Tensor]) -> Layout:
    """The layout of ``operands``, cached by their feature shapes: row counts are symbolic under
    ``torch.compile(dynamic=True)`` (and unhashable), and the layout does not depend on them."""
    return _layout(op_text, tuple((0,) + tuple(int(d) for d in t.shape[1:]) for t in operands))


def graph_arrays(structure: Sequence[Tensor]) -> GraphArrays:
    """The forward graph's arrays from a structure list (see :meth:`GraphTensor.structure`)."""
    rowptr, col, eid, rows, csc_rowptr = structure[:5]
    src, dst = structure[8], structure[9]
    return GraphArrays(CSR(rowptr, col, eid, rows, csc_rowptr.numel() - 1, in_user_order(rowptr)), src, dst)


def reversed_structure(structure: Sequence[Tensor]) -> List[Tensor]:
    """The structure list of the reversed graph: CSR and CSC swap, and so do the endpoints."""
    return list(structure[4:8]) + list(structure[:4]) + [structure[9], structure[8]]


@lru_cache(maxsize=None)
def _selection():
    # autotune imports this package: import it on first use, once (an import statement per call
    # costs microseconds that every operator call would pay).
    from autotune import selection
    return selection


def schedule_for(op: OpInfo, layout: Layout, csr: CSR, dtype: torch.dtype, device: torch.device,
                 text: str = AUTO, run: Optional[Callable[[ParallelInfo], object]] = None,
                 context: Hashable = None, adapt: Callable[[ParallelInfo], ParallelInfo] = lambda info: info
                 ) -> ParallelInfo:
    """The schedule named by ``text``, or the one the cost model picks for ``op`` passed through
    ``adapt`` (to the kernel that runs it, when that does more than ``op``); on a graph large
    enough (:func:`autotune.selection.measures`) and given ``run`` (which runs the call under a
    candidate schedule), the fastest found by timing, once per ``context`` (what else the timed
    kernel computes)."""
    if text != AUTO:
        return ParallelInfo.deserialize(text)
    selection = _selection()
    if run is not None and selection.measures(csr, device):
        return selection.select_measured(csr, op, layout.message_width, run, dtype, reduce_size=layout.reduce_size,
                                         device=device, context=context, adapt=adapt)
    return adapt(selection.select(csr, op, layout.message_width, dtype, reduce_size=layout.reduce_size,
                                  device=device))


def run_graph_op(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """Run the serialised IR op ``op`` on a graph given by its structure list (no autograd)."""
    device = operands[0].device
    if not uses_triton(device):
        graph = GraphTensor(structure[8], structure[9], structure[4].numel() - 1,
                            structure[0].numel() - 1, validate=False)
        return reference.execute(graph, _op(op), operands)
    arrays = graph_arrays(structure)
    info, layout, chosen, dtype, plan = _decision(arrays, operands, op, schedule)
    if plan is not None and triton_kernels.all_packed(operands):
        out = plan(arrays, operands)
        if out is not None:
            return out
    return triton_kernels.run(info, layout, arrays, operands, chosen, dtype)


@lru_cache(maxsize=4096)
def _edge_slots(op_text: str) -> Tuple[bool, ...]:
    return tuple(kind == "edge" for kind in _op(op_text).inputs)


def _signature(operands: Sequence[Tensor]) -> Tuple:
    return tuple([(t.dtype, t.shape[1:]) for t in operands])


def _for_timing(operands: Sequence[Tensor], reused: Optional[Tuple[bool, ...]], views: Dict[int, Tensor]
                ) -> List[Tensor]:
    """The operands of a timing run, read as the call reads them: the ``reused`` ones themselves
    (in CSR order), the others as new tensor objects, which a timing run cannot mark as reused
    (see :func:`triton_kernels.dispatch.is_reused`): the call itself would then read them
    differently. ``views`` (one per run, shared by a pair's two operand lists) gives a tensor that
    comes twice one view, so that the run reads it once where the call does
    (:func:`triton_kernels.dispatch.fuse`). With a view per list, GAT's backward pair was timed
    loading the upstream gradient twice: on an H200 it chose a schedule that ran 1.02 ms in the
    step where another ran 0.79 ms (``benchmarks/results/h200-gat-host``, probe 67)."""
    timed = []
    for i, t in enumerate(operands):
        if reused is not None and reused[i]:
            timed.append(t)
            continue
        if id(t) not in views:
            views[id(t)] = t.view_as(t)
        timed.append(views[id(t)])
    return timed


#: Decisions that hold on every graph (see :func:`_decision`), by op, schedule and operands.
_SHARED_DECISIONS: Dict[Hashable, Tuple] = {}


def _decision(arrays: GraphArrays, operands: Sequence[Tensor], op: str, schedule: str,
              pair: Optional[Tuple[str, Sequence[Tensor]]] = None
              ) -> Tuple[OpInfo, Layout, ParallelInfo, torch.dtype,
                         Optional[Union[triton_kernels.Plan, triton_kernels.PairPlan]]]:
    """What runs ``op`` on ``operands``: the op, its layout, the schedule, the result dtype and
    the launch plan for packed operands (:func:`triton_kernels.prepare`, with ``pair``
    :func:`triton_kernels.prepare_with_edge_output`; ``None`` where there is none); decided
    once per graph structure (cached with its statistics; shared by every graph where the
    schedule does not depend on the graph, a named one or
    :func:`autotune.selection.graph_independent`: a sampler's new mini-batch graph then decides
    nothing), operand signature, :data:`autotune.selection.generation` (a retrained
    model decides afresh) and which operands come back (:func:`triton_kernels.reuse_state`: a narrow
    edge operand is then read in CSR order, which favours other schedules; on the H100,
    ``u_mul_e_sum`` kept a schedule timed with its weight read through the edge ids). With
    ``pair``, a message op and its operands, the gather runs with that op's edge output in one
    kernel (:func:`run_gather_with_edge_output`): that kernel is what a measured decision times,
    and an automatic schedule is that kernel's (:func:`triton_kernels.pair_schedule` of the
    gather's)."""
    csr = arrays.csr
    reused = triton_kernels.reuse_state(operands, csr.eid, _edge_slots(op))
    pair_reused = None if pair is None else triton_kernels.reuse_state(pair[1], csr.eid, _edge_slots(pair[0]))
    context = None if pair is None else (pair[0], pair_reused) + _signature(pair[1])
    if reused is not None:  # read in CSR order: timed (and decided) apart from first calls
        context = ("reused", reused, context)
    device = operands[0].device

    def decide() -> Tuple:
        info = _op(op)
        layout = layout_of(op, operands)
        dtype = reference.result_dtype(operands)

        def run(candidate: ParallelInfo) -> object:
            views: Dict[int, Tensor] = {}
            if pair is None:
                return triton_kernels.run(info, layout, arrays, _for_timing(operands, reused, views), candidate,
                                          dtype)
            both = triton_kernels.run_with_edge_output(info, layout, _op(pair[0]), layout_of(*pair),
                                                       arrays, _for_timing(operands, reused, views),
                                                       _for_timing(pair[1], pair_reused, views), candidate,
                                                       (dtype, reference.result_dtype(pair[1])))
            if both is None:
                raise ValueError(f"{candidate} cannot write the edge output in the gather's pass")
            return both

        def adapt(candidate: ParallelInfo) -> ParallelInfo:
            if pair is None:
                return candidate
            return triton_kernels.pair_schedule(candidate, layout.message_width, layout_of(*pair).reduce_size)

        chosen = schedule_for(info, layout, csr, dtype, device, schedule, run, context, adapt)
        if pair is None:
            plan = triton_kernels.prepare(info, layout, operands, chosen, dtype, reused=reused)
        else:
            plan = triton_kernels.prepare_with_edge_output(info, layout, _op(pair[0]), layout_of(*pair), operands,
                                                           pair[1], chosen, (dtype, reference.result_dtype(pair[1])))
        return info, layout, chosen, dtype, plan

    return cached_decision(csr, device, schedule, (op, schedule, device, context), operands, decide)


def cached_decision(csr: CSR, device: torch.device, schedule: str, key: Hashable, operands: Sequence[Tensor],
                    decide: Callable[[], Tuple]) -> Tuple:
    """``decide()``, made once per ``key``, dtypes and feature shapes of ``operands``, and graph
    structure (shared by every graph where the schedule does not depend on the graph: a named
    ``schedule``, or :func:`autotune.selection.graph_independent`) and
    :data:`autotune.selection.generation`."""
    selection = _selection()
    if schedule != AUTO:
        decisions = _SHARED_DECISIONS
    else:
        # Which decisions serve this structure depends on its size and device alone: looked up once.
        cache = derived_cache(csr.rowptr)
        decisions = cache.get("decisions")
        if decisions is None:
            decisions = cache["decisions"] = _SHARED_DECISIONS if selection.graph_independent(csr, device) else {}
    key = (key,) + _signature(operands)
    decision = decisions.get(key)
    generation = selection.generation
    if decision is None or decision[-1] != generation:
        decision = decisions[key] = decide() + (generation,)
    return decision[:-1]


@torch.library.custom_op("pyg_ugrapher::graph_op", mutates_args=(), tags=OP_TAGS)
def graph_op(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """:func:`run_graph_op` as a custom op: opaque to ``torch.compile``, differentiable."""
    return run_graph_op(structure, operands, op, schedule)


@graph_op.register_fake
def _(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    return _empty_result(structure, operands, op)


def _empty_result(structure: List[Tensor], operands: List[Tensor], op: str) -> Tensor:
    info = _op(op)
    layout = layout_of(op, operands)
    rows = structure[0].shape[0] - 1 if info.gather_op else structure[1].shape[0]
    return operands[0].new_empty((rows,) + layout.out_shape, dtype=reference.result_dtype(operands))


def decided_schedule(graph: GraphTensor, op: OpInfo, operands: Sequence[Tensor]) -> ParallelInfo:
    """The schedule :func:`compute` (``parallel_info=None``) runs ``op`` on ``operands`` with now:
    its decision for their current reuse state (a weight that came back is read in CSR order and
    decided apart from its first call), made as that call would make it if not made yet."""
    arrays = graph_arrays(graph.structure(operands[0].device))
    return _decision(arrays, list(operands), serialized(op), AUTO)[2]


def run_gather_with_edge_output(structure: List[Tensor], gather_operands: List[Tensor], gather: str,
                                message_operands: List[Tensor], message: str, gather_schedule: str,
                                message_schedule: str) -> List[Tensor]:
    """``[run_graph_op(gather), run_graph_op(message)]`` on one graph, in one kernel when the
    gather's schedule allows it (see :func:`triton_kernels.run_with_edge_output`)."""
    if uses_triton(gather_operands[0].device):
        arrays = graph_arrays(structure)
        gather_info, gather_layout, chosen, gather_dtype, plan = _decision(arrays, gather_operands, gather,
                                                                           gather_schedule, (message, message_operands))
        if plan is not None and triton_kernels.all_packed(gather_operands) and \
                triton_kernels.all_packed(message_operands):
            both = plan(arrays, gather_operands, message_operands)
            if both is not None:
                return list(both)
        message_layout = layout_of(message, message_operands)
        both = triton_kernels.run_with_edge_output(gather_info, gather_layout, _op(message), message_layout, arrays,
                                                   gather_operands, message_operands, chosen,
                                                   (gather_dtype, reference.result_dtype(message_operands)))
        if both is not None:
            return list(both)
    return [run_graph_op(structure, gather_operands, gather, gather_schedule),
            run_graph_op(structure, message_operands, message, message_schedule)]


@torch.library.custom_op("pyg_ugrapher::gather_with_edge_output", mutates_args=(), tags=OP_TAGS)
def gather_with_edge_output(structure: List[Tensor], gather_operands: List[Tensor], gather: str,
                            message_operands: List[Tensor], message: str, gather_schedule: str,
                            message_schedule: str) -> List[Tensor]:
    """:func:`run_gather_with_edge_output` as a custom op (for compiled backward passes; it has no
    gradient of its own, so a double backward runs the two ops separately)."""
    return run_gather_with_edge_output(structure, gather_operands, gather, message_operands, message,
                                       gather_schedule, message_schedule)


@gather_with_edge_output.register_fake
def _(structure: List[Tensor], gather_operands: List[Tensor], gather: str, message_operands: List[Tensor],
      message: str, gather_schedule: str, message_schedule: str) -> List[Tensor]:
    return [_empty_result(structure, gather_operands, gather), _empty_result(structure, message_operands, message)]


def _save(ctx, structure: Sequence[Tensor], operands: Sequence[Tensor], out: Tensor, op: str,
          schedule: str, needed: Optional[Sequence[bool]] = None) -> None:
    """What both autograd paths keep for the backward pass: given the ``needed`` gradients, only
    the operands and output their backward reads (a sum's output and a weight-free sum's operands
    are not: keeping them held two ``[N, F]`` tensors past their use in every eager GCN step).
    ``structure``: the structure tensors to save with them (the custom op's; see
    :class:`_EagerGraphOp` for the eager path's)."""
    ctx.op, ctx.schedule, ctx.num_structure = op, schedule, len(structure)
    ctx.shapes = tuple(t.shape for t in operands)
    if needed is not None:
        half = out.dtype in (torch.float16, torch.bfloat16)
        kept, keep_out = _kept(op, layout_of(op, operands), tuple(bool(n) for n in needed), half)
        operands = [t if keep else None for t, keep in zip(operands, kept)]
        out = out if keep_out else None
    ctx.save_for_backward(*structure, *operands, out)


@lru_cache(maxsize=4096)
def _kept(op_text: str, layout: Layout, needed: Tuple[bool, ...], half: bool) -> Tuple[Tuple[bool, ...], bool]:
    """Which operands, and whether the output, :func:`operand_grads` reads for the ``needed``
    gradients of ``op_text``."""
    op = _op(op_text)
    if op.gather_op in ("max", "min") and half:
        return (True,) * len(op.inputs), True  # the output is recomputed in float32 from every operand
    plan = _backward_of(op, layout)
    steps = [step for step, need in zip(plan.slots, needed) if need]
    if plan.count is not None and steps:
        steps.append(plan.count)
    sources = {source for step in steps for source in step.sources}
    return tuple(i in sources for i in range(len(op.inputs))), "out" in sources


def _saved_grads(ctx, grad: Tensor, needed: Sequence[bool], run: Runner, run_pair: Optional[PairRunner],
                 structure: Optional[List[Tensor]] = None) -> List[Optional[Tensor]]:
    """The operand gradients from what :func:`_save` kept, on ``structure`` where it was not saved."""
    saved = ctx.saved_tensors
    structure = list(saved[:ctx.num_structure]) if structure is None else structure
    operands = list(saved[ctx.num_structure:-1])
    return operand_grads(structure, operands, saved[-1], grad, ctx.op, ctx.schedule, needed, run, run_pair,
                         ctx.shapes)


def _setup_context(ctx, inputs, output) -> None:
    structure, operands, op, schedule = inputs
    _save(ctx, structure, operands, output, op, schedule)


def _backward(ctx, grad: Tensor):
    # Traced by torch.compile: the backward's IR ops must be custom ops too; a double backward
    # (grad mode on) needs them differentiable, which the fused pair is not.
    run_pair = None if torch.is_grad_enabled() else gather_with_edge_output
    return [None] * ctx.num_structure, _saved_grads(ctx, grad, ctx.needs_input_grad[1], graph_op, run_pair), \
        None, None


torch.library.register_autograd("pyg_ugrapher::graph_op", _backward, setup_context=_setup_context)


class _EagerGraphOp(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls that need gradients.

    Dispatching a custom op costs ~0.5 ms of host time per call on the H100 machine (argument
    flattening, dispatcher round trips, the aliasing check of its outputs), as much as the kernel
    on a graph of 1e6 edges. Outside ``torch.compile`` this Function skips it, and so do the
    backward's IR ops unless a double backward needs them differentiable (``create_graph=True``).
    The structure list is an argument autograd does not look into, kept as an attribute: as ten
    tensor arguments, saved for the backward, it cost ~4 us more per call on the project's CPU
    machine.
    """

    @staticmethod
    def forward(ctx, op: str, schedule: str, structure: List[Tensor], *operands: Tensor) -> Tensor:
        out = run_graph_op(structure, list(operands), op, schedule)
        ctx.structure = structure
        _save(ctx, (), operands, out, op, schedule, ctx.needs_input_grad[3:])
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        double = torch.is_grad_enabled()
        grads = _saved_grads(ctx, grad, ctx.needs_input_grad[3:], graph_op if double else run_graph_op,
                             None if double else run_gather_with_edge_output, ctx.structure)
        return (None, None, None) + tuple(grads)


def differentiable_graph_op(structure: List[Tensor], operands: List[Tensor], op: str, schedule: str) -> Tensor:
    """:func:`graph_op` with autograd; outside ``torch.compile`` without the custom op's dispatch
    cost (see :class:`_EagerGraphOp`)."""
    if torch.compiler.is_compiling():
        return graph_op(structure, operands, op, schedule)
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in operands):
        return run_graph_op(structure, operands, op, schedule)
    return _EagerGraphOp.apply(op, schedule, structure, *operands)



def operand_grads(structure: List[Tensor], operands: List[Optional[Tensor]], out: Optional[Tensor], grad: Tensor,
                  op_text: str, schedule: str, needed: Sequence[bool], run: Runner = graph_op,
                  run_pair: Optional[PairRunner] = None, shapes: Optional[Sequence[torch.Size]] = None
                  ) -> List[Optional[Tensor]]:
    """Gradients of every operand slot, each computed by IR ops (see :mod:`pyg_ugrapher.backward`)
    run through ``run``; the :attr:`~Backward.shared_pass` pair through ``run_pair`` if given.
    Operands (and ``out``) the needed gradients do not read may be ``None`` (see :func:`_kept`),
    given the ``shapes`` of all."""
    op = _op(op_text)
    shapes = [t.shape for t in operands] if shapes is None else shapes
    layout = _layout(op_text, tuple((0,) + tuple(int(d) for d in shape[1:]) for shape in shapes))
    plan = _backward_of(op, layout)
    reversed_ = reversed_structure(structure)
    values = {"out": out}
    if op.gather_op == "mean":
        values["grad"] = grad / _degree(structure[0], grad.dtype).view((-1,) + (1,) * (grad.dim() - 1))
    elif op.gather_op in ("max", "min"):
        if out.dtype in (torch.float16, torch.bfloat16):
            # Messages are compared in float32, so compare them with the float32 result (the
            # kernels upcast every operand on load, so this recomputes exactly that result).
            values["out"] = run(structure, [t.float() for t in operands], op_text, schedule)
        count = _run_step(plan.count, structure, reversed_, operands, values, schedule, run)
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
            reversed_, gather_inputs, serialized(gather.op), message_inputs, serialized(message_op),
            _inherit(schedule, gather.op, gather_inputs), _inherit(schedule, message_op, message_inputs))
    grads: List[Optional[Tensor]] = []
    for slot, (step, shape) in enumerate(zip(plan.slots, shapes)):
        if not needed[slot]:
            grads.append(None)
            continue
        if not step.sources:  # the derivative is identically 0 (an operand only inside gt or eq)
            grads.append(grad.new_zeros(shape))
            continue
        result = results.get(slot)
        if result is None:
            result = _run_step(step, structure, reversed_, operands, values, schedule, run)
        if not (step.op.reduces and layout.reduce_size > 1 and
                layout_of(serialized(step.op), _inputs(step, operands, values)).reduce_size > 1):
            result = _over_summed(result, layout.patterns[slot], layout)
        grads.append(_sum_to(result, shape, layout))
    return grads


@lru_cache(maxsize=4096)
def _backward_of(op: OpInfo, layout: Layout) -> Backward:
    """The backward of ``op`` with operands of ``layout``: edge operands with one value per head
    or per edge get their gradients from reducing message ops."""
    return derive(op, tuple(kind == "edge" and pattern in ("head", "scalar")
                            for kind, pattern in zip(op.inputs, layout.patterns)))


@lru_cache(maxsize=4096)
def serialized(op: OpInfo) -> str:
    """``op.serialize()``, once per op: the backward passes name the same few ops every step."""
    return op.serialize()


def _degree(rowptr: Tensor, dtype: torch.dtype) -> Tensor:
    """Row degrees at least 1, in ``dtype``: cached per structure (three kernels fewer per mean
    backward), except for the stand-ins of a traced backward pass, which are never the same."""
    cacheable = type(rowptr) is Tensor and not capturing(rowptr)
    cache = derived_cache(rowptr) if cacheable else {}
    key = ("degree", dtype)
    if key not in cache:
        cache[key] = (rowptr[1:] - rowptr[:-1]).clamp_min(1).to(dtype)
    return cache[key]


def _inputs(step: GradStep, operands: List[Tensor], values: dict) -> List[Tensor]:
    return [operands[s] if isinstance(s, int) else values[s] for s in step.sources]


def _run_step(step: GradStep, structure: List[Tensor], reversed_: List[Tensor], operands: List[Tensor],
              values: dict, schedule: str, run: Runner) -> Tensor:
    inputs = _inputs(step, operands, values)
    graph = reversed_ if step.reverse else structure
    step_schedule = _inherit(schedule, step.op, inputs)
    return run(graph, inputs, serialized(step.op), step_schedule)


def _inherit(schedule: str, op: OpInfo, inputs: Sequence[Tensor]) -> str:
    """An explicit forward schedule also runs the backward ops where it is valid for them."""
    if schedule == AUTO:
        return AUTO
    try:
        layout = infer_layout(op, [t.shape for t in inputs])
        ParallelInfo.deserialize(schedule).validate_for(layout.message_width)
    except ValueError:
        return AUTO
    return schedule


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


# -- the public entry point --------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One :func:`compute` call, as observers (``ug.plan``) see it."""

    graph: GraphTensor
    op: OpInfo
    operands: Tuple[Tensor, ...]
    layout: Layout
    parallel_info: Optional[ParallelInfo]
    #: The kernel's Triton source where it is not the op's own under ``parallel_info`` (a fused pass).
    source: Optional[str] = None


_OBSERVERS: List[Callable[[Call], None]] = []


@contextmanager
def observe(callback: Callable[[Call], None]) -> Iterator[None]:
    """Call ``callback`` with every :func:`compute` call made inside the ``with`` block."""
    _OBSERVERS.append(callback)
    try:
        yield
    finally:
        _OBSERVERS.remove(callback)



def observed() -> bool:
    """Whether :func:`observe` has observers now (what a call tells them may cost host time)."""
    return bool(_OBSERVERS)


def notify(graph: GraphTensor, op: OpInfo, tensors: Sequence[Tensor], layout: Optional[Layout] = None,
           parallel_info: Optional[ParallelInfo] = None, source: Optional[str] = None) -> None:
    """Tell the observers of :func:`observe` about one operator call (``compute`` does; so do the
    fused functions that run IR ops themselves)."""
    if not _OBSERVERS:
        return
    if layout is None:
        layout = infer_layout(op, [t.shape for t in tensors])
    for callback in _OBSERVERS:
        callback(Call(graph, op, tuple(tensors), layout, parallel_info, source))


def _slot_tensors(op: OpInfo, lhs: Optional[Tensor], rhs: Optional[Tensor],
                  operands: Optional[Sequence[Tensor]]) -> List[Tensor]:
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
        raise ValueError(f"operands: {op.name} reads {len(op.inputs)} operands, got "
                         f"{None if operands is None else len(operands)}")
    return list(operands)


def rows_by_kind(graph: GraphTensor) -> Dict[str, Tuple[str, int]]:
    """For each operand kind, the name and value of the row count an operand of it must have."""
    return {"src_v": ("num_src", graph.num_src), "dst_v": ("num_dst", graph.num_dst),
            "edge": ("num_edges", graph.num_edges)}


def _validate(graph: GraphTensor, op: OpInfo, text: str, tensors: Sequence[Tensor]) -> Layout:
    names = slot_names(op)
    rows_of = rows_by_kind(graph)
    device = None
    for name, kind, tensor in zip(names, op.inputs, tensors):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _FLOATS:
            raise TypeError(f"{name}: features must be float16, bfloat16, float32 or float64, "
                            f"got {tensor.dtype}")
        if tensor.dim() == 0:
            raise ValueError(f"{name}: expected shape [rows, ...], got a scalar")
        label, rows = rows_of[kind]
        if tensor.shape[0] != rows:
            raise ValueError(f"{name}: a {kind} operand needs {rows} rows ({label}), got shape "
                             f"{list(tensor.shape)}")
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise ValueError(f"{name}: on {tensor.device}, but {names[0]} is on {device}")
    if torch.compiler.is_compiling():
        return infer_layout(op, [t.shape for t in tensors])  # traced once; the parse cache is not traceable
    return layout_of(text, tensors)


def compute(graph: Union[GraphTensor, Tensor], op: Union[OpInfo, str], lhs: Optional[Tensor] = None,
            rhs: Optional[Tensor] = None, *, operands: Optional[Sequence[Tensor]] = None,
            parallel_info: Optional[ParallelInfo] = None, num_nodes: NumNodes = None) -> Tensor:
    r"""Run one graph operator; differentiable with respect to every floating operand.

    Args:
        graph: a :class:`GraphTensor`, or an edge index ``[2, E]`` (then ``num_nodes`` applies).
        op: an :class:`OpInfo` or a DGL-style name such as ``"u_mul_e_sum"``.
        lhs: the left operand (``[rows]``, ``[rows, F]`` or ``[rows, H, C]``; rows are ``num_src``,
            ``num_dst`` or ``num_edges`` by the operand's kind).
        rhs: the right operand.
        operands: the operands of an :class:`~pyg_ugrapher.ir.Expr` op, in slot order.
        parallel_info: the schedule; ``None`` lets the cost model choose per graph and op.

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
    layout = _validate(graph, op, text, tensors)
    schedule = AUTO
    if parallel_info is not None:
        parallel_info.validate_for(layout.message_width)
        schedule = parallel_info.serialize()
    notify(graph, op, tensors, layout, parallel_info)
    return differentiable_graph_op(graph.structure(tensors[0].device), tensors, text, schedule)
