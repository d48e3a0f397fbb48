"""The reference executor: every :class:`~pyg_ugrapher.ir.OpInfo` in plain PyTorch.

It materialises one message per edge (``index_select``), evaluates the edge function with torch
operations and reduces with ``scatter_reduce``. Half-precision inputs are computed in float32 and
the result cast back. Isolated destinations get 0 for every gather op, as in PyG. It is the oracle
of the test suite, differentiable through torch's own autograd, and the CPU execution path.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .graph import GraphTensor
from .ir import Expr, OpInfo
from .layout import Layout, infer_layout
from .structure import GraphStructure

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


def evaluate(expr: Expr, inputs: Sequence[Tensor]) -> Tensor:
    """Evaluate an edge function on already gathered, broadcastable operand tensors."""
    if expr.fn == "input":
        return inputs[expr.index]
    if expr.fn == "const":
        return torch.tensor(
            expr.value, dtype=inputs[0].dtype if inputs else torch.float32, device=inputs[0].device if inputs else None
        )
    if expr.fn in TORCH_PARAMETRIZED_FNS:
        return TORCH_PARAMETRIZED_FNS[expr.fn](evaluate(expr.args[0], inputs), expr.args[1].value)
    return TORCH_FNS[expr.fn](*(evaluate(arg, inputs) for arg in expr.args))


def result_dtype(operands: Sequence[Tensor]) -> torch.dtype:
    dtype = operands[0].dtype
    for tensor in operands[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def messages(
    graph: Union[GraphTensor, GraphStructure],
    op: OpInfo,
    operands: Sequence[Tensor],
    layout: Layout,
    dtype: torch.dtype,
) -> Tensor:
    """``[E, *out_shape]`` messages in the user's edge order, in ``dtype``."""
    num_edges = graph.src.shape[0]
    gathered = []
    for kind, tensor in zip(op.inputs, operands):
        features = tensor.shape[1:]
        # Widened before the gather: its backward sums each vertex's gradients (a scatter-add),
        # which in a half type would round at every add, in an order the GPU does not fix.
        wide = tensor.to(dtype)
        if kind != "edge":
            wide = wide.index_select(0, (graph.src if kind == "src_v" else graph.dst).to(tensor.device))
        if features != layout.message_shape:  # broadcast: leading feature sizes of 1
            wide = wide.reshape((num_edges,) + (1,) * (len(layout.message_shape) - len(features)) + features)
        gathered.append(wide)
    out = evaluate(op.expr, gathered)
    out = out.expand((num_edges,) + layout.message_shape)
    if op.reduces:
        out = out.sum(dim=-1, keepdim=True)
    return out


def execute(
    graph: Union[GraphTensor, GraphStructure],
    op: OpInfo,
    operands: Sequence[Tensor],
    layout: Optional[Layout] = None,
) -> Tensor:
    """Run ``op`` on ``graph`` (a graph, or its structure on the operands' device); operands are
    in slot order (see :attr:`OpInfo.inputs`); ``layout``: theirs, where the caller has it."""
    if layout is None:
        layout = infer_layout(op, [t.shape for t in operands])
    out_dtype = result_dtype(operands)
    # Operands are floating point: one of them is float64 exactly when the promoted dtype is.
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    msg = messages(graph, op, operands, layout, acc)
    if op.gather_op is None:
        return msg.to(out_dtype)
    num_dst = graph.num_dst
    # scatter_add's index is int64; a structure's may be int32.
    dst = graph.dst.to(msg.device, torch.int64)
    out = msg.new_zeros((num_dst,) + layout.out_shape)
    ones = (1,) * len(layout.out_shape)
    index = dst.view((-1,) + ones).expand_as(msg)
    if op.gather_op in ("sum", "mean"):
        out = out.scatter_add(0, index, msg)
        if op.gather_op == "mean":
            degree = torch.bincount(dst, minlength=num_dst).clamp_min(1).to(acc)
            out = out / degree.view((-1,) + ones)
    else:
        out = out.scatter_reduce(0, index, msg, reduce="amax" if op.gather_op == "max" else "amin", include_self=False)
    return out.to(out_dtype)
