r"""Capture a PyG ``message()`` as one IR operator.

PyG computes one message per edge :math:`(j \to i)` and reduces them per destination:

.. math::
    \mathbf{m}_{j,i} = \phi\left(\mathbf{x}_i, \mathbf{x}_j, \mathbf{e}_{j,i}\right),
    \qquad
    \mathbf{h}_i = \bigoplus_{j \in \mathcal{N}(i)} \mathbf{m}_{j,i}.

When :math:`\phi` is elementwise in its arguments, the pair is a single :class:`~pyg_ugrapher.ir.OpInfo`:
its edge function is :math:`\phi` as an :class:`~pyg_ugrapher.ir.Expr` over operand slots that read
``x_j`` at the source (``src_v``), ``x_i`` at the destination (``dst_v``) and per-edge tensors at the
edge (``edge``), and its gather op is :math:`\bigoplus`. One fused kernel then computes
:math:`\mathbf{h}` without ever writing the ``[E, F]`` messages.

:func:`capture` finds :math:`\phi` by calling ``message()`` once on :class:`TracedTensor` s: tensor
subclasses without storage whose ``__torch_function__`` records every operation as an ``Expr`` node.
Shapes, dtypes and devices are the real ones, so shape-dependent Python (``x_j.size(-1)``,
``view(-1, self.heads, C)``) runs as it would on real tensors. What is captured:

* ``+ - * /`` between arguments and Python numbers, negation, ``** 2`` / ``** 0.5`` / ``** -1``;
* ``relu``, ``leaky_relu`` (with its slope), ``elu`` (with its alpha), ``sigmoid``, ``tanh``, ``silu``,
  ``gelu`` (exact or ``approximate="tanh"``), ``softplus`` (with its beta and threshold), ``exp``,
  ``log``, ``abs``, ``sign``, ``sin``, ``cos``, ``erf``, ``sqrt``, ``rsqrt``, ``square``, ``reciprocal``,
  ``maximum`` / ``minimum`` (also as ``torch.max(a, b)``), ``clamp`` / ``clip`` / ``clamp_min`` /
  ``clamp_max`` and ``hardtanh`` / ``relu6`` with Python-number bounds, from ``torch``, ``torch.Tensor``
  or ``torch.nn.functional``; dropout outside training;
* comparisons (``> < >= <= == !=``, also combined with ``& | ~``) as the condition of
  ``torch.where``, as a 0 / 1 mask beside a floating-point tensor (``x * (x > 0)``) or converted
  with ``.to(dtype)`` / ``.float()``;
* ``view`` / ``reshape`` / ``unsqueeze`` / ``squeeze`` / ``flatten`` of the feature dimensions (the
  edge dimension stays first); on an argument they become a reshape of the real operand, on an
  intermediate result they are pushed down to its arguments where that keeps the broadcasting;
* basic indexing of the feature dimensions (``x_j[:, :4]``, ``a[..., 1::2]``, ``h[:, 0]``: slices
  and ints, every edge kept): on an argument it becomes a selection of the real operand's
  features, on an intermediate result it is pushed down to its arguments (an argument broadcast
  along an indexed dimension keeps its single entry);
* a final ``sum(dim=-1)`` (a dot product): a reducing message op, then the aggregation.

Anything else raises :class:`CaptureError` with a sentence saying why: ``torch.cat``, ``matmul`` and
``nn.Module`` calls, tensors that are not arguments (parameters, buffers: they would be baked into
the capture), in-place operations, Python branching on tensor values, tuples of messages.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.overrides import resolve_name

from .backward import canonical
from .ir import SOFTPLUS_THRESHOLD, Expr, OpInfo
from .layout import infer_layout

Shape = Tuple[int, ...]
#: A selection of features, per dimension: ``(start, stop, step)`` of a slice, or an int (the
#: dimension is dropped).
FeatureIndex = Tuple[Any, ...]


class CaptureError(Exception):
    """``message()`` cannot become one IR operator; ``str(error)`` says why, as a sentence.

    ``num_edges`` is set when the trace read the number of edges: the verdict holds only for
    graphs with that many edges.
    """

    def __init__(self, reason: str, num_edges: Optional[int] = None) -> None:
        super().__init__(reason)
        self.num_edges = num_edges


@dataclass(frozen=True)
class Argument:
    """A tensor argument of ``message()``, as the trace sees it: metadata only, no values.

    Args:
        shape: the full shape, rows first (``num_edges`` rows for an operand).
        dtype: its dtype.
        device: its device.
        requires_grad: whether it requires a gradient.
        kind: the operand kind it is read as (``"src_v"``, ``"dst_v"``, ``"edge"``), or ``None`` for a
            tensor that may be inspected (``.size()``, ``.dim()``) but not computed with.
        why: for ``kind=None``, why it cannot be an operand (completes "message() computes with ...").
    """

    shape: Shape
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    kind: Optional[str] = None
    why: str = ""

    @staticmethod
    def of(tensor: Tensor, kind: Optional[str] = None, why: str = "", rows: Optional[int] = None) -> "Argument":
        """Describe ``tensor``; ``rows`` replaces its first dimension (a lifted node tensor has one
        row per edge, not per node)."""
        shape = tuple(tensor.shape) if rows is None else (rows,) + tuple(tensor.shape[1:])
        return Argument(shape, tensor.dtype, tensor.device, tensor.requires_grad, kind, why)


@dataclass(frozen=True)
class Operand:
    """How one operand slot of a captured op is built from an argument of ``message()``.

    The argument's rows are kept; its features are viewed as ``view`` and the features ``index``
    selects are taken (where ``message()`` indexed them), then reshaped to ``shape`` (the views
    ``message()`` applied) and, where the kernels cannot broadcast them as they are, expanded to
    ``expand``.
    """

    argument: str  #: the ``message()`` parameter it comes from (``x_j``, ``edge_weight``...)
    kind: str  #: ``"src_v"``, ``"dst_v"`` or ``"edge"``
    shape: Shape  #: feature shape after ``message()``'s views
    expand: Optional[Shape] = None  #: broadcast feature shape (a stride-0 view), if needed
    view: Optional[Shape] = None  #: feature shape the features are selected from, with ``index``
    index: Optional[FeatureIndex] = None  #: the features selected, per dimension of ``view``

    @property
    def features(self) -> Shape:
        """The feature shape the operator reads."""
        return self.shape if self.expand is None else self.expand

    def build(self, tensor: Tensor) -> Tensor:
        """The operand from the real tensor (node features for vertex kinds, per-edge values for edges)."""
        return build_operand(tensor, self.shape, self.expand, self.view, self.index)


def build_operand(
    tensor: Tensor,
    shape: Shape,
    expand: Optional[Shape] = None,
    view: Optional[Shape] = None,
    index: Optional[FeatureIndex] = None,
) -> Tensor:
    """:meth:`Operand.build` from the operand's fields (a compiled model holds them as constants)."""
    rows = tensor.shape[0]
    if index is None:
        out = tensor.reshape((rows,) + shape)
    else:
        selection = (slice(None),) + tuple(slice(*entry) if isinstance(entry, tuple) else entry for entry in index)
        # A copy of the selected features, whole rows of them, as the kernels read operands.
        out = tensor.reshape((rows,) + view)[selection].contiguous().reshape((rows,) + shape)
    return out if expand is None else out.expand((rows,) + expand)


