r"""The backward pass of every operator, expressed as operators of the same IR.

For an operator with edge function :math:`\phi(x_0, \dots, x_{n-1})` and upstream gradient
:math:`G` (per destination for a gather op, per edge for message creation), the gradient message
to operand slot :math:`i` is :math:`G \cdot \partial\phi/\partial x_i`, an elementwise expression
over the same operands plus :math:`G`. It is routed with one IR operator, chosen by the slot's kind:

* source vertices: a gather-sum on the **reversed** graph (the cached CSC);
* destination vertices: a gather-sum on the graph itself;
* edges: message creation (a reducing one, like ``u_dot_v``, when the edge operand is broadcast
  over the last feature dimension).

``mean`` scales :math:`G` by the inverse in-degree first (isolated vertices get no gradient).
When one slot's gradient is a gather on the reversed graph and another's a message op (GAT's
``dx`` and ``d alpha``, ``u_mul_e_sum``'s ``dlhs`` and ``drhs``), both read the upstream gradient
of every edge's destination; :attr:`Backward.shared_pass` names them, and the frontend runs the
message op on the reversed graph (:func:`on_reversed`) inside the gather's kernel.

``max``/``min`` route :math:`G` to the edges whose message equals the result, split evenly among
ties as ``torch.scatter_reduce(include_self=False)`` does: one extra gather-sum counts the ties
(``eq(phi, out)``), and the routed message is ``eq(phi, out) * (G / count) * dphi/dx_i``. This
needs no stored arg-index and works under every strategy, atomics included.

Only IR is built here (:class:`GradStep`); :mod:`pyg_ugrapher.ops` runs the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple, Union

from .ir import EDGE_OPS, GATHER_OPS, Expr, OpInfo

#: A value feeding a gradient step: an operand slot of the forward op, or one of the tensors the
#: backward computes ("grad": the (scaled) upstream gradient, "out": the forward output).
Source = Union[int, str]

_SWAP = {"src_v": "dst_v", "dst_v": "src_v", "edge": "edge"}


@dataclass(frozen=True)
class GradStep:
    """One IR operator of the backward pass.

    Args:
        op: the operator to run.
        reverse: run it on the reversed graph.
        sources: what feeds each operand slot of ``op``.
    """

    op: OpInfo
    reverse: bool
    sources: Tuple[Source, ...]


@dataclass(frozen=True)
class Backward:
    """The backward of one forward op: an optional tie-count step, then one step per slot."""

    count: Optional[GradStep]  #: max/min only: per destination, how many messages equal the result
    slots: Tuple[GradStep, ...]  #: the gradient of each forward operand slot
    #: ``(i, j)``: slot ``i``'s step gathers on the reversed graph and slot ``j``'s creates
    #: messages; one pass over the reversed graph can compute both.
    shared_pass: Optional[Tuple[int, int]] = None


@lru_cache(maxsize=None)
def on_reversed(op: OpInfo) -> OpInfo:
    """``op`` with source and destination operands swapped: the same per-edge values, computed
    on the reversed graph."""
    if op.is_builtin:
        return OpInfo(op.edge_op, op.gather_op, lhs=op.lhs and _SWAP[op.lhs], rhs=op.rhs and _SWAP[op.rhs])
    return OpInfo(op.expr, op.gather_op, operands=tuple(_SWAP[k] for k in op.inputs), reduce=op.reduces)


def canonical(expr: Expr, kinds: Tuple[str, ...], gather_op: Optional[str], reduce: bool) -> OpInfo:
    """An OpInfo for ``expr``; built-in (``u_mul_e_sum``, ``copy_e_sum``...) where it is one, so that
    backward ops read like the forward ones and share their kernels and cost-model data."""
    if not reduce and expr.fn == "input" and len(kinds) == 1:
        return OpInfo("copy_lhs", gather_op, lhs=kinds[0])
    binary = (
        expr.fn in ("add", "sub", "mul", "div")
        and len(kinds) == 2
        and tuple(a.fn for a in expr.args) == ("input", "input")
        and tuple(a.index for a in expr.args) == (0, 1)
    )
    if binary and (not reduce or expr.fn == "mul"):
        return OpInfo("dot" if reduce else expr.fn, gather_op, lhs=kinds[0], rhs=kinds[1])
    return OpInfo(expr, gather_op, operands=kinds, reduce=reduce)


def grad_step(
    expr: Expr,
    kinds: Tuple[str, ...],
    sources: Tuple[Source, ...],
    gather_op: Optional[str],
    reduce: bool,
    reverse: bool,
) -> GradStep:
    """The step routing the gradient message ``expr`` (over slots of ``kinds``, fed by ``sources``):
    only the slots ``expr`` reads are kept, renumbered in the order they appear."""
    order = list(expr.inputs())
    if expr.fn in ("add", "sub", "mul", "div") and all(a.fn == "input" for a in expr.args):
        order = [a.index for a in expr.args] if len(order) == 2 else order
    expr = expr.remap({old: new for new, old in enumerate(order)})
    kinds = tuple(_SWAP[kinds[i]] if reverse else kinds[i] for i in order)
    return GradStep(canonical(expr, kinds, gather_op, reduce), reverse, tuple(sources[i] for i in order))


@lru_cache(maxsize=None)
def derive(op: OpInfo, reduce_edge_slots: Tuple[bool, ...]) -> Backward:
    """The backward of ``op``.

    ``reduce_edge_slots[i]`` says that edge slot ``i`` is broadcast only over the last feature
    dimension (one value per head, or per edge), so its gradient is a reducing message op instead
    of a materialised ``[E, features]`` message followed by a sum.
    """
    n = len(op.inputs)
    kinds = op.inputs + (("dst_v",) if op.gather_op else ("edge",))
    sources: Tuple[Source, ...] = tuple(range(n)) + ("grad",)
    grad = Expr.input(n)
    count = None
    if op.gather_op in ("max", "min"):
        out = Expr.input(n + 1)
        kinds = kinds + ("dst_v",)
        sources = sources + ("out",)
        winner = Expr.apply("eq", op.expr, out)
        count = grad_step(winner, kinds, sources, "sum", False, False)
        grad = winner * grad
    steps = []
    for i, kind in enumerate(op.inputs):
        message = grad * op.expr.grad(i)
        if kind == "src_v":
            steps.append(grad_step(message, kinds, sources, "sum", False, True))
        elif kind == "dst_v":
            steps.append(grad_step(message, kinds, sources, "sum", False, False))
        else:
            steps.append(grad_step(message, kinds, sources, None, reduce_edge_slots[i], False))
    # A step without sources routes a derivative that is identically 0 (``ops`` fills zeros).
    gathers = [i for i, step in enumerate(steps) if step.reverse and step.sources]
    messages = [i for i, step in enumerate(steps) if step.op.gather_op is None and step.sources]
    shared = (gathers[0], messages[0]) if gathers and messages else None
    return Backward(count, tuple(steps), shared)


def describe(op: OpInfo) -> str:
    """Which IR op computes each gradient when every operand has the full feature shape (for the
    docs' backward table)."""
    backward = derive(op, (False,) * len(op.inputs))
    names = ("lhs", "rhs") if op.is_builtin else tuple(f"in{i}" for i in range(len(op.inputs)))
    parts = []
    if backward.count is not None:
        parts.append(f"ties: {backward.count.op.name}")
    for name, step in zip(names, backward.slots):
        where = " on the reversed graph" if step.reverse else ""
        parts.append(f"d{name}: {step.op.name}{where}")
    return "; ".join(parts)


def backward_table() -> str:
    """The backward table of ``docs/backward.md`` (Markdown): for every edge op x gather op of the
    IR, the IR ops that compute each gradient, with full-shape operands. ``lhs`` reads the source
    vertex; ``rhs`` the edge for a gather op and the destination vertex for message creation.

    Regenerate that section with ``python -m pyg_ugrapher.backward``.
    """

    def cell(step: Optional[GradStep]) -> str:
        if step is None:
            return "-"
        return f"`{step.op.name}`" + (" (reversed)" if step.reverse else "")

    lines = ["| forward | d lhs | d rhs | ties (max/min) |", "| --- | --- | --- | --- |"]
    for edge_op in EDGE_OPS:
        for gather_op in GATHER_OPS + (None,):
            if edge_op == "dot" and gather_op is not None:
                continue
            lhs = None if edge_op == "copy_rhs" else "src_v"
            rhs = None if edge_op == "copy_lhs" else ("edge" if gather_op else "dst_v")
            op = OpInfo(edge_op, gather_op, lhs=lhs, rhs=rhs)
            backward = derive(op, (False,) * len(op.inputs))
            slots = dict(zip([name for name, kind in (("lhs", lhs), ("rhs", rhs)) if kind], backward.slots))
            lines.append(
                f"| `{op.name}` | {cell(slots.get('lhs'))} | {cell(slots.get('rhs'))} | {cell(backward.count)} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(backward_table())
