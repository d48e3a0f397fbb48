"""What runs one operator call: its op, layout, schedule and launch plan, decided once.

An op travels as text (:meth:`~pyg_ugrapher.ir.OpInfo.serialize`; :func:`parse_op` reads it back
once per text), so that a custom op receives only tensors and strings. The schedule is the one
named (a partial one completed for the graph, op and width), or the cost model's
(:func:`schedule_for`, through :mod:`autotune.selection`), or, on a large GPU graph, the fastest of
the model's shortlist timed on the call's own operands. Every
decision is cached per graph structure and operand signature (:func:`op_decision`,
:func:`cached_decision`); how these caches are shared between threads: ``docs/caches.md``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import triton_kernels
from autotune import selection
from triton_kernels import GraphArrays

from .. import reference
from ..graph import GraphTensor
from ..ir import OpInfo
from ..layout import Layout, infer_layout
from ..parallel import ParallelInfo
from ..structure import CSR, GraphStructure, capturing, derived_cache

AUTO = "auto"


class OpDecisionKey(tuple):
    """``(op, schedule, device, context)``: what :func:`op_decision` keys its decisions by, ahead
    of the operands' signature. A tuple type of its own, so that its keys are told apart from other
    callers' in a shared cache (a softmax aggregation's one-pass decisions); it has no fields of
    its own, so that the key every operator call builds costs tuple's constructor alone, no
    Python-level call."""

    __slots__ = ()


@lru_cache(maxsize=4096)
def parse_op(text: str) -> OpInfo:
    """The op of a serialised text (:meth:`OpInfo.serialize`), parsed once per text."""
    return OpInfo.deserialize(text)


@lru_cache(maxsize=4096)
def serialized(op: OpInfo) -> str:
    """``op.serialize()``, once per op: the backward passes name the same few ops every step."""
    return op.serialize()


@lru_cache(maxsize=4096)
def cached_layout(op_text: str, shapes: Tuple[Tuple[int, ...], ...]) -> Layout:
    """The layout of the op ``op_text`` on operands of ``shapes`` (row counts 0), once per pair."""
    return infer_layout(parse_op(op_text), shapes)


@lru_cache(maxsize=4096)
def _layout_by_features(op_text: str, features: Tuple[torch.Size, ...]) -> Layout:
    return cached_layout(op_text, tuple((0,) + tuple(int(d) for d in f) for f in features))


def layout_of(op_text: str, operands: Sequence[Tensor]) -> Layout:
    """The layout of ``operands``, cached by their feature shapes: row counts are symbolic under
    ``torch.compile(dynamic=True)`` (and unhashable), and the layout does not depend on them.
    Looked up by the feature shapes as they are (``torch.Size``), or where one of them is symbolic
    (unhashable too) by their sizes as integers."""
    try:
        return _layout_by_features(op_text, tuple([t.shape[1:] for t in operands]))
    except TypeError:
        return cached_layout(op_text, tuple((0,) + tuple(int(d) for d in t.shape[1:]) for t in operands))


def graph_arrays(structure: GraphStructure) -> GraphArrays:
    """The arrays the kernels read of a graph's structure (see :meth:`GraphTensor.structure`)."""
    return GraphArrays(structure.csr, structure.src, structure.dst)


@lru_cache(maxsize=4096)
def parse_schedule(text: str) -> ParallelInfo:
    """The schedule of a serialised text (:meth:`ParallelInfo.serialize`), parsed once per text."""
    return ParallelInfo.deserialize(text)


def schedule_for(
    op: OpInfo,
    layout: Layout,
    csr: CSR,
    dtype: torch.dtype,
    device: torch.device,
    text: str = AUTO,
    run: Optional[Callable[[ParallelInfo], object]] = None,
    context: Hashable = None,
    adapt: Callable[[ParallelInfo], ParallelInfo] = lambda info: info,
) -> ParallelInfo:
    """The schedule named by ``text`` (a partial one completed for this graph, op and width by
    :func:`autotune.selection.resolve`), or the one the cost model picks for ``op`` passed through
    ``adapt`` (to the kernel that runs it, when that does more than ``op``); on a graph large
    enough (:func:`autotune.selection.measures`) and given ``run`` (which runs the call under a
    candidate schedule), the fastest found by timing, once per ``context`` (what else the timed
    kernel computes)."""
    if text != AUTO:
        named = parse_schedule(text)
        if named.is_complete:
            return named
        return selection.resolve(
            csr, op, layout.message_width, named, dtype, reduce_size=layout.reduce_size, device=device
        )
    if run is not None and selection.measures(csr, device):
        return selection.select_measured(
            csr,
            op,
            layout.message_width,
            run,
            dtype,
            reduce_size=layout.reduce_size,
            device=device,
            context=context,
            adapt=adapt,
        )
    return adapt(selection.select(csr, op, layout.message_width, dtype, reduce_size=layout.reduce_size, device=device))


