"""The reference executor: every :class:`~pyg_ugrapher.ir.OpInfo` in plain PyTorch.

It materialises one message per edge (``index_select``), evaluates the edge function with torch
operations and reduces with ``scatter_reduce``. Half-precision inputs are computed in float32 and
the result cast back. Isolated destinations get 0 for every gather op, as in PyG. It is the oracle
of the test suite, differentiable through torch's own autograd, and the CPU execution path.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .graph import GraphTensor
from .ir import Expr, OpInfo
from .structure import EdgeList, GraphStructure

#: What an op runs on: a graph, its structure, or its edges.
Edges = Union[GraphTensor, GraphStructure, EdgeList]

TORCH_FNS: Dict[str, Callable[..., Tensor]] = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "abs": torch.abs,
    "sqrt": torch.sqrt,
    "square": torch.square,
    "reciprocal": torch.reciprocal,
    "erf": torch.erf,
    "sin": torch.sin,
    "cos": torch.cos,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "softplus": F.softplus,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": lambda a, b: (a == b).to(torch.result_type(a, b)),
    "gt": lambda a, b: (a > b).to(torch.result_type(a, b)),
    "ge": lambda a, b: (a >= b).to(torch.result_type(a, b)),
    "where": lambda c, a, b: torch.where(c != 0, a, b),
}
#: Functions whose second argument is a constant parameter, passed as a Python number.
TORCH_PARAMETRIZED_FNS: Dict[str, Callable[[Tensor, float], Tensor]] = {
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max,
}


#: An edge function as nested tuples of names and numbers: ``("input", i)``, ``("const", value)``,
#: ``(fn, tree)`` with a constant parameter ``(fn, tree, value)`` for
#: :data:`TORCH_PARAMETRIZED_FNS`, ``(fn, *trees)`` otherwise.
Tree = Tuple[Any, ...]


class Plan(NamedTuple):
    """An op as the reference executor walks it: names and numbers only, so that ``torch.compile``
    holds a plan as a constant and traces the torch operations it stands for, where an
    :class:`~pyg_ugrapher.ir.OpInfo` is not traceable (:func:`plan`)."""

    inputs: Tuple[str, ...]  #: per operand: ``src_v``, ``dst_v`` or ``edge``
    tree: Tree  #: the edge function (:data:`Tree`)
    reduces: bool  #: the message is summed over its last feature dimension
    gather: Optional[str]  #: the gather op, ``None`` for message creation
    #: Whether the function reads every operand (its elementwise result then has the message's
    #: shape; else the result is broadcast to it).
    reads_every_operand: bool


@functools.lru_cache(maxsize=None)
def expression_tree(expr: Expr) -> Tree:
    """``expr`` as a :data:`Tree`."""
    if expr.fn == "input":
        return ("input", expr.index)
    if expr.fn == "const":
        return ("const", expr.value)
    if expr.fn in TORCH_PARAMETRIZED_FNS:
        return (expr.fn, expression_tree(expr.args[0]), expr.args[1].value)
    return (expr.fn,) + tuple(expression_tree(arg) for arg in expr.args)


@functools.lru_cache(maxsize=None)
def plan(op: OpInfo) -> Plan:
    """The :class:`Plan` of ``op``."""
    tree = expression_tree(op.expr)
    read = set(_inputs_read(tree))
    return Plan(tuple(op.inputs), tree, op.reduces, op.gather_op, read == set(range(len(op.inputs))))


def _inputs_read(tree: Tree) -> Iterator[int]:
    if tree[0] == "input":
        yield tree[1]
    elif tree[0] != "const":
        for arg in tree[1 : 2 if tree[0] in TORCH_PARAMETRIZED_FNS else None]:
            yield from _inputs_read(arg)


def evaluate(expr: Expr, inputs: Sequence[Tensor]) -> Tensor:
    """Evaluate an edge function on already gathered, broadcastable operand tensors."""
    return evaluate_tree(expression_tree(expr), inputs)


def evaluate_tree(tree: Tree, inputs: Sequence[Tensor]) -> Tensor:
    """:func:`evaluate` of an edge function's :data:`Tree`."""
    fn = tree[0]
    if fn == "input":
        return inputs[tree[1]]
    if fn == "const":
        return torch.tensor(
            tree[1], dtype=inputs[0].dtype if inputs else torch.float32, device=inputs[0].device if inputs else None
        )
    if fn in TORCH_PARAMETRIZED_FNS:
        return TORCH_PARAMETRIZED_FNS[fn](evaluate_tree(tree[1], inputs), tree[2])
    return TORCH_FNS[fn](*(evaluate_tree(arg, inputs) for arg in tree[1:]))


