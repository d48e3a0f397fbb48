r"""Run a ``message()`` that is not one elementwise operator as graph operators, call by call.

A ``message()`` that :func:`~pyg_ugrapher.capture.capture` cannot make one fused operator (a Linear
or an MLP on per-edge values, ``torch.cat``, PyG's segment ``softmax``, a parameter, a norm, an
index...) still computes mostly elementwise values of its arguments. A *staged* run calls it on
every propagation with the same :class:`~pyg_ugrapher.capture.TracedTensor` arguments, but on a
trace that holds the real tensors behind them (:class:`StagedTrace`):

* elementwise code stays symbolic, as in a capture;
* ``F.linear`` (``nn.Linear``, the first layer of an MLP) of a linear combination of arguments, or
  of a ``torch.cat`` of such pieces, is split by linearity into products of the node tensors
  (:math:`W [\mathbf{x}_i \| \mathbf{x}_j - \mathbf{x}_i] = (W_1 - W_2)\mathbf{x}_i + W_2
  \mathbf{x}_j`): ``N`` rows multiplied instead of ``E``, and the result stays symbolic. A piece
  that is an *edge input* (an edge feature tensor given to ``propagate()``, or a value computed from
  such tensors alone: a Linear of them, a feature view, pick or repeat of them, an elementwise
  function of them alone, the latter computed by one message-creation operator) is multiplied row
  by row, as PyG multiplies it: a transform of what the user passed in, which could as well run
  before the propagation. A product of any other per-edge value (one computed from gathered vertex
  rows, a parameter or a result of PyTorch) is a computation on per-edge values in PyTorch;
* ``torch_geometric.utils.softmax`` over the receivers of the edges is three graph operators:
  a max gather, a fused exp-sum gather and one normalising message-creation operator;
* PyG's ``SoftmaxAggregation`` of symbolic messages is three gathers whose edge functions
  recompute the messages (:meth:`StagedTrace.softmax_aggregate`): no per-edge value is written;
* a parameter or any real tensor that broadcasts against the edges joins the expression as an
  operand;
* any other call first computes its traced arguments with one message-creation operator each
  (their whole elementwise expression in one kernel) and then runs in PyTorch on the real values.

What ``message()`` returns is aggregated by one operator: fused with the message's last
elementwise part when it is symbolic, a ``copy_e`` gather of the real messages otherwise. Tensors
that ``message()`` stores on the module (``self._alpha``) are computed for real. Everything is
differentiable: the operators through their backward, the rest through PyTorch.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor
from torch.utils._pytree import tree_map
from torch_geometric.utils import softmax as pyg_softmax

from .backward import canonical
from .capture import (
    HANDLERS,
    INPLACE_OPERATORS,
    METADATA,
    SOFTMAX_EPSILON,
    Argument,
    CaptureError,
    Trace,
    TracedTensor,
    cat_arguments,
    fit_operands,
    function_name,
    linear_arguments,
    linear_terms,
    tracing,
)
from .ir import Expr
from .program import Capture, Operand, OpRunner, Shape, combine_columns

_SHIFTED = Expr.apply("exp", Expr.input(0) - Expr.input(1))
#: The edge softmax's three operators: the receivers' maxima, their sums of shifted exponentials,
#: and each edge's weight.
SOFTMAX_OPS = (
    canonical(Expr.input(0), ("edge",), "max", False),
    canonical(_SHIFTED, ("edge", "dst_v"), "sum", False),
    canonical(_SHIFTED / (Expr.input(2) + SOFTMAX_EPSILON), ("edge", "dst_v", "dst_v"), None, False),
)

#: The operator (and operands) of an expression, per expression, operands, shape and reduction:
#: a staged run asks again on every call.
_fitted = functools.lru_cache(maxsize=4096)(fit_operands)


#: How :meth:`Staged.describe` names the calls that ran in PyTorch on per-edge values.
ON_EDGES = "in PyTorch on per-edge values"
#: How :meth:`Staged.describe` names the Linear maps split into products of the node rows.
ON_NODES = "split by linearity into products of the node rows"
#: How :meth:`Staged.describe` names the Linear maps split into products of the edge inputs' rows
#: (edge features given to ``propagate()``, or values computed from them alone).
ON_EDGE_ROWS = "split by linearity into products of the edge features' rows"


@dataclass(frozen=True)
class Staged:
    """One staged ``message()`` call: a :class:`Capture` whose operator aggregates the symbolic
    messages (its operand arguments name entries of ``tensors``), the real ``messages``
    (``[E, *message_shape]``) to aggregate, or the messages ``aggregated`` already
    (``[num_dst, *message_shape]``, by an aggregation module computed inside the trace). ``dense``
    names the calls that ran in PyTorch on per-edge values, ``node_products`` the Linear maps
    computed on the node rows instead (split by linearity), ``edge_products`` those computed on
    the rows of edge inputs (see the module docstring): every other per-edge value was computed
    inside graph operators."""

    capture: Optional[Capture]
    tensors: Dict[str, Tensor]
    messages: Optional[Tensor]
    dense: Tuple[str, ...]
    node_products: Tuple[str, ...]
    edge_products: Tuple[str, ...]
    aggregated: Optional[Tensor] = None

    @property
    def message_shape(self) -> Tuple[int, ...]:
        """The feature shape of one message."""
        if self.capture is not None:
            return self.capture.message_shape
        value = self.messages if self.messages is not None else self.aggregated
        return tuple(value.shape[1:])

    def describe(self, method: str = "message()") -> str:
        """What ran in PyTorch in a staged call of ``method``, as a sentence (per-edge calls named
        with :data:`ON_EDGES`, split Linear maps with :data:`ON_NODES` and :data:`ON_EDGE_ROWS`)."""
        parts = [
            f"{', '.join(dict.fromkeys(calls))} {where}"
            for calls, where in (
                (self.dense, ON_EDGES),
                (self.node_products, ON_NODES),
                (self.edge_products, ON_EDGE_ROWS),
            )
            if calls
        ]
        if not parts:
            return f"{method} runs per call on graph operators only"
        return f"{method} runs per call on graph operators, with {' and '.join(parts)}"


class StagedTrace(Trace):
    """A trace whose operands have real values (``tensors``, by operand argument name), so that
    what the IR cannot express is computed instead of refused.

    Args:
        num_edges: rows of every per-edge value.
        tensors: the real tensor of every operand argument: node tensors (``[N, ...]``) for
            ``src_v``/``dst_v`` arguments, ``[E, ...]`` for ``edge`` arguments.
        run: runs an operator on the propagation's graph.
        receivers: the tensors PyG passes ``softmax`` as the receiver of each edge (``index``,
            ``ptr``), by identity; a softmax over anything else runs PyG's.
        num_dst: the number of receivers.
    """

    def __init__(
        self, num_edges: int, tensors: Mapping[str, Tensor], run: OpRunner, receivers: Sequence[Tensor], num_dst: int
    ) -> None:
        super().__init__(num_edges)
        self.tensors: Dict[str, Tensor] = dict(tensors)
        self.run = run
        self.receivers = tuple(receivers)
        self.num_dst = num_dst
        self.dense: List[str] = []
        self.node_products: List[str] = []
        self.edge_products: List[str] = []
        #: the operand arguments holding edge inputs: edge features given to ``propagate()``, and
        #: values computed from them alone (see the module docstring)
        self.edge_inputs: Set[str] = set()
        self._names: Dict[int, str] = {}  #: id of a real tensor -> its operand argument
        self._held: List[Tensor] = []  #: keeps those ids valid

    def wrap(self, name: str, argument: Argument) -> TracedTensor:
        """The traced argument ``name``; one of kind ``edge`` (edge features) is an edge input."""
        if argument.kind == "edge":
            self.edge_inputs.add(name)
        return super().wrap(name, argument)

    # -- real values ------------------------------------------------------------------------------
    def real(self, x: Any) -> Any:
        """``x`` with its traced tensors computed."""
        return self.materialize(x) if isinstance(x, TracedTensor) else x

    def materialize(self, x: TracedTensor) -> Tensor:
        """The real ``[E, *features]`` value of ``x``: one message-creation operator for its expression."""
        if x._value is not None:
            return x._value
        if x._parts is not None:
            value = torch.cat([self.real(part) for part in x._parts], dim=-1)
        else:
            value = self._evaluate(x, None)
            value = value != 0 if x.dtype == torch.bool else value.to(x.dtype)
        x._value = value
        return value

    def aggregate(self, x: TracedTensor, gather_op: str) -> Tensor:
        """The ``gather_op`` of ``x`` over each receiver's edges (``[num_dst, *features]``): one graph
        operator whose edge function computes ``x``, which is never written per edge."""
        return self._evaluate(self.traced(x), gather_op)

    def _evaluate(self, x: TracedTensor, gather_op: Optional[str]) -> Tensor:
        """One graph operator for the expression of ``x``: its value per edge (``gather_op=None``)
        or its ``gather_op`` over each receiver's edges."""
        if x._expr is None:
            raise CaptureError(f"message() computes with {x._why}")
        shape = x.features if x._computed is None else x._computed
        order = list(dict.fromkeys(node.index for node in x._expr.walk() if node.fn == "input"))
        if not order:
            raise CaptureError("message() computes a constant that does not depend on its tensor arguments")
        expr = x._expr.remap({old: new for new, old in enumerate(order)})
        op, operands = _fitted(expr, tuple(self.leaves[i] for i in order), shape, gather_op, x._reduce)
        value = self.run(op, [operand.build(self.tensors[operand.argument]) for operand in operands])
        rows = self.num_edges if gather_op is None else self.num_dst
        return value.reshape((rows,) + x.features)

    def operand(self, tensor: Tensor, kind: str, rank: int) -> TracedTensor:
        """``tensor`` as an operand of kind ``kind`` in an expression of ``rank`` dimensions: a
        per-edge value (``[E, ...]``), a node tensor, or a value that broadcasts over the edges (a
        parameter), read through a stride-0 view."""
        if not tensor.is_floating_point():
            raise CaptureError(f"message() combines its values with a {tensor.dtype} tensor")
        if kind == "edge" and not (tensor.dim() == rank and tensor.shape[0] == self.num_edges):
            if tensor.dim() > rank:
                raise CaptureError("message() broadcasts its per-edge values against a larger tensor")
            padded = tensor.reshape((1,) * (rank - tensor.dim()) + tuple(tensor.shape))
            if padded.shape[0] != 1:
                raise CaptureError(f"message() combines its edges with a tensor of {padded.shape[0]} rows")
            tensor = padded.expand((self.num_edges,) + tuple(padded.shape[1:]))
        features = tuple(tensor.shape[1:])
        expr = Expr.input(self.leaf(Operand(self._register(tensor), kind, features), tensor.dtype))
        return self.value(expr, features, tensor.dtype, tensor.device, tensor.requires_grad)

    def _register(self, tensor: Tensor) -> str:
        """The operand argument naming ``tensor`` (a new one for a tensor not met before)."""
        name = self._names.get(id(tensor))
        if name is None:
            name = f"%{len(self._names)}"
            self._names[id(tensor)] = name
            self._held.append(tensor)
            self.tensors[name] = tensor
        return name

    def detached(self, x: TracedTensor) -> TracedTensor:
        """``x`` computed from detached aliases of its operands: the same values, no gradient."""
        x = self.traced(x)
        aliases: Dict[str, str] = {}
        mapping = {}
        for index in x._expr.inputs():
            leaf = self.leaves[index]
            if leaf.argument not in aliases:
                aliases[leaf.argument] = self._register(self.tensors[leaf.argument].detach())
            mapping[index] = self.leaf(replace(leaf, argument=aliases[leaf.argument]), self.dtypes[index])
        return self.value(x._expr.remap(mapping), x.features, x.dtype, x.device, False)

    def _edge_input(self, x: TracedTensor) -> bool:
        """Whether ``x`` is computed from edge inputs alone (see the module docstring)."""
        return x._expr is not None and all(self.leaves[i].argument in self.edge_inputs for i in x._expr.inputs())

    def _mark_edge_input(self, operand: TracedTensor) -> TracedTensor:
        """``operand`` (a value :meth:`operand` returned), recorded as an edge input."""
        self.edge_inputs.add(self.leaves[operand._expr.index].argument)
        return operand

    # -- dispatch ---------------------------------------------------------------------------------
    def call(self, func: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        name = function_name(func)
        if name in METADATA:
            return super().call(func, args, kwargs)
        special = _STAGED_HANDLERS.get(name)
        if special is not None:
            result = special(self, args, kwargs)
            if result is not NotImplemented:
                return result
        elif name in HANDLERS:
            try:
                return super().call(func, args, kwargs)
            except CaptureError:
                pass
        return self.eager(name, func, args, kwargs)

    def eager(self, name: str, func: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        """``func`` in PyTorch on the real values of its arguments."""
        short = name.rsplit(".", 1)[-1]
        inplace = (
            (short.endswith("_") and not short.endswith("__")) or short in INPLACE_OPERATORS or kwargs.get("inplace")
        )
        if (inplace and args and isinstance(args[0], TracedTensor)) or isinstance(kwargs.get("out"), TracedTensor):
            raise CaptureError(f"message() modifies a traced value in place ({name}), which a staged run cannot follow")
        self.dense.append(name)
        args, kwargs = tree_map(self.real, (tuple(args), dict(kwargs)))
        return func(*args, **kwargs)

    def traced(self, x: TracedTensor) -> TracedTensor:
        if x._expr is None or x._reduce or x._computed is not None:
            return self.operand(self.materialize(x), "edge", x.dim())
        return x

    def combine(self, fn: str, *values: Any, dtype: Optional[torch.dtype] = None, masks: bool = False) -> TracedTensor:
        rank = max(v.dim() for v in values if isinstance(v, Tensor))
        values = tuple(
            self.operand(v, "edge", rank) if isinstance(v, Tensor) and not isinstance(v, TracedTensor) else v
            for v in values
        )
        return super().combine(fn, *values, dtype=dtype, masks=masks)

    def reshape(self, x: TracedTensor, features: Shape) -> Any:
        if x._expr is None:
            return self.materialize(x).reshape((self.num_edges,) + tuple(features))
        return super().reshape(x, features)

    # -- what the IR gains in a staged run --------------------------------------------------------
    def linear(self, x: Any, weight: Any, bias: Any) -> Any:
        """``F.linear(x, weight, bias)`` of a linear combination of operands (or a ``torch.cat`` of
        such pieces): the weight applied to each operand's own rows, summed symbolically."""
        if not isinstance(x, TracedTensor) or not isinstance(weight, Tensor) or isinstance(weight, TracedTensor):
            return NotImplemented
        if weight.dim() != 2 or weight.dtype != x.dtype or (bias is not None and not isinstance(bias, Tensor)):
            return NotImplemented
        pieces = x._parts if x._parts is not None else (x,)
        columns: Dict[int, List[Tuple[int, int, float]]] = {}
        start = 0
        for piece in pieces:
            width = piece.shape[-1]
            terms = self._linear_pieces(piece)
            if terms is None:
                return NotImplemented
            for index, coefficient in terms.items():
                if self.leaves[index].shape != tuple(piece.shape[1:]):
                    return NotImplemented
                columns.setdefault(index, []).append((start, start + width, coefficient))
            start += width
        if start != weight.shape[1] or not columns:
            return NotImplemented
        result: Optional[TracedTensor] = None
        for index, blocks in columns.items():
            leaf = self.leaves[index]
            rows = leaf.build(self.tensors[leaf.argument]) @ combine_columns(weight, blocks).t()
            if bias is not None and result is None:
                rows = rows + bias
            term = self.operand(rows, leaf.kind, rows.dim())
            if leaf.argument in self.edge_inputs:
                self._mark_edge_input(term)
            result = term if result is None else self.combine("add", result, term)
        leaves = [self.leaves[index] for index in columns]
        if any(leaf.kind == "edge" and leaf.argument not in self.edge_inputs for leaf in leaves):
            # A product of per-edge values computed in message() has a row per edge.
            self.dense.append("torch.nn.functional.linear (split by linearity, of per-edge values)")
            return result
        if any(leaf.kind != "edge" for leaf in leaves):
            self.node_products.append("torch.nn.functional.linear")
        if any(leaf.kind == "edge" for leaf in leaves):
            self.edge_products.append("torch.nn.functional.linear")
        return result

    def _linear_pieces(self, piece: Any) -> Optional[Dict[int, float]]:
        """A piece of a Linear's input as ``{operand slot: coefficient}``: a linear combination of
        operands, or one edge input (a value computed from edge inputs alone, by one
        message-creation operator); ``None`` for anything else."""
        if not isinstance(piece, TracedTensor):
            piece = self.operand(piece, "edge", piece.dim())
        if piece._expr is not None and piece._computed is None and not piece._reduce:
            terms = linear_terms(piece._expr)
            if terms is not None:
                return terms
        if piece._parts is not None or not self._edge_input(piece):
            return None
        operand = self._mark_edge_input(self.operand(self.materialize(piece), "edge", piece.dim()))
        return {operand._expr.index: 1.0}

    def select(self, x: Any, index: Any) -> Any:
        """``x[index]`` where ``index`` keeps every edge and picks along the features only (``x[:, i]``,
        PNA's towers): an operand's node rows are indexed instead, and each piece of a
        ``torch.cat`` alike when the index leaves the concatenated last dimension whole."""
        if not isinstance(x, TracedTensor) or not _keeps_rows(index):
            return NotImplemented
        if x._parts is not None:
            if len(index) == x.dim() and index[-1] != slice(None):
                return NotImplemented
            pieces = [self.select(piece, index) for piece in x._parts]
            if any(piece is NotImplemented for piece in pieces):
                return NotImplemented
            return self.concatenate(pieces, -1)
        return self._on_rows(x, lambda rows: rows[index])

    def repeat(self, x: Any, sizes: Sequence[int]) -> Any:
        """``x.repeat(*sizes)`` that repeats along the features only (``sizes[0] == 1``: PNA's edge
        features over its towers): an operand's rows are repeated instead."""
        if not isinstance(x, TracedTensor) or len(sizes) != x.dim() or sizes[0] != 1:
            return NotImplemented
        return self._on_rows(x, lambda rows: rows.repeat(*sizes))

    def _on_rows(self, x: TracedTensor, transform: Callable[[Tensor], Tensor]) -> Any:
        """``transform`` (which keeps every row and moves data only within one) applied to the real
        rows behind ``x``, a value that is one operand as it is (viewed or not); else ``NotImplemented``."""
        if x._expr is None or x._expr.fn != "input" or x._reduce or x._computed is not None:
            return NotImplemented
        leaf = self.leaves[x._expr.index]
        if leaf.shape != x.features:
            return NotImplemented
        source = self.tensors[leaf.argument]
        rows = transform(source.reshape((source.shape[0],) + leaf.shape))
        operand = self.operand(rows, leaf.kind, rows.dim())
        return self._mark_edge_input(operand) if leaf.argument in self.edge_inputs else operand

    def softmax(self, src: Any, index: Any, ptr: Any, num_nodes: Any, dim: int) -> Any:
        """PyG's ``softmax`` in a staged ``message()``: graph operators when it normalises over the
        receivers of the propagation's edges, PyG's own on the real values otherwise."""
        if (
            isinstance(src, Tensor)
            and src.is_floating_point()
            and src.dim() >= 1
            and dim in (0, -src.dim())
            and src.shape[0] == self.num_edges
            and self.owns_receivers(index, ptr, num_nodes)
        ):
            return self.edge_softmax(src)
        self.dense.append("torch_geometric.utils.softmax")
        return pyg_softmax(self.real(src), index, ptr, num_nodes, dim)

    def edge_softmax(self, src: Any) -> Tensor:
        r"""PyG's ``softmax(src, index)`` over the edges of each receiver, as graph operators:
        :math:`m_i = \max_j s_{ji}` (no gradient, as PyG's), :math:`t_i = \sum_j e^{s_{ji} - m_i}`
        in one fused gather, then :math:`e^{s_{ji} - m_i} / (t_i + 10^{-16})` per edge; half-precision
        scores are normalised in float32 (the weights of a large receiver would round away)."""
        scores = self.real(src)
        logits = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        maximum_op, total_op, weight_op = SOFTMAX_OPS
        maximum = self.run(maximum_op, [logits.detach()])
        total = self.run(total_op, [logits, maximum])
        return self.run(weight_op, [logits, maximum, total]).to(scores.dtype)

    def softmax_aggregate(self, messages: Any, temperature: Any, semi_grad: bool) -> Tensor:
        r"""PyG's ``SoftmaxAggregation`` of the messages, per feature:

        .. math::
            \sum_j \operatorname{softmax}_j(t\,\mathbf{m}_{ji}) \odot \mathbf{m}_{ji}
            = \frac{\sum_j e^{t\mathbf{m}_{ji} - \mathbf{M}_i} \odot \mathbf{m}_{ji}}
                   {\sum_j e^{t\mathbf{m}_{ji} - \mathbf{M}_i} + 10^{-16}},
            \qquad \mathbf{M}_i = \max_j t\,\mathbf{m}_{ji},

        as three gathers whose edge functions recompute the messages (no per-edge value is
        written): :math:`\mathbf{M}` without gradient, as PyG's softmax takes it, then the two sums.
        An isolated receiver gets 0, as in PyG. With ``semi_grad`` the softmax weights have no
        gradient (PyG computes them under ``no_grad``): they read detached aliases of the operands.
        The ratio of half-precision sums is taken in float32, where the :math:`10^{-16}` does not
        round to 0 (isolated receivers would get 0 / 0)."""
        if not isinstance(messages, TracedTensor):
            messages = self.operand(messages, "edge", messages.dim())
        messages = self.traced(messages)
        scaled = self.detached(messages) if semi_grad else messages
        if not isinstance(temperature, (int, float)) or temperature != 1:
            scaled = self.combine("mul", scaled, temperature)
        with torch.no_grad():
            maximum = self.aggregate(scaled, "max")
        shifted = self.unary("exp", self.combine("sub", scaled, self.operand(maximum, "dst_v", scaled.dim())))
        with torch.no_grad() if semi_grad else contextlib.nullcontext():
            total = self.aggregate(shifted, "sum")
        numerator = self.aggregate(self.combine("mul", shifted, messages), "sum")
        wide = torch.promote_types(total.dtype, torch.float32)
        return (numerator.to(wide) / (total.to(wide) + SOFTMAX_EPSILON)).to(numerator.dtype)

    def owns_receivers(self, index: Optional[Tensor], ptr: Optional[Tensor], num_nodes: Optional[int]) -> bool:
        receiver = index if index is not None else ptr
        return (
            receiver is not None
            and any(receiver is r for r in self.receivers)
            and (num_nodes is None or num_nodes == self.num_dst)
        )

    # -- the result -------------------------------------------------------------------------------
    def result(self, value: Any, gather_op: Optional[str]) -> Staged:
        """The staged call of a ``message()`` that returned ``value`` (aggregated with ``gather_op``;
        ``None`` keeps the per-edge values, as ``edge_update()``'s)."""
        if isinstance(value, TracedTensor) and gather_op is not None and value._parts is None:
            try:
                return self._staged(capture=self.finish(value, gather_op))
            except CaptureError:
                pass
        if isinstance(value, TracedTensor):
            value = self.materialize(value)
        if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != self.num_edges:
            raise CaptureError("message() returns a value that has no row per edge")
        return self._staged(messages=value)

    def aggregated(self, value: Tensor) -> Staged:
        """The staged call of a ``message()`` whose messages an aggregation module aggregated inside
        the trace (``value``: ``[num_dst, *message_shape]``)."""
        return self._staged(aggregated=value)

    def _staged(
        self,
        capture: Optional[Capture] = None,
        messages: Optional[Tensor] = None,
        aggregated: Optional[Tensor] = None,
    ) -> Staged:
        """The staged call with its result, and what ran where so far."""
        return Staged(
            capture,
            self.tensors,
            messages,
            tuple(self.dense),
            tuple(self.node_products),
            tuple(self.edge_products),
            aggregated,
        )


def _linear(trace: StagedTrace, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    return trace.linear(*linear_arguments(args, kwargs))


def _cat(trace: StagedTrace, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    tensors, dim = cat_arguments(args, kwargs)
    return NotImplemented if tensors is None else trace.concatenate(tensors, dim)


def _keeps_rows(index: Any) -> bool:
    """Whether ``index`` is ``(:, ...)`` with integers and slices after: every row kept."""
    return (
        isinstance(index, tuple)
        and len(index) > 1
        and index[0] == slice(None)
        and all(type(i) is int or isinstance(i, slice) for i in index[1:])
    )


def _getitem(trace: StagedTrace, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    if len(args) != 2 or kwargs:
        return NotImplemented
    return trace.select(args[0], args[1])


def _repeat(trace: StagedTrace, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    if kwargs or len(args) < 2:
        return NotImplemented
    sizes = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
    if not all(type(size) is int for size in sizes):
        return NotImplemented
    return trace.repeat(args[0], tuple(sizes))


def _stack(trace: StagedTrace, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``torch.stack`` of one traced value: a new feature dimension (PNA's single tower)."""
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if (
        not isinstance(tensors, (list, tuple))
        or len(tensors) != 1
        or not isinstance(tensors[0], TracedTensor)
        or not isinstance(dim, int)
        or set(kwargs) - {"tensors", "dim"}
        or dim % (tensors[0].dim() + 1) == 0
    ):
        return NotImplemented
    return tensors[0].unsqueeze(dim)


_STAGED_HANDLERS: Dict[str, Callable[[StagedTrace, Sequence[Any], Mapping[str, Any]], Any]] = {
    "torch.nn.functional.linear": _linear,
    "torch.cat": _cat,
    "torch.concat": _cat,
    "torch.concatenate": _cat,
    "torch.Tensor.__getitem__": _getitem,
    "torch.Tensor.repeat": _repeat,
    "torch.stack": _stack,
}


@torch.compiler.disable
def stage(
    method: Callable[..., Any],
    arguments: Mapping[str, Any],
    trace: StagedTrace,
    gather_op: Optional[str],
    owner: Optional[torch.nn.Module] = None,
    aggregate: Optional[Callable[[StagedTrace, Any], Tensor]] = None,
) -> Staged:
    """Run ``method`` (a bound ``message`` or ``edge_update``) on ``arguments``: :class:`Argument`
    values whose tensor is in ``trace.tensors`` become traced tensors, anything else is passed as
    it is. ``owner``'s attributes that ``method`` set to traced values are computed for real.
    ``aggregate(trace, messages)``, if given, aggregates the messages per receiver instead of
    ``gather_op`` (an aggregation module computed inside the trace, such as
    :meth:`StagedTrace.softmax_aggregate`).

    Never traced by ``torch.compile``: a frame it gives up on runs eagerly, but the functions that
    frame calls are compiled again, and Dynamo cannot trace ``message()`` on traced tensors.

    Raises:
        CaptureError: ``method`` modifies a traced value in place, or raised on traced values.
    """
    kwargs = trace.traced_arguments(arguments)
    with tracing(trace, method) as traced_method:
        try:
            value = traced_method(**kwargs)
        except CaptureError:
            raise
        except Exception as error:
            raise CaptureError(f"{getattr(method, '__name__', 'message')}() raised {type(error).__name__} ({error})")
        if owner is not None:
            for name, attribute in list(vars(owner).items()):
                if isinstance(attribute, TracedTensor):
                    vars(owner)[name] = trace.materialize(attribute)
        if aggregate is not None:
            return trace.aggregated(aggregate(trace, value))
        return trace.result(value, gather_op)


__all__ = ["Staged", "StagedTrace", "stage"]