@lru_cache(maxsize=4096)
def _edge_slots(op_text: str) -> Tuple[bool, ...]:
    return tuple(kind == "edge" for kind in parse_op(op_text).inputs)


def _signature(operands: Sequence[Tensor]) -> Tuple:
    return tuple([(t.dtype, t.shape[1:]) for t in operands])


def _for_timing(
    operands: Sequence[Tensor], reused: Optional[Tuple[bool, ...]], views: Dict[int, Tensor]
) -> List[Tensor]:
    """The operands of a timing run, read as the call reads them: the ``reused`` ones themselves
    (in CSR order), the others as new tensor objects, which a timing run cannot mark as reused
    (see :func:`triton_kernels.dispatch.is_reused`): the call itself would then read them
    differently. ``views`` (one per run, shared by a pair's two operand lists) gives a tensor that
    comes twice one view, so that the run reads it once where the call does
    (:func:`triton_kernels.dispatch.fuse`). With a view per list, GAT's backward pair would be
    timed loading the upstream gradient twice, and the decision would favour a schedule that is
    slower in the step it runs in."""
    timed = []
    for i, t in enumerate(operands):
        if reused is not None and reused[i]:
            timed.append(t)
            continue
        if id(t) not in views:
            views[id(t)] = t.view_as(t)
        timed.append(views[id(t)])
    return timed


#: Decisions that hold on every graph (see :func:`op_decision`), by op, schedule and operands.
SHARED_DECISIONS: Dict[Hashable, Tuple] = {}


def op_decision(
    arrays: GraphArrays,
    operands: Sequence[Tensor],
    op: str,
    schedule: str,
    pair: Optional[Tuple[str, Sequence[Tensor]]] = None,
) -> Tuple[OpInfo, Layout, ParallelInfo, torch.dtype, Optional[Union[triton_kernels.Plan, triton_kernels.PairPlan]]]:
    """What runs ``op`` on ``operands``: the op, its layout, the schedule, the result dtype and
    the launch plan for packed operands (:func:`triton_kernels.prepare`, with ``pair``
    :func:`triton_kernels.prepare_with_edge_output`; ``None`` where there is none); decided
    once per graph structure (cached with its statistics; shared by every graph where the
    schedule does not depend on the graph, a named one or
    :func:`autotune.selection.graph_independent`: a sampler's new mini-batch graph then decides
    nothing), operand signature, :data:`autotune.selection.generation` (a retrained
    model decides afresh) and which operands come back (:func:`triton_kernels.reuse_state`: a narrow
    edge operand is then read in CSR order, which favours other schedules than a read through the
    edge ids). With ``pair``, a message op and its operands, the gather runs with that op's edge
    output in one kernel (:func:`~pyg_ugrapher.ops.execute.run_gather_with_edge_output`): that
    kernel is what a measured decision times, and an automatic schedule is that kernel's
    (:func:`triton_kernels.pair_schedule` of the gather's)."""
    csr = arrays.csr
    reused = triton_kernels.reuse_state(operands, csr.eid, _edge_slots(op))
    pair_reused = None if pair is None else triton_kernels.reuse_state(pair[1], csr.eid, _edge_slots(pair[0]))
    context = None if pair is None else (pair[0], pair_reused) + _signature(pair[1])
    if reused is not None:  # read in CSR order: timed (and decided) apart from first calls
        context = ("reused", reused, context)
    device = operands[0].device

    def decide() -> Tuple:
        info = parse_op(op)
        layout = layout_of(op, operands)
        dtype = reference.result_dtype(operands)

        def run(candidate: ParallelInfo) -> object:
            views: Dict[int, Tensor] = {}
            if pair is None:
                return triton_kernels.run(info, layout, arrays, _for_timing(operands, reused, views), candidate, dtype)
            both = triton_kernels.run_with_edge_output(
                info,
                layout,
                parse_op(pair[0]),
                layout_of(*pair),
                arrays,
                _for_timing(operands, reused, views),
                _for_timing(pair[1], pair_reused, views),
                candidate,
                (dtype, reference.result_dtype(pair[1])),
            )
            if both is None:
                raise ValueError(f"{candidate} cannot write the edge output in the gather's pass")
            return both

        def adapt(candidate: ParallelInfo) -> ParallelInfo:
            if pair is None:
                return candidate
            return triton_kernels.pair_schedule(candidate, layout.message_width, layout_of(*pair).reduce_size)

        chosen = None
        if schedule == AUTO and capturing(operands[0]):
            chosen = _decided_apart_from_reuse(csr, op, device, context, operands)
        if chosen is None:
            chosen = schedule_for(info, layout, csr, dtype, device, schedule, run, context, adapt)
        if pair is None:
            plan = triton_kernels.prepare(info, layout, operands, chosen, dtype, reused=reused)
        else:
            plan = triton_kernels.prepare_with_edge_output(
                info,
                layout,
                parse_op(pair[0]),
                layout_of(*pair),
                operands,
                pair[1],
                chosen,
                (dtype, reference.result_dtype(pair[1])),
            )
        return info, layout, chosen, dtype, plan

    return cached_decision(csr, device, schedule, OpDecisionKey((op, schedule, device, context)), operands, decide)


