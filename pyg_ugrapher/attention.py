r"""Softmax-weighted aggregation over incoming edges (GAT's attention), with a closed-form backward.

For edge logits :math:`s_e` (per head), node features :math:`x_u` and an optional per-edge dropout
scale :math:`k_e`:

.. math::
    m_v = \max_{e \to v} s_e, \qquad
    \alpha_e = \frac{\exp(s_e - m_v)}{\sum_{e' \to v} \exp(s_{e'} - m_v) + 10^{-16}}, \qquad
    \mathrm{out}_v = \sum_{e = (u, v)} \alpha_e \, k_e \, x_u .

The logits are given as an ``[E, H]`` tensor, or computed per edge by a message op, the *score*,
from its own operands (GAT's :math:`\mathrm{LeakyReLU}(a^s_u + a^t_v)`). A score is recomputed
inside every pass that needs it, so no ``[E, H]`` logit tensor is ever written or read, and its
gradient goes straight to its operands.

The forward pass writes no ``[E, ...]`` tensor. Where the schedule decided for it is vertex-parallel
or neighbour groups, with feature tiles of whole heads or inside one, it is one pass over the edges
(:mod:`triton_kernels.vertex_softmax`: each row's largest logit, then the denominator and the
weighted sum; :mod:`triton_kernels.group_softmax` does the same per chunk of a row and combines a
split row's chunks in a second, small kernel). Elsewhere (edge-parallel schedules, tiles
straddling heads) it is three IR operators: a gather-max of the score
for :math:`m`, a gather-sum of :math:`\exp(s_e - m_v)` for the denominator :math:`z`, and a
gather-sum of :math:`x_u k_e \exp(s_e - \ell_v)` for the output. Both give the log-normaliser
:math:`\ell_v = m_v + \log(z_v + 10^{-16})`, which the backward reads (one destination operand
instead of :math:`m` and :math:`z`: one gather fewer per edge).

The automatic backward of :mod:`pyg_ugrapher.backward` would differentiate those three operators
one by one. Softmax has a shorter closed form: with upstream gradient :math:`G_v`,

.. math::
    \frac{\partial L}{\partial x_u} = \sum_{e = (u, v)} \alpha_e k_e G_v, \qquad
    \frac{\partial L}{\partial s_e} = \alpha_e \left(k_e \langle x_u, G_v \rangle - t_v\right),
    \qquad t_v = \sum_{e \to v} \alpha_e k_e \langle x_u, G_v \rangle = \langle \mathrm{out}_v, G_v \rangle,

so :math:`t` is a dense per-node product. The first gradient is a gather-sum on the reversed graph
and shares its kernel with the per-edge products :math:`\langle x_u, G_v \rangle` (``u_dot_v``
as the kernel's edge output: both read :math:`G_v` for every edge); :math:`t` is one more kernel
(:mod:`triton_kernels.head_dot`). Each operand of the score then
gets :math:`\sum_e \partial L / \partial s_e \cdot \partial s_e / \partial \theta` from one
more IR operator, routed as every IR gradient is (:func:`pyg_ugrapher.backward.grad_step`): a
gather-sum on the reversed graph for a source operand, on the graph for a destination operand, a
message op for an edge operand (the given logits are one). The shift :math:`m` has no gradient
(softmax is shift-invariant). This is what DGL's ``edge_softmax`` followed by ``u_mul_e_sum``
computes, in fewer passes over the edges.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import triton_kernels
from autotune import selection
from autotune.heuristic import SOFTMAX_ONE_PASS_MAX_ROW, small_graph_softmax_schedule
from triton_kernels import all_packed, uses_triton
from triton_kernels.head_dot import head_dot

from . import reference
from .backward import GradStep, Source, canonical, grad_step, on_reversed
from .graph import GraphTensor, recordable, recordable_pair
from .ir import Expr, OpInfo
from .ops import (
    AUTO,
    cached_decision,
    differentiable_graph_op,
    graph_arrays,
    layout_of,
    notify,
    observed,
    rows_by_kind,
    run_gather_with_edge_output,
    run_graph_op,
    schedule_for,
    serialized,
)
from .parallel import ParallelInfo
from .structure import GraphStructure, largest_row

#: PyG's softmax adds this to the denominator: destinations without edges stay finite.
EPSILON = 1e-16

#: The score of given logits: the edge operand itself.
GIVEN_LOGITS = OpInfo(Expr.input(0), None, operands=("edge",))
_GIVEN_LOGITS_TEXT = GIVEN_LOGITS.serialize()

_SWAP = {"src_v": "dst_v", "dst_v": "src_v", "edge": "edge"}


class ScoreGrad(NamedTuple):
    """One of :attr:`AttentionOps.grad_scores` as the backward runs it."""

    text: str  #: the serialised op
    reverse: bool  #: run on the reversed graph
    sources: Tuple[Source, ...]  #: what feeds each slot: a score operand's index, or a value's name
    edge_slots: Tuple[int, ...]  #: the slots read per edge, each a view of its own (see :func:`_operands`)


class AttentionOps(NamedTuple):
    """The IR ops of one score's forward and backward passes, and the serialised text of each one
    that runs (what the dispatcher takes): made once per score, where a call would hash every op
    to look its text up."""

    shift: OpInfo  #: per destination, the largest logit
    denominator: OpInfo  #: per destination, the sum of the shifted exponentials
    output: OpInfo  #: the weighted sum of the source features
    grad_x: OpInfo  #: the gradient of the source features, on the reversed graph
    grad_scores: Tuple[GradStep, ...]  #: the gradient of each operand of the score
    score_kinds: Tuple[str, ...]  #: the kind of each operand of the score
    #: The forward in one pass, as the op whose layout and schedule it takes: the sum of
    #: ``x_u * exp(logit) [* k]`` over slots ``x``, the score's operands[, ``k``].
    one_pass: OpInfo
    value: Expr  #: what the one pass weights by the softmax: ``x_u [* k]`` over ``one_pass``'s slots
    logit: Expr  #: the logit over ``one_pass``'s slots
    # The serialised ops above, in the order of the ops.
    shift_text: str
    denominator_text: str
    output_text: str
    grad_x_text: str
    one_pass_text: str
    score_grads: Tuple[ScoreGrad, ...]  #: ``grad_scores`` as the backward runs them
    edge_scores: bool  #: whether the score reads an edge operand


def _exp_shifted(logit: Expr, shift: int) -> Expr:
    return Expr.apply("exp", logit - Expr.input(shift))


@lru_cache(maxsize=None)
def attention_ops(score: str, dropout: bool) -> AttentionOps:
    """The ops for the serialised message op ``score``; with ``dropout`` the output and ``grad_x``
    read the per-edge scale ``k``."""
    score_op = OpInfo.deserialize(score)
    kinds, logit = score_op.inputs, score_op.expr
    n = len(kinds)
    shift = canonical(logit, kinds, "max", False)
    denominator = OpInfo(_exp_shifted(logit, n), "sum", operands=kinds + ("dst_v",))
    # slots: x (src), the score's operands, log-normaliser (dst)[, k (edge)]
    shifted_logit = logit.remap({i: i + 1 for i in range(n)})
    weight = _exp_shifted(shifted_logit, n + 1)
    output_kinds = ("src_v",) + kinds + ("dst_v",)
    # slots: x (src), the score's operands[, k (edge)]
    value, one_pass_kinds = Expr.input(0), ("src_v",) + kinds
    if dropout:
        weight = weight * Expr.input(n + 2)
        output_kinds += ("edge",)
        value, one_pass_kinds = value * Expr.input(n + 1), one_pass_kinds + ("edge",)
    output = OpInfo(Expr.input(0) * weight, "sum", operands=output_kinds)
    one_pass = OpInfo(value * Expr.apply("exp", shifted_logit), "sum", operands=one_pass_kinds)
    # On the reversed graph the destination's tensors are read as sources; G takes x's slot.
    grad_x = OpInfo(output.expr, "sum", operands=("src_v",) + tuple(_SWAP[kind] for kind in output_kinds[1:]))
    # slots: the score's operands, log-normaliser (dst), k * <x_u, G_v> (edge), t (dst)
    grad_kinds = kinds + ("dst_v", "edge", "dst_v")
    sources: Tuple[Source, ...] = tuple(range(n)) + ("normaliser", "products", "total")
    grad_logit = _exp_shifted(logit, n) * (Expr.input(n + 1) - Expr.input(n + 2))
    grad_scores = tuple(
        grad_step(
            grad_logit * logit.grad(i), grad_kinds, sources, None if kind == "edge" else "sum", False, kind == "src_v"
        )
        for i, kind in enumerate(kinds)
    )
    score_grads = tuple(
        ScoreGrad(
            step.op.serialize(),
            step.reverse,
            step.sources,
            tuple(slot for slot, kind in enumerate(step.op.inputs) if kind == "edge"),
        )
        for step in grad_scores
    )
    return AttentionOps(
        shift,
        denominator,
        output,
        grad_x,
        grad_scores,
        kinds,
        one_pass,
        value,
        shifted_logit,
        shift.serialize(),
        denominator.serialize(),
        output.serialize(),
        grad_x.serialize(),
        one_pass.serialize(),
        score_grads,
        "edge" in kinds,
    )


_DOT = OpInfo.from_name("u_dot_v")
_DOT_TEXT, _DOT_REVERSED = _DOT.serialize(), on_reversed(_DOT).serialize()


def _operands(columns: List[Tensor], ops: AttentionOps) -> List[Tensor]:
    """The score's ``columns`` as one operator's operands: an edge operand as a new view per
    operator. The dispatcher permutes a narrow edge operand into CSR order when the same tensor
    object comes back (static edge weights, reused every step); edge logits used by three operators
    of one step would pay that permutation (costlier than the operator) and never see it again.
    Node operands are read as they are: one view serves a whole pass (each view costs a dispatcher
    call)."""
    if not ops.edge_scores:
        return columns
    return [column.view_as(column) if kind == "edge" else column for column, kind in zip(columns, ops.score_kinds)]


def _three_passes(
    structure: GraphStructure,
    ops: AttentionOps,
    columns: List[Tensor],
    x: Tensor,
    extra: List[Tensor],
    graph: Optional[GraphTensor] = None,
    output_schedule: str = AUTO,
    run_op: Callable[[GraphStructure, List[Tensor], str, str], Tensor] = run_graph_op,
) -> Tuple[Tensor, Tensor]:
    """``(out, log-normaliser)`` from the three forward operators run by ``run_op`` (observers of
    ``ug.plan`` are told about each one when the ``graph`` is given), the output's under
    ``output_schedule``. The shift carries no gradient: softmax is shift-invariant (PyG detaches
    its maximum too)."""
    observing = graph is not None and observed()

    def run(op: OpInfo, text: str, operands: List[Tensor], schedule: str = AUTO) -> Tensor:
        if observing:
            notify(graph, op, operands)
        return run_op(structure, operands, text, schedule)

    shift = run(ops.shift, ops.shift_text, _operands(columns, ops))
    if shift.requires_grad:
        shift = shift.detach()
    denominator = run(ops.denominator, ops.denominator_text, _operands(columns, ops) + [shift])
    normaliser = shift + (denominator + EPSILON).log()
    operands = [x] + _operands(columns, ops) + [normaliser] + extra
    return run(ops.output, ops.output_text, operands, output_schedule), normaliser


def _one_pass_decision(
    structure: GraphStructure,
    ops: AttentionOps,
    operands: List[Tensor],
    columns: List[Tensor],
    x: Tensor,
    extra: List[Tensor],
) -> Tuple:
    """``(arrays, layout, schedule, dtypes, plan, one pass, small)``: the graph's arrays, the one
    pass's layout and schedule, the dtypes of the output and the log-normaliser, the launch plan
    for packed operands (``None`` where there is none), whether the schedule runs the one pass and
    whether it is the small-graph rule's (whose pass a graph with a hub does not run: see
    :func:`_has_hub`); decided as every operator is (:func:`~pyg_ugrapher.ops.cached_decision`). A measured decision
    times each candidate as it would run: in one pass where it can, else as the three operators
    with the candidate for the output's."""
    arrays = graph_arrays(structure)
    device = x.device
    text = ops.one_pass_text

    def decide() -> Tuple:
        layout = layout_of(text, operands)
        dtypes = (reference.result_dtype(operands), reference.result_dtype(columns))

        def run(candidate: ParallelInfo) -> object:
            both = triton_kernels.run_softmax(
                ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, candidate, dtypes
            )
            return (
                both
                if both is not None
                else _three_passes(structure, ops, columns, x, extra, output_schedule=candidate.serialize())
            )

        small = selection.graph_independent(arrays.csr, device)
        if small:
            # A small GPU graph: one pass over its grouped rows (see small_graph_softmax_schedule).
            chosen = small_graph_softmax_schedule(layout.message_width)
        else:
            chosen = schedule_for(ops.one_pass, layout, arrays.csr, dtypes[0], device, AUTO, run, "one pass")
        plan = triton_kernels.prepare_softmax(
            ops.value, ops.logit, ops.one_pass.inputs, layout, operands, chosen, dtypes
        )
        return layout, chosen, dtypes, plan, triton_kernels.runs_softmax(layout, chosen), small

    return (arrays,) + cached_decision(arrays.csr, device, AUTO, ("one pass", text, device), operands, decide)