@dataclass(frozen=True)
class Capture:
    """A ``message()`` with its aggregation, as IR operators.

    ``op`` computes the aggregated messages in one kernel; its output, viewed as
    ``[rows, *message_shape]``, is the result (a view ``message()`` applied to its final result is
    applied to the aggregate instead). For a message ending in a sum over its last dimension (a dot
    product), IR reductions being message-creation only, ``op`` creates the reduced messages and
    ``gather`` aggregates them.
    """

    op: OpInfo
    operands: Tuple[Operand, ...]
    message_shape: Shape  #: feature shape of one message, as ``message()`` returns it
    gather: Optional[OpInfo] = None
    num_edges: Optional[int] = None  #: set when the trace read the number of edges: valid for that count only

    @property
    def ops(self) -> Tuple[OpInfo, ...]:
        """The operators one propagation runs, in order."""
        return (self.op,) if self.gather is None else (self.op, self.gather)

    def __str__(self) -> str:
        inputs = ", ".join(f"{o.argument}{_selection(o.index)} as {o.kind} {list(o.features)}" for o in self.operands)
        steps = "\n".join(repr(op) for op in self.ops)
        return f"Capture of message({inputs}) -> messages {list(self.message_shape)}\n{steps}"


def _selection(index: Optional[FeatureIndex]) -> str:
    """``index`` as Python indexing (``[:, 0:4]``), or nothing without one."""
    if index is None:
        return ""
    entries = [str(e) if isinstance(e, int) else f"{e[0]}:{e[1]}" + (f":{e[2]}" if e[2] != 1 else "") for e in index]
    return f"[:, {', '.join(entries)}]"


def capture(message: Callable[..., Any], arguments: Mapping[str, Any], num_edges: int, gather_op: str) -> Capture:
    """Trace ``message(**arguments)`` into IR operators that aggregate with ``gather_op``.

    Args:
        message: the (bound) ``message`` method.
        arguments: its keyword arguments; :class:`Argument` values become traced tensors, anything
            else is passed as it is (and is baked into the capture).
        num_edges: the number of edges (rows of every operand argument).
        gather_op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

    Raises:
        CaptureError: ``message()`` is not one elementwise IR operator (or raised an error).
    """
    trace = Trace(num_edges)
    try:
        kwargs = {
            name: trace.wrap(name, value) if isinstance(value, Argument) else value for name, value in arguments.items()
        }
        try:
            result = message(**kwargs)
        except CaptureError:
            raise
        except Exception as error:  # the user's code failed on traced tensors: let PyG run it
            raise CaptureError(f"message() raised {type(error).__name__} on traced tensors ({error})") from error
        return trace.finish(result, gather_op)
    except CaptureError as error:
        error.num_edges = num_edges if trace.reads_rows else None
        raise