def _without_reuse(context: Hashable) -> Hashable:
    """:func:`op_decision`'s ``context`` without which operands come back: ``None``, or a pair's
    message op and operand signature."""
    if isinstance(context, tuple) and context and context[0] == "reused":
        context = context[2]
    return None if context is None else (context[0],) + tuple(context[2:])


def _decided_apart_from_reuse(
    csr: CSR, op: str, device: torch.device, context: Hashable, operands: Sequence[Tensor]
) -> Optional[ParallelInfo]:
    """The schedule decided before on ``csr`` for ``op`` on operands of this signature under
    another reuse state (:func:`triton_kernels.reuse_state`), if any: what a call inside a CUDA
    graph capture runs where its own decision is missing. A capture keeps nothing, so no operand
    counts as coming back there, and a weight that came back in every warm-up call (GCN's
    normalisation on a large graph) arrives with a key the warm-up never decided; deciding it
    inside the capture would take the small-graph rule (statistics and timings wait for the GPU),
    whose edge-parallel schedules are several times slower on a large graph. The warm-up's
    schedule ran on this structure, so whatever it reads (chunk tables) is built."""
    decisions = derived_cache(csr.rowptr).get("decisions")
    if not decisions:
        return None
    wanted, signature = _without_reuse(context), _signature(operands)
    for key, decision in list(decisions.items()):
        head, *rest = key
        if not isinstance(head, OpDecisionKey):
            continue
        decided_op, decided_schedule, decided_device, decided_context = head
        if (
            decided_op == op
            and decided_schedule == AUTO
            and decided_device == device
            and tuple(rest) == signature
            and _without_reuse(decided_context) == wanted
        ):
            return decision[2]
    return None


def cached_decision(
    csr: CSR,
    device: torch.device,
    schedule: str,
    key: Hashable,
    operands: Sequence[Tensor],
    decide: Callable[[], Tuple],
) -> Tuple:
    """``decide()``, made once per ``key``, dtypes and feature shapes of ``operands``, and graph
    structure (shared by every graph where the schedule does not depend on the graph: a complete
    named ``schedule``, or :func:`autotune.selection.graph_independent`) and
    :data:`autotune.selection.generation`."""
    if schedule != AUTO and parse_schedule(schedule).is_complete:
        decisions = SHARED_DECISIONS
    elif schedule != AUTO:  # a partial schedule, completed from this graph's statistics
        decisions = derived_cache(csr.rowptr).setdefault("resolved", {})
    else:
        # Which decisions serve this structure depends on its size and device alone: looked up once.
        cache = derived_cache(csr.rowptr)
        decisions = cache.get("decisions")
        if decisions is None:
            # setdefault: of two threads that miss at once, both keep the first one's dictionary.
            decisions = cache.setdefault(
                "decisions", SHARED_DECISIONS if selection.graph_independent(csr, device) else {}
            )
    key = (key,) + _signature(operands)
    decision = decisions.get(key)
    generation = selection.generation
    if decision is None or decision[-1] != generation:
        # Two threads that miss at once both decide; either decision holds (see docs/caches.md).
        decision = decisions[key] = decide() + (generation,)
    return decision[:-1]


def decided_schedule(graph: GraphTensor, op: OpInfo, operands: Sequence[Tensor]) -> ParallelInfo:
    """The schedule :func:`~pyg_ugrapher.ops.compute` (``parallel_info=None``) runs ``op`` on ``operands`` with now:
    its decision for their current reuse state (a weight that came back is read in CSR order and
    decided apart from its first call), made as that call would make it if not made yet."""
    arrays = graph_arrays(graph.structure(operands[0].device))
    return op_decision(arrays, list(operands), serialized(op), AUTO)[2]