def _has_hub(csr) -> bool:
    """Whether ``csr`` is known to have a row of more than :data:`SOFTMAX_ONE_PASS_MAX_ROW` edges
    (:func:`~pyg_ugrapher.structure.largest_row`; not known yet: no)."""
    largest = largest_row(csr)
    return largest is not None and largest > SOFTMAX_ONE_PASS_MAX_ROW


def _forward(
    structure: GraphStructure,
    score: str,
    scores: Sequence[Tensor],
    x: Tensor,
    keep: Optional[Tensor],
    graph: Optional[GraphTensor] = None,
) -> Tuple[Tensor, Tensor]:
    """``(out, log-normaliser)``: in one pass over the edges where the schedule decided for it
    runs one (:mod:`triton_kernels.vertex_softmax`), else by the three forward operators
    (observers of ``ug.plan`` are told about what runs when the ``graph`` is given)."""
    ops = attention_ops(score, keep is not None)
    # [rows, H] as [rows, H, 1], the operators' shape for per-head values
    columns = [t.unsqueeze(-1) for t in scores]
    extra = [] if keep is None else [keep.unsqueeze(-1)]
    if not uses_triton(x.device):
        return _three_passes(structure, ops, columns, x, extra, graph)
    operands = [x] + columns + extra
    arrays, layout, chosen, dtypes, plan, one_pass, small = _one_pass_decision(
        structure, ops, operands, columns, x, extra
    )
    if not one_pass or (small and _has_hub(arrays.csr)):
        return _three_passes(structure, ops, columns, x, extra, graph)
    if graph is not None and observed():  # the source is generated text, rendered only for observers
        notify(
            graph,
            ops.one_pass,
            operands,
            layout,
            chosen,
            triton_kernels.softmax_source(
                ops.value, ops.logit, ops.one_pass.inputs, layout, chosen, dtypes[0] == torch.float64
            ),
        )
    both = plan(arrays, operands) if plan is not None and all_packed(operands) else None
    if both is None:
        both = triton_kernels.run_softmax(
            ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, chosen, dtypes
        )
    return both


