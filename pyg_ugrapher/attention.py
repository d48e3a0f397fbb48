r"""Softmax-weighted aggregation over incoming edges (GAT's attention), with a closed-form backward.

For edge logits :math:`s_e` (per head), node features :math:`x_u` and an optional per-edge dropout
scale :math:`k_e`:

.. math::
    m_v = \max_{e \to v} s_e, \qquad
    \alpha_e = \frac{\exp(s_e - m_v)}{\sum_{e' \to v} \exp(s_{e'} - m_v) + 10^{-16}}, \qquad
    \mathrm{out}_v = \sum_{e = (u, v)} \alpha_e \, k_e \, x_u .

The forward pass is three IR operators, none of which writes an ``[E, ...]`` tensor:
``copy_e_max`` for :math:`m`, a gather-sum of :math:`\exp(s_e - m_v)` for the denominator
:math:`z`, and a gather-sum of :math:`x_u k_e \exp(s_e - \ell_v)` for the output, with the
log-normaliser :math:`\ell_v = m_v + \log(z_v + 10^{-16})` (one destination operand instead of
:math:`m` and :math:`z`: one gather fewer per edge in the output and in the backward).

The automatic backward of :mod:`pyg_ugrapher.backward` would differentiate those three operators
one by one. Softmax has a shorter closed form: with upstream gradient :math:`G_v`,

.. math::
    \frac{\partial L}{\partial x_u} = \sum_{e = (u, v)} \alpha_e k_e G_v, \qquad
    \frac{\partial L}{\partial s_e} = \alpha_e \left(k_e \langle x_u, G_v \rangle - t_v\right),
    \qquad t_v = \sum_{e \to v} \alpha_e k_e \langle x_u, G_v \rangle = \langle \mathrm{out}_v, G_v \rangle,

so :math:`t` is a dense per-node product and the backward is three IR operators: a gather-sum on
the reversed graph, ``u_dot_v`` and one message op. The first two both read :math:`G_v` for every
edge and run as one kernel on the reversed graph (``u_dot_v`` as the kernel's edge output). The
shift :math:`m` has no gradient (softmax is shift-invariant). This is what DGL's ``edge_softmax``
followed by ``u_mul_e_sum`` computes, in fewer passes over the edges.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .graph import GraphTensor
from .ir import Expr, OpInfo
from .backward import on_reversed
from .ops import AUTO, notify, reversed_structure, run_gather_with_edge_output, run_graph_op, serialized

#: PyG's softmax adds this to the denominator: destinations without edges stay finite.
EPSILON = 1e-16


def _exp_shifted(logit: int, shift: int) -> Expr:
    return Expr.apply("exp", Expr.input(logit) - Expr.input(shift))


@lru_cache(maxsize=None)
def attention_ops(dropout: bool) -> Tuple[OpInfo, ...]:
    """The IR ops of the forward and backward passes: ``(shift, denominator, output, grad_x,
    grad_logits)``. With ``dropout`` the output and ``grad_x`` read the per-edge scale ``k``."""
    shift = OpInfo.from_name("copy_e_max")
    denominator = OpInfo(_exp_shifted(0, 1), "sum", operands=("edge", "dst_v"))
    # slots: x (src), logits (edge), log-normaliser (dst)[, k (edge)]
    weight = _exp_shifted(1, 2)
    kinds: Tuple[str, ...] = ("src_v", "edge", "dst_v")
    if dropout:
        weight = weight * Expr.input(3)
        kinds += ("edge",)
    output = OpInfo(Expr.input(0) * weight, "sum", operands=kinds)
    # On the reversed graph the destination's tensors are read as sources.
    # slots: G (src), logits (edge), log-normaliser (src)[, k (edge)]
    back_kinds = tuple({"src_v": "dst_v", "dst_v": "src_v"}.get(kind, kind) for kind in kinds)
    grad_x = OpInfo(Expr.input(0) * weight, "sum", operands=("src_v",) + back_kinds[1:])
    # slots: logits (edge), log-normaliser (dst), k * <x_u, G_v> (edge), t (dst)
    grad_logits = OpInfo(_exp_shifted(0, 1) * (Expr.input(2) - Expr.input(3)), None,
                         operands=("edge", "dst_v", "edge", "dst_v"))
    return shift, denominator, output, grad_x, grad_logits


_DOT = OpInfo.from_name("u_dot_v")
_DOT_REVERSED = on_reversed(_DOT).serialize()


def _run(structure: List[Tensor], op: OpInfo, operands: List[Tensor]) -> Tensor:
    return run_graph_op(structure, operands, serialized(op), AUTO)


def _column(tensor: Tensor) -> Tensor:
    """``tensor`` as ``[rows, H, 1]``, a new view per operator: the dispatcher permutes a narrow
    edge operand into CSR order when the same tensor object comes back (static edge weights,
    reused every step); logits used by three operators of one step would pay that permutation
    (2.8 ms for ``[4e6, 4]`` on the H100, more than the operator) and never see it again."""
    return tensor.unsqueeze(-1)


def _forward(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor],
             graph: Optional[GraphTensor] = None) -> Tuple[Tensor, Tensor]:
    """``(out, log-normaliser)``: the three forward operators (observers of ``ug.plan`` are told
    about each one when the ``graph`` is given)."""
    shift_op, denominator_op, output_op, _, _ = attention_ops(keep is not None)

    def run(op: OpInfo, operands: List[Tensor]) -> Tensor:
        if graph is not None:
            notify(graph, op, operands)
        return _run(structure, op, operands)

    shift = run(shift_op, [_column(logits)])
    normaliser = shift + (run(denominator_op, [_column(logits), shift]) + EPSILON).log()
    extra = [] if keep is None else [_column(keep)]
    return run(output_op, [x, _column(logits), normaliser] + extra), normaliser


def _backward(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor], normaliser: Tensor,
              out: Tensor, grad: Tensor, needs_logits: bool, needs_x: bool
              ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``(grad_logits, grad_x)`` of the closed form (``None`` where not needed)."""
    _, _, _, grad_x_op, grad_logits_op = attention_ops(keep is not None)
    grad = grad.contiguous()
    extra = [] if keep is None else [_column(keep)]
    grad_x = grad_logits = None
    grad_x_operands = [grad, _column(logits), normaliser] + extra
    if needs_x and needs_logits:
        grad_x, products = run_gather_with_edge_output(
            reversed_structure(structure), grad_x_operands, serialized(grad_x_op), [x, grad], _DOT_REVERSED, AUTO, AUTO)
    elif needs_x:
        grad_x = _run(reversed_structure(structure), grad_x_op, grad_x_operands)
    elif needs_logits:
        products = _run(structure, _DOT, [x, grad])
    if needs_logits:
        if keep is not None:
            products = products * _column(keep)
        total = (out * grad).sum(dim=-1, keepdim=True)
        grad_logits = _run(structure, grad_logits_op, [_column(logits), normaliser, products, total]).squeeze(-1)
    return grad_logits, grad_x