def result_dtype(operands: Sequence[Tensor]) -> torch.dtype:
    dtype = operands[0].dtype
    for tensor in operands[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def messages(graph: Edges, op: Plan, operands: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """``[E, *message_shape]`` messages in the user's edge order, in ``dtype`` (summed over the last
    feature dimension for a reducing op)."""
    num_edges = graph.src.shape[0]
    # Feature shapes broadcast NumPy-style (aligned on the right) to the message's
    # (pyg_ugrapher.layout): each gets leading sizes of 1 up to the largest rank.
    rank = max([tensor.dim() - 1 for tensor in operands] + [0])
    gathered = []
    for kind, tensor in zip(op.inputs, operands):
        # Widened before the gather: its backward sums each vertex's gradients (a scatter-add),
        # which in a half type would round at every add, in an order the GPU does not fix.
        wide = tensor.to(dtype)
        if kind != "edge":
            wide = wide.index_select(0, (graph.src if kind == "src_v" else graph.dst).to(tensor.device))
        if tensor.dim() - 1 < rank:
            wide = wide.reshape((num_edges,) + (1,) * (rank - tensor.dim() + 1) + tuple(tensor.shape[1:]))
        gathered.append(wide)
    out = evaluate_tree(op.tree, gathered)
    if not op.reads_every_operand:
        out = out.expand(_broadcast([tensor.shape for tensor in gathered]))
    if op.reduces:
        out = out.sum(dim=-1, keepdim=True)
    return out


def _broadcast(shapes: Sequence[torch.Size]) -> Tuple[int, ...]:
    """The broadcast of shapes of one rank that broadcast (each size equal to the others or 1;
    ``torch.broadcast_shapes`` is a few dozen Python calls)."""
    return tuple(0 if 0 in sizes else max(sizes) for sizes in zip(*shapes))


def execute(graph: Edges, op: OpInfo, operands: Sequence[Tensor]) -> Tensor:
    """Run ``op`` on ``graph`` (a graph, its structure or its edges on the operands' device); operands
    are in slot order (see :attr:`OpInfo.inputs`)."""
    return execute_plan(graph, plan(op), operands)


def execute_plan(graph: Edges, op: Plan, operands: Sequence[Tensor]) -> Tensor:
    """:func:`execute` of an op's :class:`Plan`: what a compiled layer traces on a small graph."""
    out_dtype = result_dtype(operands)
    # Operands are floating point: one of them is float64 exactly when the promoted dtype is.
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    msg = messages(graph, op, operands, acc)
    if op.gather is None:
        return msg.to(out_dtype)
    num_dst = graph.num_dst
    # scatter_add's index is int64; a structure's may be int32.
    dst = graph.dst.to(msg.device, torch.int64)
    out_shape = tuple(msg.shape[1:])
    out = msg.new_zeros((num_dst,) + out_shape)
    ones = (1,) * len(out_shape)
    index = dst.view((-1,) + ones).expand_as(msg)
    if op.gather in ("sum", "mean"):
        out = out.scatter_add(0, index, msg)
        if op.gather == "mean":
            # A sum of ones rather than bincount, whose output size depends on the values: a traced
            # mean keeps one graph.
            degree = msg.new_zeros(num_dst).index_add_(0, dst, msg.new_ones(dst.shape[0])).clamp_min_(1)
            out = out / degree.view((-1,) + ones)
    else:
        out = out.scatter_reduce(0, index, msg, reduce="amax" if op.gather == "max" else "amin", include_self=False)
    return out.to(out_dtype)