def _backward(
    structure: GraphStructure,
    score: str,
    scores: Sequence[Tensor],
    x: Tensor,
    keep: Optional[Tensor],
    normaliser: Tensor,
    out: Tensor,
    grad: Tensor,
    needs_scores: Sequence[bool],
    needs_x: bool,
) -> Tuple[List[Optional[Tensor]], Optional[Tensor]]:
    """``(gradient of each score operand, grad_x)`` of the closed form (``None`` where not needed)."""
    ops = attention_ops(score, keep is not None)
    grad = grad.contiguous()
    extra = [] if keep is None else [keep.unsqueeze(-1)]
    columns = [t.unsqueeze(-1) for t in scores]
    reversed_ = structure.reverse()
    needs_logits = any(needs_scores)
    grad_x = None
    grad_x_operands = [grad] + _operands(columns, ops) + [normaliser] + extra
    if needs_x and needs_logits:
        grad_x, products = run_gather_with_edge_output(
            reversed_, grad_x_operands, ops.grad_x_text, [x, grad], _DOT_REVERSED, AUTO, AUTO
        )
    elif needs_x:
        grad_x = run_graph_op(reversed_, grad_x_operands, ops.grad_x_text, AUTO)
    elif needs_logits:
        products = run_graph_op(structure, [x, grad], _DOT_TEXT, AUTO)
    grads: List[Optional[Tensor]] = [None] * len(scores)
    if needs_logits:
        if keep is not None:
            products = products * extra[0]
        # [rows, H, 1] each, as the operators read them
        total = head_dot(out, grad) if uses_triton(out.device) else (out * grad).sum(dim=-1, keepdim=True)
        # What feeds the slots: the score's operands by their index, the rest by name.
        values = dict(enumerate(columns), normaliser=normaliser, products=products, total=total)
        for i, step in enumerate(ops.score_grads):
            if needs_scores[i]:
                inputs = [values[source] for source in step.sources]
                for slot in step.edge_slots:  # a view per operator, as _operands makes them
                    inputs[slot] = inputs[slot].view_as(inputs[slot])
                grads[i] = run_graph_op(reversed_ if step.reverse else structure, inputs, step.text, AUTO).squeeze(-1)
    return grads, grad_x