class _SoftmaxAggregate(torch.autograd.Function):
    """The eager path: an autograd Function costs less host time per call than a custom op."""

    @staticmethod
    def forward(ctx, graph: GraphTensor, num_structure: int, *tensors: Tensor) -> Tensor:
        structure = list(tensors[:num_structure])
        logits, x, keep = tensors[num_structure:]
        out, normaliser = _forward(structure, logits, x, keep, graph)
        ctx.num_structure = num_structure
        ctx.save_for_backward(*structure, logits, x, keep, normaliser, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        saved = ctx.saved_tensors
        structure = list(saved[:ctx.num_structure])
        needs_logits, needs_x = ctx.needs_input_grad[ctx.num_structure + 2:ctx.num_structure + 4]
        grad_logits, grad_x = _backward(structure, *saved[ctx.num_structure:], grad, needs_logits, needs_x)
        return (None, None) + (None,) * ctx.num_structure + (grad_logits, grad_x, None)


# -- the same, as custom ops: what a compiled graph calls (one opaque node each way) ---------------
@torch.library.custom_op("pyg_ugrapher::softmax_aggregate", mutates_args=())
def softmax_aggregate_op(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor]) -> List[Tensor]:
    """``[out, log-normaliser]`` of :func:`softmax_aggregate` on a graph given by its structure
    list; differentiable with respect to ``logits`` and ``x`` (once)."""
    return list(_forward(structure, logits, x, keep))