# -- the traced tensor ----------------------------------------------------------------------------
class TracedTensor(Tensor):
    """A symbolic ``[rows, *features]`` tensor: row ``e`` holds ``expr`` evaluated on row ``e`` of
    the operands. No storage; every torch operation goes to :meth:`__torch_function__`.

    ``expr is None`` marks an argument that cannot be an operand (``why`` says so). ``computed`` is
    the feature shape ``expr`` is evaluated at when it differs from the tensor's: after a view that
    the operands cannot follow, or a final sum over the last dimension (``reduce``). Such a tensor
    may only be viewed again or returned.
    """

    _trace: "Trace"
    _expr: Optional[Expr]
    _why: str
    _computed: Optional[Shape]
    _reduce: bool
    #: its real value, once a staged run (:mod:`pyg_ugrapher.staging`) has computed it
    _value: Optional[Tensor] = None
    #: the pieces of a ``torch.cat`` along the features that a staged run keeps apart (``expr is None``)
    _parts: Optional[Tuple[Any, ...]] = None

    @staticmethod
    def __new__(
        cls,
        trace: "Trace",
        shape: Shape,
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool,
        expr: Optional[Expr],
        why: str = "",
        computed: Optional[Shape] = None,
        reduce: bool = False,
    ) -> "TracedTensor":
        self = Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device, requires_grad=requires_grad)
        self._trace, self._expr, self._why = trace, expr, why
        self._computed, self._reduce = computed, reduce
        return self

    @property
    def features(self) -> Shape:
        with torch._C.DisableTorchFunctionSubclass():
            return tuple(self.shape[1:])

    def __repr__(self) -> str:
        return f"TracedTensor(shape={list(self.features)} per edge, expr={self._expr})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        trace = next(t._trace for t in flat_arguments(args, kwargs) if isinstance(t, TracedTensor))
        return trace.call(func, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # __torch_function__ answers every call; reaching the dispatcher means an op slipped past it.
        raise CaptureError(f"message() runs {func} on a traced tensor, which the capture does not model")


_NAMES: Dict[Any, str] = {}


def function_name(func: Callable) -> str:
    """``torch.add``, ``torch.Tensor.__mul__``...: the name torch gives ``func`` (cached: torch's
    lookup guards itself against warnings at every call)."""
    try:
        return _NAMES[func]
    except (KeyError, TypeError):
        pass
    name = resolve_name(func) or getattr(func, "__name__", repr(func))
    try:
        _NAMES[func] = name
    except TypeError:  # an unhashable callable
        pass
    return name


def flat_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Iterable[Any]:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


# -- the trace ------------------------------------------------------------------------------------
_SCALARS = (bool, int, float)
_ELEMENTWISE_HINT = (
    "only elementwise arithmetic, activations, feature views and slices, and a final sum over the "
    "last dimension are captured"
)

_MASK_USE = (
    "message() computes with a comparison result (a boolean tensor) on its own; it is captured as the "
    "condition of torch.where, beside a floating-point tensor (x * (x > 0)) or converted with .to(dtype)"
)


class Trace:
    """The state of one trace: the operand leaves met so far and whether the edge count was read."""

    def __init__(self, num_edges: int) -> None:
        self.num_edges = num_edges
        self.leaves: List[Operand] = []
        self.dtypes: List[torch.dtype] = []  #: of each leaf
        self._leaf_ids: Dict[Operand, int] = {}
        self.reads_rows = False

    # -- leaves -------------------------------------------------------------------------------
    def leaf(self, operand: Operand, dtype: torch.dtype) -> int:
        if operand not in self._leaf_ids:
            self._leaf_ids[operand] = len(self.leaves)
            self.leaves.append(operand)
            self.dtypes.append(dtype)
        return self._leaf_ids[operand]

    def wrap(self, name: str, argument: Argument) -> TracedTensor:
        if argument.kind is None:
            return TracedTensor(
                self,
                argument.shape,
                argument.dtype,
                argument.device,
                argument.requires_grad,
                None,
                f"argument {name!r}, {argument.why}",
            )
        if not argument.shape or argument.shape[0] != self.num_edges:
            raise ValueError(
                f"arguments: operand {name!r} needs {self.num_edges} rows, got shape {list(argument.shape)}"
            )
        features = argument.shape[1:]
        expr = Expr.input(self.leaf(Operand(name, argument.kind, features), argument.dtype))
        return self.value(expr, features, argument.dtype, argument.device, argument.requires_grad)

    def value(
        self,
        expr: Expr,
        features: Shape,
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool,
        computed: Optional[Shape] = None,
        reduce: bool = False,
    ) -> TracedTensor:
        return TracedTensor(
            self,
            (self.num_edges,) + tuple(features),
            dtype,
            device,
            requires_grad and dtype.is_floating_point and torch.is_grad_enabled(),
            expr,
            computed=computed,
            reduce=reduce,
        )

    # -- dispatch -----------------------------------------------------------------------------
    def call(self, func: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        name = function_name(func)
        if name in METADATA:
            return self.metadata(name, func, args, kwargs)
        short = name.rsplit(".", 1)[-1]
        if (
            (short.endswith("_") and not short.endswith("__"))
            or short in INPLACE_OPERATORS
            or kwargs.get("inplace")
            or kwargs.get("out") is not None
        ):
            raise CaptureError(
                f"message() modifies a tensor in place ({name}); the capture only models functional code"
            )
        handler = HANDLERS.get(name)
        if handler is None:
            if name in _VALUE_READS:
                raise CaptureError(
                    f"message() reads tensor values in Python ({name}), e.g. to branch "
                    f"on them; a captured message must not depend on the data"
                )
            raise CaptureError(f"message() calls {name}, which the IR cannot express ({_ELEMENTWISE_HINT})")
        return handler(self, name, args, kwargs)

    def metadata(self, name: str, func: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        x = args[0]
        if name in _ROW_METADATA:
            self.reads_rows = True
        elif name == "torch.Tensor.size":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if dim is None or _normalize(dim, x.dim()) == 0:
                self.reads_rows = True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    # -- operands of an operation -------------------------------------------------------------
    def node(self, x: Any, mask: bool = False) -> Tuple[Expr, Optional[Shape], Optional[torch.dtype], bool]:
        """``(expr, features, dtype, requires_grad)`` of a value; features and dtype are ``None`` for
        a Python number. A comparison result (a boolean tensor, 1.0 / 0.0 in the IR) is accepted only
        with ``mask``: where torch reads it as a condition or promotes it to 0 / 1."""
        if isinstance(x, TracedTensor):
            if x.dtype == torch.bool and not mask:
                raise CaptureError(_MASK_USE)
            return self.traced(x)._expr, x.features, x.dtype, x.requires_grad
        if isinstance(x, _SCALARS):
            return Expr.const(float(x)), None, None, False
        if isinstance(x, Tensor):
            raise CaptureError(
                "message() computes with a tensor that is not an argument of propagate() "
                "(a parameter, a buffer or a tensor made inside message()); only "
                "propagate()'s arguments can be operands of the fused kernel"
            )
        raise CaptureError(
            f"message() computes with a {type(x).__name__} value, which is not a number or a tensor argument"
        )

    @staticmethod
    def traced(x: TracedTensor) -> TracedTensor:
        """``x``, checked to be computable: not an opaque argument, a final sum or a final view."""
        if x._expr is None:
            raise CaptureError(f"message() computes with {x._why}")
        if x._reduce:
            raise CaptureError(
                "message() computes with the result of a sum over the last dimension; a "
                "dot product is captured only as the last operation of message()"
            )
        if x._computed is not None:
            raise CaptureError(
                f"message() computes with an intermediate result viewed from "
                f"{list(x._computed)} as {list(x.features)}, a view its operands cannot "
                f"follow because they broadcast differently; reshape the arguments instead"
            )
        return x

    def combine(self, fn: str, *values: Any, dtype: Optional[torch.dtype] = None, masks: bool = False) -> TracedTensor:
        """``fn(*values)`` with torch's broadcasting, where every edge dimension must line up.

        ``dtype`` is the result's (default: the tensors' promoted dtype). Comparison results may
        take part beside a floating-point tensor, which torch promotes them to, as the condition of
        ``where``, and everywhere with ``masks`` (logical operations).
        """
        floating = any(isinstance(v, TracedTensor) and v.dtype.is_floating_point for v in values)
        nodes = [self.node(v, mask=masks or floating or (fn == "where" and i == 0)) for i, v in enumerate(values)]
        shapes = [features for _, features, _, _ in nodes if features is not None]
        ranks = sorted({len(features) + 1 for features in shapes})
        if len(ranks) > 1:
            raise CaptureError(
                f"message() combines tensors of {ranks[0]} and {ranks[-1]} dimensions, "
                f"which broadcasts the edge dimension of one against a feature dimension "
                f"of the other; view the smaller one first (e.g. w.view(-1, 1))"
            )
        features = tuple(torch.broadcast_shapes(*shapes))
        if dtype is None:
            dtype = functools.reduce(torch.promote_types, [d for _, _, d, _ in nodes if d is not None])
        device = next(v.device for v in values if isinstance(v, TracedTensor))
        grad = any(g for _, _, _, g in nodes)
        return self.value(Expr.apply(fn, *(e for e, _, _, _ in nodes)), features, dtype, device, grad)

    def function(self, x: Any, build: Callable[[Expr], Expr]) -> TracedTensor:
        """An elementwise function of one tensor: ``build`` makes its expression from ``x``'s."""
        expr, features, dtype, grad = self.node(x)
        if features is None:
            raise CaptureError("message() applies an activation to a Python number")
        return self.value(build(expr), features, dtype, x.device, grad)

    def unary(self, fn: str, x: Any, *extra: float) -> TracedTensor:
        return self.function(x, lambda expr: Expr.apply(fn, expr, *extra))

    def select(self, condition: Any, a: Any, b: Any) -> TracedTensor:
        """``torch.where(condition, a, b)`` for a comparison ``condition`` of traced values."""
        if not isinstance(condition, TracedTensor) or condition.dtype != torch.bool:
            raise CaptureError(
                "message() calls torch.where with a condition that is not a comparison of its tensor "
                "arguments (>, <, >=, <=, ==, !=, combined with &, |, ~); only such conditions are captured"
            )
        arms = [x for x in (a, b) if isinstance(x, TracedTensor)]
        if arms:
            dtype = functools.reduce(torch.promote_types, [x.dtype for x in arms])
        elif any(isinstance(x, float) for x in (a, b)):
            dtype = torch.get_default_dtype()
        else:
            raise CaptureError(
                "message() calls torch.where with Python integers (or booleans) for both values, an integer result"
            )
        return self.combine("where", condition, a, b, dtype=dtype)

    def reshape(self, x: TracedTensor, features: Shape) -> TracedTensor:
        """``x`` with new feature dimensions (same element order).

        The views of the operands of ``x`` change accordingly where they can (then the result
        computes like any other); otherwise, and after a final sum, the expression keeps its shape
        and only the result is viewed: aggregation is elementwise, so the aggregate is viewed instead.
        """
        if x._expr is None:
            raise CaptureError(f"message() reshapes {x._why}")
        current = x.features
        if math.prod(features) != math.prod(current):
            raise CaptureError(
                f"message() reshapes features {list(current)} to {list(features)}, which moves data between edges"
            )
        if x._computed is not None:
            return self.value(x._expr, features, x.dtype, x.device, x.requires_grad, x._computed, x._reduce)
        mapping = {}
        for index in x._expr.inputs():
            shape = _reshaped_leaf(self.leaves[index].shape, current, features)
            if shape is None:
                return self.value(x._expr, features, x.dtype, x.device, x.requires_grad, computed=current)
            mapping[index] = self.leaf(replace(self.leaves[index], shape=shape), self.dtypes[index])
        return self.value(x._expr.remap(mapping), features, x.dtype, x.device, x.requires_grad)

    def index_features(self, x: TracedTensor, index: FeatureIndex) -> TracedTensor:
        """``x`` with its features selected by ``index`` (one entry per feature dimension, see
        :data:`FeatureIndex`), pushed down to its operands: each takes the same selection, or its
        single entry along a dimension it broadcasts."""
        x = self.traced(x)
        features = x.features
        if all(entry == (0, size, 1) for entry, size in zip(index, features)):
            return x
        selected = tuple(len(range(*entry)) for entry in index if isinstance(entry, tuple))
        if 0 in selected:
            raise CaptureError(f"message() selects no features of {list(features)}")
        mapping = {}
        for leaf_id in x._expr.inputs():
            leaf = self.leaves[leaf_id]
            if leaf.index is not None:
                raise CaptureError(
                    "message() indexes the features of a value whose features it indexed before; "
                    "index the arguments once"
                )
            if len(leaf.shape) != len(features):
                raise CaptureError(f"message() indexes features {list(features)} of operands of another rank")
            entries = tuple(
                entry if size == full else (0 if isinstance(entry, int) else (0, 1, 1))
                for entry, size, full in zip(index, leaf.shape, features)
            )
            shape = tuple(len(range(*entry)) for entry in entries if isinstance(entry, tuple))
            mapping[leaf_id] = self.leaf(
                replace(leaf, shape=shape, view=leaf.shape, index=entries), self.dtypes[leaf_id]
            )
        return self.value(x._expr.remap(mapping), selected, x.dtype, x.device, x.requires_grad)

    # -- the result -----------------------------------------------------------------------------
    def finish(self, result: Any, gather_op: str) -> Capture:
        if isinstance(result, (tuple, list)):
            raise CaptureError(
                f"message() returns a {type(result).__name__} of {len(result)} values; "
                f"only a single message tensor is captured"
            )
        if not isinstance(result, TracedTensor):
            what = (
                "a tensor that does not come from its arguments"
                if isinstance(result, Tensor)
                else f"a {type(result).__name__}"
            )
            raise CaptureError(f"message() returns {what}, not a function of its tensor arguments")
        if result._expr is None:
            raise CaptureError(f"message() returns {result._why}")
        if result.dtype == torch.bool:
            raise CaptureError(
                "message() returns a comparison result, a boolean tensor; messages are floating-point "
                "(convert it with .to(dtype) or multiply it with a tensor)"
            )
        reduced = result._reduce
        shape = result.features if result._computed is None else result._computed
        order: List[int] = []
        for node in result._expr.walk():
            if node.fn == "input" and node.index not in order:
                order.append(node.index)
        if not order:
            raise CaptureError("message() returns a constant that does not depend on its tensor arguments")
        if functools.reduce(torch.promote_types, (self.dtypes[i] for i in order)) != result.dtype:
            raise CaptureError(
                f"message() returns {result.dtype} while the arguments it depends on promote "
                f"to another dtype (an argument was multiplied by 0?)"
            )
        expr = result._expr.remap({old: new for new, old in enumerate(order)})
        operands = tuple(self.leaves[i] for i in order)
        op_gather = None if reduced else gather_op
        op, operands = fit_operands(expr, operands, shape, op_gather, reduced)
        gather = canonical(Expr.input(0), ("edge",), gather_op, False) if reduced else None
        return Capture(op, operands, result.features, gather, self.num_edges if self.reads_rows else None)


def fit_operands(
    expr: Expr, operands: Tuple[Operand, ...], shape: Shape, gather_op: Optional[str], reduce: bool
) -> Tuple[OpInfo, Tuple[Operand, ...]]:
    """The op, with operands the kernels can broadcast to the message shape ``shape``.

    Kernels read full, per-head, per-channel and scalar operands; other broadcasts (and a dot
    product over an operand's broadcast last dimension) get that operand expanded, a stride-0 view.
    """
    for _ in range(2):
        op = canonical(expr, tuple(o.kind for o in operands), gather_op, reduce)
        try:
            layout = infer_layout(op, [(0,) + o.features for o in operands])
            if layout.message_shape == shape:
                return op, operands
        except ValueError:
            pass
        operands = tuple(o if o.shape == shape else replace(o, expand=shape) for o in operands)
    raise CaptureError(f"message() broadcasts its operands to {list(shape)} in a way the kernels cannot read")


def _reshaped_leaf(leaf: Shape, old: Shape, new: Shape) -> Optional[Shape]:
    """The feature shape of an operand (broadcast to ``old``) after its result is viewed as ``new``.

    A full operand takes the new shape and a scalar one stays scalar; a broadcast one follows only
    the insertion or removal of one unit dimension (``unsqueeze`` / ``squeeze``).
    """
    if leaf == old:
        return new
    if math.prod(leaf) == 1:
        return (1,) * len(new)
    if len(new) == len(old) + 1:
        for d in range(len(new)):
            if new[d] == 1 and new[:d] + new[d + 1 :] == old:
                return leaf[:d] + (1,) + leaf[d:]
    if len(new) == len(old) - 1:
        for d in range(len(old)):
            if old[d] == 1 and old[:d] + old[d + 1 :] == new:
                return leaf[:d] + leaf[d + 1 :]
    return None


def _normalize(dim: Any, rank: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise CaptureError(f"message() passes {dim!r} as a dimension; only Python ints are captured")
    if not -rank <= dim < rank:
        raise CaptureError(f"message() uses dimension {dim} of a {rank}-dimensional tensor")
    return dim % rank


# -- handlers: (trace, name, args, kwargs) -> result -------------------------------------------------
def _check_kwargs(name: str, kwargs: Mapping[str, Any], allowed: Sequence[str] = ()) -> None:
    extra = sorted(k for k, v in kwargs.items() if k not in allowed and not (k == "out" and v is None))
    if extra:
        raise CaptureError(f"message() calls {name} with {', '.join(extra)}=..., which the capture does not model")


def _two_arguments(name: str, args: Sequence[Any], kwargs: Mapping[str, Any], swap: bool) -> Tuple[Any, Any]:
    """The two operands of a binary call (swapped for reflected operators such as ``__rsub__``)."""
    _check_kwargs(name, kwargs)
    if len(args) != 2:
        raise CaptureError(f"message() calls {name} with {len(args)} arguments")
    return (args[1], args[0]) if swap else (args[0], args[1])


def _binary(fn: str, swap: bool = False):
    def handler(trace: Trace, name: str, args, kwargs):
        return trace.combine(fn, *_two_arguments(name, args, kwargs, swap))

    return handler


def _extremum(fn: str):
    """``torch.max(a, b)`` is ``maximum``; ``torch.max(a)`` and ``torch.max(a, dim)`` reduce."""

    def handler(trace: Trace, name: str, args, kwargs):
        _check_kwargs(name, kwargs)
        if len(args) != 2 or not isinstance(args[1], Tensor):
            raise CaptureError(
                f"message() calls {name} as a reduction, which the IR cannot express ({_ELEMENTWISE_HINT})"
            )
        return trace.combine(fn, args[0], args[1])

    return handler


def _unary(fn: str, allowed: Sequence[str] = ()):
    def handler(trace: Trace, name: str, args, kwargs):
        _check_kwargs(name, kwargs, allowed)
        if len(args) != 1:
            raise CaptureError(f"message() calls {name} with {len(args)} positional arguments")
        return trace.unary(fn, args[0])

    return handler


def _rsqrt(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs)
    return trace.unary("reciprocal", trace.unary("sqrt", args[0]))


def _leaky_relu(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("negative_slope", "inplace"))
    slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
    if not isinstance(slope, _SCALARS):
        raise CaptureError("message() calls leaky_relu with a slope that is not a Python number")
    return trace.unary("leaky_relu", args[0], float(slope))


def _number(name: str, what: str, value: Any, like: Any = None) -> float:
    """``value``, which must be a Python number; a bound or a comparand of the tensor ``like`` is
    rounded to its dtype, as torch compares in it (the kernels compare half precision in float32)."""
    if not isinstance(value, _SCALARS):
        raise CaptureError(f"message() calls {name} with {what} that is not a Python number")
    if isinstance(like, TracedTensor) and like.dtype.is_floating_point:
        return torch.tensor(float(value), dtype=like.dtype).item()
    return float(value)


def _elu(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("alpha", "inplace"))
    alpha = _number(name, "an alpha", args[1] if len(args) > 1 else kwargs.get("alpha", 1.0))
    return trace.unary("elu", args[0], alpha)


def _gelu(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("approximate",))
    if len(args) != 1:
        raise CaptureError(f"message() calls {name} with {len(args)} positional arguments")
    approximate = kwargs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise CaptureError(
            f"message() calls {name} with approximate={approximate!r}; only 'none' and 'tanh' are captured"
        )
    return trace.unary("gelu" if approximate == "none" else "gelu_tanh", args[0])


def _softplus(trace: Trace, name: str, args, kwargs):
    """``softplus(x, beta, threshold)``: torch's ``x`` where ``beta * x > threshold``, else
    ``log(1 + exp(beta * x)) / beta``; other parameters than the defaults select around the IR's
    ``softplus``."""
    _check_kwargs(name, kwargs, ("beta", "threshold"))
    beta = _number(name, "a beta", args[1] if len(args) > 1 else kwargs.get("beta", 1.0))
    threshold = _number(name, "a threshold", args[2] if len(args) > 2 else kwargs.get("threshold", 20.0))
    if beta == 1.0 and threshold == SOFTPLUS_THRESHOLD:
        return trace.unary("softplus", args[0])
    return trace.function(
        args[0],
        lambda x: Expr.apply(
            "where", Expr.apply("gt", beta * x, threshold), x, Expr.apply("softplus", beta * x) / beta
        ),
    )


def _clamp(trace: Trace, name: str, args, kwargs):
    """``clamp`` / ``clip`` (and ``clamp_min`` / ``clamp_max``) with Python-number bounds: derivative
    1 from bound to bound inclusive, as torch's."""
    short = name.rsplit(".", 1)[-1]
    keys = (short[-3:],) if short in ("clamp_min", "clamp_max") else ("min", "max")
    _check_kwargs(name, kwargs, keys)
    bounds = {key: args[i] if len(args) > i else kwargs.get(key) for i, key in enumerate(keys, start=1)}
    if all(bound is None for bound in bounds.values()):
        raise CaptureError(f"message() calls {name} without a bound")
    x = args[0]
    for key, fn in (("min", "clamp_min"), ("max", "clamp_max")):
        if bounds.get(key) is not None:
            x = trace.unary(fn, x, _number(name, f"a {key} bound", bounds[key], args[0]))
    return x


def _hardtanh(trace: Trace, name: str, args, kwargs):
    """``hardtanh`` / ``relu6``: the clamp whose derivative is 0 at both bounds (and 1 for NaN), as
    torch's; written with ``where`` so that ties follow that rule."""
    _check_kwargs(name, kwargs, ("min_val", "max_val", "inplace"))
    if name.endswith("relu6"):
        low, high = 0.0, 6.0
    else:
        low = _number(name, "a min_val", args[1] if len(args) > 1 else kwargs.get("min_val", -1.0), args[0])
        high = _number(name, "a max_val", args[2] if len(args) > 2 else kwargs.get("max_val", 1.0), args[0])
    if low > high:
        raise CaptureError(f"message() calls {name} with min_val {low} above max_val {high}")

    def build(x: Expr) -> Expr:
        upper = Expr.apply("where", Expr.apply("ge", x, high), high, x)
        return Expr.apply("where", Expr.apply("ge", low, x), low, upper)

    return trace.function(args[0], build)


def _sign(trace: Trace, name: str, args, kwargs):
    """``sign(x) = (x > 0) - (x < 0)``: 0 for 0 and NaN, as torch's; derivative 0."""
    _check_kwargs(name, kwargs)
    return trace.function(args[0], lambda x: Expr.apply("gt", x, 0.0) - Expr.apply("gt", 0.0, x))


def _compare(fn: str, swap: bool = False):
    """``a > b`` as ``gt(a, b)``, ``a < b`` as ``gt(b, a)``...: a boolean traced tensor."""

    def handler(trace: Trace, name: str, args, kwargs):
        a, b = _two_arguments(name, args, kwargs, swap)
        if isinstance(a, _SCALARS):
            a = _number(name, "a number", a, b)
        if isinstance(b, _SCALARS):
            b = _number(name, "a number", b, a)
        return trace.combine(fn, a, b, dtype=torch.bool)

    return handler


def _not_equal(trace: Trace, name: str, args, kwargs):
    equal = _compare("eq")(trace, name, args, kwargs)
    return trace.value(1.0 - equal._expr, equal.features, torch.bool, equal.device, False)


def _logical(fn: Optional[str]):
    """``&`` (``mul``), ``|`` (``maximum``) and ``~`` (``None``: ``1 - c``) of comparison results."""

    def handler(trace: Trace, name: str, args, kwargs):
        _check_kwargs(name, kwargs)
        if len(args) != (1 if fn is None else 2) or not all(
            isinstance(x, TracedTensor) and x.dtype == torch.bool for x in args
        ):
            raise CaptureError(f"message() calls {name} on values that are not comparison results of its tensors")
        if fn is not None:
            return trace.combine(fn, *args, dtype=torch.bool, masks=True)
        (condition,) = args
        expr, features, _, _ = trace.node(condition, mask=True)
        return trace.value(1.0 - expr, features, torch.bool, condition.device, False)

    return handler


def _where(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs)
    if len(args) != 3:
        raise CaptureError(
            f"message() calls {name} with {len(args)} arguments; only torch.where(condition, input, other) is captured"
        )
    if name == "torch.Tensor.where":  # input.where(condition, other)
        return trace.select(args[1], args[0], args[2])
    return trace.select(*args)


_POWERS = {2: "square", 0.5: "sqrt", -1: "reciprocal"}


def _pow(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs)
    exponent = args[1]
    if not isinstance(exponent, _SCALARS) or (exponent != 1 and exponent not in _POWERS):
        raise CaptureError(f"message() raises to the power {exponent!r}; only 1, 2, 0.5 and -1 are captured")
    if exponent == 1:
        return _same(trace, args[0])
    return trace.unary(_POWERS[exponent], args[0])


def _identity(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("memory_format",))
    return _same(trace, args[0])


def _same(trace: Trace, x: Any) -> TracedTensor:
    trace.node(x, mask=True)  # the argument must be computable
    return x


def _dropout(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("p", "training", "train", "inplace"))
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
    if training and p != 0:
        raise CaptureError("message() applies dropout in training mode, which draws random numbers per edge")
    return _same(trace, args[0])


def _converted(trace: Trace, x: Any, dtype: torch.dtype) -> TracedTensor:
    """``x`` in ``dtype``: a conversion that changes nothing, or a comparison result made a
    floating-point mask (its 1.0 / 0.0 are exact in every floating dtype)."""
    if x.dtype == dtype:
        return _same(trace, x)
    if x.dtype == torch.bool and dtype.is_floating_point:
        expr, features, _, _ = trace.node(x, mask=True)
        return trace.value(expr, features, dtype, x.device, False)
    raise CaptureError(
        f"message() converts {x.dtype} to {dtype}; only floating-point math in the arguments' dtype is captured"
    )


def _cast(dtype: torch.dtype):
    def handler(trace: Trace, name: str, args, kwargs):
        _check_kwargs(name, kwargs, ("memory_format",))
        return _converted(trace, args[0], dtype)

    return handler


def _to(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("dtype", "device", "non_blocking", "copy", "memory_format"))
    x = args[0]
    dtype = x.dtype
    for target in list(args[1:]) + [kwargs.get("dtype"), kwargs.get("device")]:
        if isinstance(target, Tensor):
            moves, dtype = target.device != x.device, target.dtype
        elif isinstance(target, torch.dtype):
            moves, dtype = False, target
        elif isinstance(target, (str, torch.device)):
            moves = torch.device(target).type != x.device.type
        else:
            moves = target is not None
        if moves or kwargs.get("copy"):
            raise CaptureError(
                f"message() calls {name} with {target!r}; only conversions that change nothing are captured"
            )
    return _converted(trace, x, dtype)


def _type_as(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs)
    return _converted(trace, args[0], args[1].dtype)


def _shape_arg(args: Sequence[Any]) -> Sequence[Any]:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return args[0]
    return args


def _view(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("shape",))
    x = args[0]
    shape = list(_shape_arg(args[1:]) if len(args) > 1 else kwargs.get("shape", ()))
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise CaptureError(f"message() calls {name} with {shape!r}; only shapes of Python ints are captured")
    return trace.reshape(x, _resolve_view(trace, x.features, shape))


def _resolve_view(trace: Trace, features: Shape, shape: List[int]) -> Shape:
    """The feature shape of ``view(*shape)`` on ``[E, *features]``, which must keep the ``E`` rows."""
    head, rest = shape[0], list(shape[1:])
    if head != -1:
        trace.reads_rows = True
        if head != trace.num_edges:
            raise CaptureError(
                f"message() views its {trace.num_edges} edges as {head} rows, which moves data between edges"
            )
    unknown = rest.count(-1)
    if unknown > (0 if head == -1 else 1) or any(d < -1 for d in rest):
        raise CaptureError(f"message() views a tensor as {shape}, an invalid shape")
    size = math.prod(features)
    if unknown:
        known = math.prod(d for d in rest if d != -1)
        if known == 0 or size % known:
            raise CaptureError(f"message() views features {list(features)} as {shape}")
        rest[rest.index(-1)] = size // known
    if math.prod(rest) != size:
        raise CaptureError(f"message() views features {list(features)} as {shape}, which moves data between edges")
    return tuple(rest)


def _view_as(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs)
    other = args[1]
    if not isinstance(other, TracedTensor):
        raise CaptureError(f"message() calls {name} with a tensor that is not an argument")
    return trace.reshape(args[0], other.features)


def _unsqueeze(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("dim",))
    x = args[0]
    dim = _normalize(args[1] if len(args) > 1 else kwargs["dim"], x.dim() + 1)
    if dim == 0:
        raise CaptureError("message() inserts a dimension before the edge dimension")
    features = x.features
    return trace.reshape(x, features[: dim - 1] + (1,) + features[dim - 1 :])


def _squeeze(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("dim",))
    x = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    rank = x.dim()
    if dims is None:
        dims = range(rank)
    elif isinstance(dims, int):
        dims = (dims,)
    dims = {_normalize(d, rank) for d in dims}
    if 0 in dims:
        # Whether the edge dimension goes depends on the number of edges.
        trace.reads_rows = True
        if trace.num_edges == 1:
            raise CaptureError("message() squeezes the edge dimension of a single edge")
    features = x.features
    kept = tuple(size for d, size in enumerate(features, start=1) if d not in dims or size != 1)
    return trace.reshape(x, kept)


def _flatten(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("start_dim", "end_dim"))
    x = args[0]
    start = args[1] if len(args) > 1 else kwargs.get("start_dim", 0)
    end = args[2] if len(args) > 2 else kwargs.get("end_dim", -1)
    rank = x.dim()
    start, end = _normalize(start, rank), _normalize(end, rank)
    if start > end:
        raise CaptureError("message() calls flatten with start_dim after end_dim")
    if start == end:
        return trace.reshape(x, x.features)
    if start == 0:
        raise CaptureError("message() flattens the edge dimension into the features")
    features = x.features
    merged = features[: start - 1] + (math.prod(features[start - 1 : end]),) + features[end:]
    return trace.reshape(x, merged)


def _getitem(trace: Trace, name: str, args, kwargs):
    """``x[key]`` for a ``key`` of slices, ints and an ``...`` that keeps every edge."""
    x, key = args[0], args[1]
    if not isinstance(x, TracedTensor):
        raise CaptureError(f"message() calls {name} on a value that is not a tensor argument")
    return trace.index_features(x, _feature_index(key, x.features))


def _feature_index(key: Any, features: Shape) -> FeatureIndex:
    """The normalised selection ``key`` makes of ``features`` (after the edge dimension, which it
    must keep whole): one ``(start, stop, step)`` or int per feature dimension."""
    entries = list(key) if isinstance(key, tuple) else [key]
    for entry in entries:
        if not (
            entry is Ellipsis or isinstance(entry, slice) or (isinstance(entry, int) and not isinstance(entry, bool))
        ):
            raise CaptureError(
                f"message() indexes a tensor with {type(entry).__name__} values; only slices, ints and "
                f"... of the feature dimensions are captured"
            )
    if entries.count(Ellipsis) > 1:
        raise CaptureError("message() indexes a tensor with more than one ...")
    rank = 1 + len(features)
    if Ellipsis in entries:
        at = entries.index(Ellipsis)
        entries[at : at + 1] = [slice(None)] * (rank - len(entries) + 1)
    if len(entries) > rank:
        raise CaptureError(f"message() indexes {len(entries)} dimensions of a {rank}-dimensional tensor")
    entries += [slice(None)] * (rank - len(entries))
    rows = entries[0]
    if not (isinstance(rows, slice) and rows.start is None and rows.stop is None and rows.step in (None, 1)):
        raise CaptureError("message() indexes the edge dimension; only the feature dimensions may be indexed")
    index = []
    for entry, size in zip(entries[1:], features):
        if isinstance(entry, int):
            if not -size <= entry < size:
                raise CaptureError(f"message() indexes entry {entry} of a feature dimension of {size}")
            index.append(entry % size)
            continue
        if not all(
            bound is None or (isinstance(bound, int) and not isinstance(bound, bool))
            for bound in (entry.start, entry.stop, entry.step)
        ):
            raise CaptureError("message() slices with bounds that are not Python ints")
        if entry.step is not None and entry.step < 1:
            raise CaptureError(f"message() slices with step {entry.step}; only positive steps are captured")
        index.append(entry.indices(size))
    return tuple(index)


def _sum(trace: Trace, name: str, args, kwargs):
    _check_kwargs(name, kwargs, ("dim", "keepdim", "dtype"))
    x = trace.traced(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if kwargs.get("dtype") is not None:
        raise CaptureError("message() sums with a dtype conversion")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    rank = x.dim()
    if dim is None or not isinstance(dim, int) or rank < 2 or _normalize(dim, rank) != rank - 1:
        raise CaptureError(
            f"message() sums over dim={dim!r} of a {rank}-dimensional tensor; only a sum "
            f"over the last feature dimension (a dot product) is captured"
        )
    features = x.features
    kept = features[:-1] + ((1,) if keepdim else ())
    if features[-1] == 1:  # a sum over one element is a view
        return trace.reshape(x, kept)
    return trace.value(x._expr, kept, x.dtype, x.device, x.requires_grad, computed=features, reduce=True)


def _table() -> Dict[str, Callable]:
    table: Dict[str, Callable] = {}

    def add(handler: Callable, *names: str) -> None:
        for name in names:
            table[name] = handler

    for fn, names in {
        "add": ("add", "__add__"),
        "sub": ("sub", "subtract", "__sub__"),
        "mul": ("mul", "multiply", "__mul__"),
        "div": ("div", "divide", "true_divide", "__truediv__"),
        "maximum": ("maximum",),
        "minimum": ("minimum",),
    }.items():
        add(
            _binary(fn), *(f"torch.{n}" for n in names if not n.startswith("__")), *(f"torch.Tensor.{n}" for n in names)
        )
    add(_binary("add", swap=True), "torch.Tensor.__radd__")
    add(_binary("sub", swap=True), "torch.Tensor.__rsub__", "torch.rsub")
    add(_binary("mul", swap=True), "torch.Tensor.__rmul__")
    add(_binary("div", swap=True), "torch.Tensor.__rtruediv__")
    add(_extremum("maximum"), "torch.max", "torch.Tensor.max")
    add(_extremum("minimum"), "torch.min", "torch.Tensor.min")
    for fn in ("neg", "exp", "log", "relu", "sigmoid", "tanh", "abs", "sqrt", "square", "reciprocal"):
        add(_unary(fn), f"torch.{fn}", f"torch.Tensor.{fn}")
    add(_unary("neg"), "torch.negative", "torch.Tensor.negative", "torch.Tensor.__neg__")
    add(_unary("abs"), "torch.absolute", "torch.Tensor.absolute", "torch.Tensor.__abs__")
    add(_unary("sigmoid"), "torch.special.expit", "torch.nn.functional.sigmoid")
    add(_unary("tanh"), "torch.nn.functional.tanh")
    add(_unary("relu", ("inplace",)), "torch.nn.functional.relu")
    add(_leaky_relu, "torch.nn.functional.leaky_relu")
    for fn in ("erf", "sin", "cos"):
        add(_unary(fn), f"torch.{fn}", f"torch.Tensor.{fn}")
    add(_unary("erf"), "torch.special.erf")
    add(_unary("silu", ("inplace",)), "torch.nn.functional.silu")
    add(_gelu, "torch.nn.functional.gelu")
    add(_elu, "torch.nn.functional.elu")
    add(_softplus, "torch.nn.functional.softplus")
    add(_sign, "torch.sign", "torch.Tensor.sign")
    add(
        _clamp,
        *(f"{owner}.{n}" for owner in ("torch", "torch.Tensor") for n in ("clamp", "clip", "clamp_min", "clamp_max")),
    )
    add(_hardtanh, "torch.nn.functional.hardtanh", "torch.nn.functional.relu6")
    for fn, swap, names in (
        ("gt", False, ("gt", "greater", "__gt__")),
        ("gt", True, ("lt", "less", "__lt__")),
        ("ge", False, ("ge", "greater_equal", "__ge__")),
        ("ge", True, ("le", "less_equal", "__le__")),
        ("eq", False, ("eq", "__eq__")),
    ):
        add(
            _compare(fn, swap),
            *(f"torch.{n}" for n in names if not n.startswith("__")),
            *(f"torch.Tensor.{n}" for n in names),
        )
    add(_not_equal, "torch.ne", "torch.not_equal", "torch.Tensor.ne", "torch.Tensor.not_equal", "torch.Tensor.__ne__")
    for fn, names in (("mul", ("and", "__and__")), ("maximum", ("or", "__or__")), (None, ("not", "__invert__"))):
        add(
            _logical(fn),
            *(f"torch.logical_{n}" for n in names if not n.startswith("__")),
            *(f"torch.Tensor.{n if n.startswith('__') else 'logical_' + n}" for n in names),
        )
    add(_where, "torch.where", "torch.Tensor.where")
    add(_rsqrt, "torch.rsqrt", "torch.Tensor.rsqrt")
    add(_pow, "torch.pow", "torch.Tensor.pow", "torch.Tensor.__pow__")
    add(
        _identity,
        "torch.Tensor.contiguous",
        "torch.Tensor.clone",
        "torch.clone",
        "torch.Tensor.positive",
        "torch.positive",
        "torch.Tensor.__pos__",
    )
    add(_dropout, "torch.nn.functional.dropout", "torch.dropout")
    for method, dtype in (
        ("float", torch.float32),
        ("double", torch.float64),
        ("half", torch.float16),
        ("bfloat16", torch.bfloat16),
    ):
        add(_cast(dtype), f"torch.Tensor.{method}")
    add(_to, "torch.Tensor.to")
    add(_type_as, "torch.Tensor.type_as")
    add(_view, "torch.Tensor.view", "torch.Tensor.reshape", "torch.reshape")
    add(_view_as, "torch.Tensor.view_as", "torch.Tensor.reshape_as")
    add(_unsqueeze, "torch.unsqueeze", "torch.Tensor.unsqueeze")
    add(_squeeze, "torch.squeeze", "torch.Tensor.squeeze")
    add(_flatten, "torch.flatten", "torch.Tensor.flatten")
    add(_sum, "torch.sum", "torch.Tensor.sum")
    add(_getitem, "torch.Tensor.__getitem__")
    return table


HANDLERS = _table()

#: Queries answered from the (real) metadata of a traced tensor.
METADATA = {
    f"torch.Tensor.{n}"
    for n in (
        "size",
        "dim",
        "ndimension",
        "ndim.__get__",
        "shape.__get__",
        "numel",
        "nelement",
        "__len__",
        "dtype.__get__",
        "device.__get__",
        "layout.__get__",
        "is_cuda.__get__",
        "is_sparse.__get__",
        "is_floating_point",
        "is_complex",
        "requires_grad.__get__",
        "get_device",
        "element_size",
    )
} | {"torch.numel", "torch.is_floating_point", "torch.is_complex"}
#: Queries whose answer includes the number of edges.
_ROW_METADATA = {
    "torch.Tensor.shape.__get__",
    "torch.Tensor.numel",
    "torch.Tensor.nelement",
    "torch.Tensor.__len__",
    "torch.numel",
}
#: Python's augmented assignments (``x += y``), when torch does not name them ``add_`` etc.
INPLACE_OPERATORS = {
    f"__i{op}__"
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "matmul",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
    )
}
#: Conversions of tensor values to Python values.
_VALUE_READS = {
    f"torch.Tensor.{n}"
    for n in (
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "item",
        "tolist",
        "numpy",
        "__format__",
        "__repr__",
        "__iter__",
        "__contains__",
    )
}