class _SoftmaxAggregate(torch.autograd.Function):
    """The eager path: an autograd Function costs less host time per call than a custom op. The
    structure record is kept as an attribute, as :class:`~pyg_ugrapher.ops.autograd._EagerGraphOp` keeps it.
    What is not a tensor comes in one argument, ``(graph, score, structure, number of scores)``:
    ``apply`` makes Python calls for each argument."""

    @staticmethod
    def forward(ctx, call: Tuple[GraphTensor, str, GraphStructure, int], *tensors: Tensor) -> Tensor:
        graph, score, structure, num_scores = call
        scores = list(tensors[:num_scores])
        x, keep = tensors[num_scores:]
        out, normaliser = _forward(structure, score, scores, x, keep, graph)
        ctx.score, ctx.structure, ctx.num_scores = score, structure, num_scores
        ctx.save_for_backward(*scores, x, keep, normaliser, out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        saved = ctx.saved_tensors
        k = ctx.num_scores
        needs = ctx.needs_input_grad[1 : k + 2]  # after the call's non-tensors: the scores and x
        if torch.is_grad_enabled():  # a double backward: the closed form's kernels have no derivative
            grads, grad_x = _differentiable_backward(
                ctx.structure, ctx.score, saved[:k], saved[k], saved[k + 1], grad, needs
            )
        else:
            grads, grad_x = _backward(ctx.structure, ctx.score, saved[:k], *saved[k:], grad, needs[:k], needs[k])
        return (None,) + tuple(grads) + (grad_x, None)


def _differentiable_backward(
    structure: GraphStructure,
    score: str,
    scores: Sequence[Tensor],
    x: Tensor,
    keep: Optional[Tensor],
    grad: Tensor,
    needs: Sequence[bool],
) -> Tuple[List[Optional[Tensor]], Optional[Tensor]]:
    """``(gradient of each score operand, grad_x)`` as a graph of differentiable operators: the
    three forward operators again, each with its own derivative, differentiated by autograd. What
    a double backward (``create_graph=True``, a gradient penalty) needs: under
    ``once_differentiable`` the closed form's second-order terms were dropped without an error
    whenever the upstream gradient needed none."""
    extra = [] if keep is None else [keep.unsqueeze(-1)]
    out, _ = _three_passes(
        structure,
        attention_ops(score, keep is not None),
        [t.unsqueeze(-1) for t in scores],
        x,
        extra,
        run_op=differentiable_graph_op,
    )
    wanted = [t for t, need in zip(list(scores) + [x], needs) if need]
    found = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
    grads = [next(found) if need else None for need in needs]
    return grads[:-1], grads[-1]


# -- the same, as custom ops: what a compiled graph calls (one opaque node each way) ---------------
def _softmax_aggregate(
    structure: List[Tensor], scores: List[Tensor], x: Tensor, keep: Optional[Tensor], score: str
) -> List[Tensor]:
    """``[out, log-normaliser]`` of :func:`softmax_aggregate` on a graph given by its flattened
    structure (:meth:`~pyg_ugrapher.structure.GraphStructure.flat`), for the serialised score op
    ``score`` (:data:`GIVEN_LOGITS` for given logits); differentiable with respect to ``scores`` and
    ``x`` (once)."""
    return list(_forward(GraphStructure.from_flat(structure), score, scores, x, keep))


def _softmax_aggregate_fake(
    structure: List[Tensor], scores: List[Tensor], x: Tensor, keep: Optional[Tensor], score: str
) -> List[Tensor]:
    rows = GraphStructure.from_flat(structure, user_order=False).num_dst
    return [x.new_empty((rows,) + tuple(x.shape[1:])), scores[0].new_empty((rows, scores[0].shape[1], 1))]


def _softmax_aggregate_backward(
    structure: List[Tensor],
    scores: List[Tensor],
    x: Tensor,
    keep: Optional[Tensor],
    normaliser: Tensor,
    out: Tensor,
    grad: Tensor,
    score: str,
    needs_scores: List[bool],
    needs_x: bool,
) -> List[Tensor]:
    grads, grad_x = _backward(
        GraphStructure.from_flat(structure), score, scores, x, keep, normaliser, out, grad, needs_scores, needs_x
    )
    # A custom op returns tensors: an empty one stands for a gradient not asked for.
    return [g if g is not None else t.new_empty(0) for g, t in zip(grads + [grad_x], list(scores) + [x])]


def _softmax_aggregate_backward_fake(
    structure: List[Tensor],
    scores: List[Tensor],
    x: Tensor,
    keep: Optional[Tensor],
    normaliser: Tensor,
    out: Tensor,
    grad: Tensor,
    score: str,
    needs_scores: List[bool],
    needs_x: bool,
) -> List[Tensor]:
    return [
        torch.empty_like(t) if needed else t.new_empty(0)
        for t, needed in zip(list(scores) + [x], list(needs_scores) + [needs_x])
    ]


softmax_aggregate_op, recordable_softmax_aggregate_op = recordable_pair(
    "softmax_aggregate", _softmax_aggregate, _softmax_aggregate_fake
)
_backward_op, _recordable_backward_op = recordable_pair(
    "softmax_aggregate_backward", _softmax_aggregate_backward, _softmax_aggregate_backward_fake
)


def call_softmax_aggregate(
    structure: GraphStructure, scores: List[Tensor], x: Tensor, keep: Optional[Tensor], score: str
) -> Tensor:
    """The output of :func:`softmax_aggregate_op` on a structure record (the custom op takes it
    flattened), or of its recordable twin on a graph that :func:`~pyg_ugrapher.graph.recordable`
    admits: what a compiled layer calls."""
    op = recordable_softmax_aggregate_op if recordable(structure) else softmax_aggregate_op
    return op(structure.flat(), scores, x, keep, score)[0]


def _setup_context(ctx, inputs, output) -> None:
    structure, scores, x, keep, score = inputs
    ctx.score, ctx.num_structure, ctx.num_scores = score, len(structure), len(scores)
    out, normaliser = output
    ctx.save_for_backward(*structure, *scores, x, keep, normaliser, out)


def _op_backward(ctx, grads: List[Optional[Tensor]]):
    grad = grads[0]  # the log-normaliser is an output only to be saved: its gradient is unused
    saved = ctx.saved_tensors
    n, k = ctx.num_structure, ctx.num_scores
    needs_scores, needs_x = list(ctx.needs_input_grad[1]), ctx.needs_input_grad[2]
    structure = list(saved[:n])
    backward_op = _recordable_backward_op if recordable(GraphStructure.from_flat(structure)) else _backward_op
    results = backward_op(structure, list(saved[n : n + k]), *saved[n + k :], grad, ctx.score, needs_scores, needs_x)
    score_grads = [g if needed else None for g, needed in zip(results[:k], needs_scores)]
    return [None] * n, score_grads, results[k] if needs_x else None, None, None


for _op in (softmax_aggregate_op, recordable_softmax_aggregate_op):
    _op.register_autograd(_op_backward, setup_context=_setup_context)


def _check_scores(
    graph: GraphTensor, logits: Union[Tensor, Sequence[Tensor]], score: Optional[OpInfo]
) -> Tuple[List[Tensor], str]:
    """The score's operands and the serialised score, checked against ``graph``."""
    if score is None:
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise TypeError("logits: expected a floating-point tensor")
        if logits.dim() != 2 or logits.shape[0] != graph.num_edges:
            raise ValueError(f"logits: expected shape [num_edges={graph.num_edges}, heads], got {list(logits.shape)}")
        return [logits], _GIVEN_LOGITS_TEXT
    if not isinstance(score, OpInfo) or score.gather_op is not None or score.reduces:
        raise TypeError(f"score: expected a message op (OpInfo without a gather op or reduction), got {score!r}")
    if isinstance(logits, Tensor) or not isinstance(logits, (list, tuple)) or len(logits) != len(score.inputs):
        raise TypeError(f"logits: expected a list of the {len(score.inputs)} operands of {score.name}")
    rows_of = rows_by_kind(graph)
    heads = None
    for i, (tensor, kind) in enumerate(zip(logits, score.inputs)):
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise TypeError(f"logits[{i}]: expected a floating-point tensor")
        name, rows = rows_of[kind]
        heads = tensor.shape[-1] if heads is None else heads
        if tensor.dim() != 2 or tensor.shape != (rows, heads):
            raise ValueError(
                f"logits[{i}]: expected shape [{name}={rows}, heads={heads}] ({kind}), got {list(tensor.shape)}"
            )
    # Dynamo traces through an lru_cache (and warns): a compiled graph serialises once, at trace time.
    return list(logits), score.serialize() if torch.compiler.is_compiling() else serialized(score)


def softmax_aggregate(
    graph: GraphTensor,
    logits: Union[Tensor, Sequence[Tensor]],
    x: Tensor,
    keep: Optional[Tensor] = None,
    score: Optional[OpInfo] = None,
) -> Tensor:
    r"""``out[v] = sum over edges e = (u, v) of softmax_v(logits)[e] * keep[e] * x[u]``, per head.

    Args:
        graph: the graph (rows of edge tensors in its edge order).
        logits: ``[E, H]`` attention logits; with ``score``, the list of its operands instead, one
            ``[rows, H]`` tensor per slot (``num_src``, ``num_dst`` or ``E`` rows by its kind).
        x: ``[num_src, H, C]`` source features.
        keep: optional ``[E, H]`` dropout scale of each coefficient (0, or ``1 / (1 - p)``).
        score: optional message op (``gather_op=None``) computing each edge's logits from
            ``logits``, e.g. GAT's ``leaky_relu(u0 + v1)``; it is recomputed wherever it is needed,
            never stored.

    Returns:
        ``[num_dst, H, C]``; differentiable with respect to ``logits`` and ``x`` (once).
    """
    if not isinstance(graph, GraphTensor):
        raise TypeError(f"graph: expected a GraphTensor, got {type(graph).__name__}")
    scores, text = _check_scores(graph, logits, score)
    heads = scores[0].shape[1]
    for name, tensor in (("x", x), ("keep", keep)):
        if tensor is not None and (not isinstance(tensor, Tensor) or not tensor.is_floating_point()):
            raise TypeError(f"{name}: expected a floating-point tensor")
    if x.dim() != 3 or x.shape[0] != graph.num_src or x.shape[1] != heads:
        raise ValueError(f"x: expected shape [num_src={graph.num_src}, heads={heads}, channels], got {list(x.shape)}")
    if keep is not None and keep.shape != (graph.num_edges, heads):
        raise ValueError(f"keep: expected shape [num_edges={graph.num_edges}, heads={heads}], got {list(keep.shape)}")
    return softmax_aggregate_unchecked(graph, scores, x, keep, text)


def softmax_aggregate_unchecked(
    graph: GraphTensor, scores: List[Tensor], x: Tensor, keep: Optional[Tensor], score: str
) -> Tensor:
    """:func:`softmax_aggregate` for callers that hold the serialised ``score`` op (:data:`GIVEN_LOGITS`'s
    for given logits) and pass the list of its operands, each of the shape that function checks
    (the layers): the same observers and autograd, without the checks."""
    if torch.compiler.is_compiling():
        return call_softmax_aggregate(graph.structure(x.device), scores, x, keep, score)
    return _SoftmaxAggregate.apply((graph, score, graph.eager_structure(x.device), len(scores)), *scores, x, keep)