@softmax_aggregate_op.register_fake
def _(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor]) -> List[Tensor]:
    rows = structure[0].shape[0] - 1
    return [x.new_empty((rows,) + tuple(x.shape[1:])), logits.new_empty((rows, logits.shape[1], 1))]


@torch.library.custom_op("pyg_ugrapher::softmax_aggregate_backward", mutates_args=())
def _backward_op(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor], normaliser: Tensor,
                 out: Tensor, grad: Tensor, needs_logits: bool, needs_x: bool) -> List[Tensor]:
    grads = _backward(structure, logits, x, keep, normaliser, out, grad, needs_logits, needs_x)
    # A custom op returns tensors: an empty one stands for a gradient not asked for.
    return [g if g is not None else t.new_empty(0) for g, t in zip(grads, (logits, x))]


@_backward_op.register_fake
def _(structure: List[Tensor], logits: Tensor, x: Tensor, keep: Optional[Tensor], normaliser: Tensor,
      out: Tensor, grad: Tensor, needs_logits: bool, needs_x: bool) -> List[Tensor]:
    return [torch.empty_like(logits) if needs_logits else logits.new_empty(0),
            torch.empty_like(x) if needs_x else x.new_empty(0)]


def _setup_context(ctx, inputs, output) -> None:
    structure, logits, x, keep = inputs
    ctx.num_structure = len(structure)
    out, normaliser = output
    ctx.save_for_backward(*structure, logits, x, keep, normaliser, out)


def _op_backward(ctx, grads: List[Optional[Tensor]]):
    grad = grads[0]  # the log-normaliser is an output only to be saved: its gradient is unused
    saved = ctx.saved_tensors
    structure = list(saved[:ctx.num_structure])
    needs_logits, needs_x = ctx.needs_input_grad[1:3]
    grad_logits, grad_x = _backward_op(structure, *saved[ctx.num_structure:], grad, needs_logits, needs_x)
    return [None] * ctx.num_structure, grad_logits if needs_logits else None, grad_x if needs_x else None, None


torch.library.register_autograd("pyg_ugrapher::softmax_aggregate", _op_backward, setup_context=_setup_context)


def softmax_aggregate(graph: GraphTensor, logits: Tensor, x: Tensor, keep: Optional[Tensor] = None) -> Tensor:
    r"""``out[v] = sum over edges e = (u, v) of softmax_v(logits)[e] * keep[e] * x[u]``, per head.

    Args:
        graph: the graph (rows of ``logits`` and ``keep`` in its edge order).
        logits: ``[E, H]`` attention logits.
        x: ``[num_src, H, C]`` source features.
        keep: optional ``[E, H]`` dropout scale of each coefficient (0, or ``1 / (1 - p)``).

    Returns:
        ``[num_dst, H, C]``; differentiable with respect to ``logits`` and ``x`` (once).
    """
    if not isinstance(graph, GraphTensor):
        raise TypeError(f"graph: expected a GraphTensor, got {type(graph).__name__}")
    for name, tensor in (("logits", logits), ("x", x), ("keep", keep)):
        if tensor is not None and (not isinstance(tensor, Tensor) or not tensor.is_floating_point()):
            raise TypeError(f"{name}: expected a floating-point tensor")
    if logits.dim() != 2 or logits.shape[0] != graph.num_edges:
        raise ValueError(f"logits: expected shape [num_edges={graph.num_edges}, heads], got {list(logits.shape)}")
    heads = logits.shape[1]
    if x.dim() != 3 or x.shape[0] != graph.num_src or x.shape[1] != heads:
        raise ValueError(f"x: expected shape [num_src={graph.num_src}, heads={heads}, channels], "
                         f"got {list(x.shape)}")
    if keep is not None and keep.shape != logits.shape:
        raise ValueError(f"keep: expected the shape of logits {list(logits.shape)}, got {list(keep.shape)}")
    structure = graph.structure(x.device)
    if torch.compiler.is_compiling():
        return softmax_aggregate_op(structure, logits, x, keep)[0]
    return _SoftmaxAggregate.apply(graph, len(structure), *structure, logits, x, keep)
