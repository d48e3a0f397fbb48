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
* a final ``sum(dim=-1)`` (a dot product): a reducing message op, then the aggregation;
* ``F.linear`` (``nn.Linear``, an MLP's first layer) of a linear combination of arguments or of a
  ``torch.cat`` of such pieces, with a weight and bias of the module: split by linearity into one
  :class:`Product` per argument, a Linear of its rows (``N`` node rows, not ``E``) computed before
  the kernel from the module's current weights at every call;
* parameters and buffers of the module combined with per-edge values (``self.beta * alpha``):
  :class:`Broadcast` operands, read from the module at every call; a tensor computed from them
  alone (GMMConv's ``EPS + self.sigma.view(1, K, D).pow(2)``), which no traced tensor sees, is
  recorded by :class:`ParameterCalls` and becomes a :class:`Computed` operand, made again at every
  call by the same torch calls;
* a dot product (or a view the operands cannot follow) that later code computes with: a value
  computed before the fused operator, once per vertex where it reads one end of the edges
  (:class:`NodeStep`: GAT's ``(x_i * att).sum(-1)``), else per edge by an operator of its own
  (:class:`Step`);
* ``torch.matmul`` of per-edge matrices (NNConv) and a sum over the next-to-last feature dimension:
  operands transposed (:attr:`Operand.transposed`), then a sum over the last one; views of
  parameters; a pick of a tower of a ``torch.cat`` and ``torch.stack`` of one value (PNA);
* PyG's ``softmax(src, index, ptr, size_i)`` over the receivers of the edges (its scores, maxima,
  sums and weights are steps, see :meth:`Trace.edge_softmax`), also from another method of the
  module that ``message()`` calls (:func:`tracing`), PyG's ``SoftmaxAggregation``
  (``softmax_temperature``: two gathers and the final one), and per-edge values ``message()``
  stores on the module (``self._alpha``, :attr:`Capture.stores`);
* a module's own ``aggregate()`` that returns one PyG ``scatter`` of the messages over the
  receivers (:meth:`Trace.scatter`): its reduction is the gather op.

Anything else raises :class:`CaptureError` with a sentence saying why: other matmuls, a Linear of
anything else (an MLP's later layers), other ``nn.Module`` calls, tensors that are neither arguments
nor parameters or buffers of the module (a tensor made inside ``message()``), in-place operations,
Python branching on tensor values, tuples of messages.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import types
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode, resolve_name
from torch_geometric.utils import scatter as pyg_scatter
from torch_geometric.utils import softmax as pyg_softmax

from .backward import canonical
from .ir import SOFTPLUS_THRESHOLD, Expr, OpInfo
from .layout import infer_layout
from .program import (
    Broadcast,
    Call,
    Capture,
    Computed,
    FeatureIndex,
    NodeStep,
    Operand,
    Product,
    Shape,
    Step,
    TaggedArgument,
    Value,
    module_attribute,
    swapped,
    torch_function,
)
from .rebinding import with_globals_replaced


class CaptureError(Exception):
    """``message()`` cannot become one IR operator; ``str(error)`` says why, as a sentence.

    ``num_edges`` is set when the trace read the number of edges: the verdict holds only for
    graphs with that many edges.
    """

    def __init__(self, reason: str, num_edges: Optional[int] = None) -> None:
        super().__init__(reason)
        self.num_edges = num_edges


#: The node counts PyG gives ``message()`` and ``aggregate()``: keys of no capture
#: (:class:`NodeCount`).
NODE_COUNTS = ("size_i", "size_j", "dim_size")


class NodeCount:
    """A node count given to a traced ``message()`` or ``aggregate()`` (:data:`NODE_COUNTS`), which
    PyG's ``softmax`` and ``scatter`` may take: the trace reads it through :func:`plain_count`. Not
    an ``int``, so every other use as a number (arithmetic, a comparison, a conversion, an index,
    a torch call) goes through its methods, which raise :class:`CaptureError`: a capture never
    depends on it and serves every node count."""

    __slots__ = ("value", "name")

    def __init__(self, value: int, name: str) -> None:
        self.value = value
        self.name = name

    def __repr__(self) -> str:
        return f"NodeCount({self.name}={self.value})"

    @property
    def __class__(self) -> type:
        # isinstance(size_i, int) holds, as on the number PyG passes (type() still tells them apart)
        return int

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise CaptureError(
            f"message() computes with the node count {self.name}, which a capture serving every graph cannot hold"
        )

    __hash__ = object.__hash__


for _method in (
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__ __rfloordiv__ "
    "__mod__ __rmod__ __divmod__ __rdivmod__ __pow__ __rpow__ __neg__ __pos__ __abs__ __invert__ __and__ "
    "__rand__ __or__ __ror__ __xor__ __rxor__ __lshift__ __rlshift__ __rshift__ __rrshift__ __lt__ __le__ "
    "__gt__ __ge__ __eq__ __ne__ __bool__ __int__ __float__ __complex__ __index__ __round__ __trunc__ "
    "__floor__ __ceil__"
).split():
    setattr(NodeCount, _method, NodeCount._refuse)


def plain_count(value: Any) -> Any:
    """The number a :class:`NodeCount` holds; ``value`` itself otherwise."""
    return value.value if isinstance(value, NodeCount) else value


def is_node_count(name: str, value: Any) -> bool:
    """Whether the argument ``name`` of ``message()`` or ``aggregate()`` is a node count PyG passes
    (:data:`NODE_COUNTS`, an integer): what keys no capture, and what the trace reads as a
    :class:`NodeCount`."""
    return name in NODE_COUNTS and type(value) is int


def with_node_counts(arguments: Mapping[str, Any]) -> Dict[str, Any]:
    """``arguments`` with each integer node count (:func:`is_node_count`) a :class:`NodeCount`."""
    return {name: NodeCount(value, name) if is_node_count(name, value) else value for name, value in arguments.items()}


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


def capture(
    message: Callable[..., Any],
    arguments: Mapping[str, Any],
    num_edges: int,
    gather_op: str,
    module: Optional[torch.nn.Module] = None,
    softmax_temperature: Any = None,
    aggregate: Optional[Tuple[Callable[..., Any], Mapping[str, Any]]] = None,
) -> Capture:
    r"""Trace ``message(**arguments)`` into IR operators that aggregate with ``gather_op``.

    Args:
        message: the (bound) ``message`` method.
        arguments: its keyword arguments; :class:`Argument` values become traced tensors, anything
            else is passed as it is (and is baked into the capture).
        num_edges: the number of edges (rows of every operand argument).
        gather_op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        module: the module whose parameters and buffers ``message()`` may read (a Linear's weight,
            :class:`Product`; a tensor combined with per-edge values, :class:`Broadcast`) and on
            which it may store per-edge values (:attr:`Capture.stores`).
        softmax_temperature: when given (a number, or a parameter of ``module``), the messages are
            aggregated by PyG's ``SoftmaxAggregation`` with that temperature instead of ``gather_op``:
            :math:`\sum_j \operatorname{softmax}_j(t\,\mathbf{m}_{ji}) \odot \mathbf{m}_{ji}`.
        aggregate: when given, ``(method, arguments)``: the module's own ``aggregate()`` (bound) and
            its keyword arguments besides the messages, as ``arguments`` are given. It is traced on
            the traced messages and must return one ``torch_geometric.utils.scatter`` over the
            receivers (:meth:`Trace.scatter`), whose reduction replaces ``gather_op``.

    Raises:
        CaptureError: ``message()`` is not one elementwise IR operator (or raised an error).
    """
    trace = Trace(num_edges, module)
    given = [arguments] if aggregate is None else [arguments, aggregate[1]]
    sizes = [values.get(name) for values in given for name in ("size_i", "dim_size")]
    trace.num_dst = next((size for size in sizes if type(size) is int), None)
    before = dict(vars(module)) if module is not None else {}
    try:
        kwargs = trace.traced_arguments(with_node_counts(arguments))
        try:
            with tracing(trace, message) as traced_message, ParameterCalls(trace):
                result = traced_message(**kwargs)
        except CaptureError:
            raise
        except Exception as error:  # the user's code failed on traced tensors: let PyG run it
            raise CaptureError(f"message() raised {type(error).__name__} on traced tensors ({error})") from error
        if module is not None:
            trace.store(module, before)
        if aggregate is not None:
            method, aggregate_arguments = aggregate
            return trace.finish_aggregate(trace.run_aggregate(result, method, with_node_counts(aggregate_arguments)))
        if softmax_temperature is not None:
            return trace.finish(trace.softmax_aggregate(result, softmax_temperature), "sum")
        return trace.finish(result, gather_op)
    except CaptureError as error:
        error.num_edges = num_edges if trace.reads_rows else None
        raise
    finally:
        if module is not None:
            restore_traced_attributes(module, before)


def restore_traced_attributes(module: torch.nn.Module, before: Mapping[str, Any]) -> None:
    """Put back the attributes a trace of ``module``'s ``message()`` set to traced tensors (which
    have no values)."""
    for name in [name for name, value in vars(module).items() if isinstance(value, TracedTensor)]:
        if name in before:
            vars(module)[name] = before[name]
        else:
            del vars(module)[name]


#: The arguments PyG fills with the receiver of each edge.
RECEIVER_ARGUMENTS = ("index", "ptr", "edge_index_i")
#: What PyG adds to the softmax denominator.
SOFTMAX_EPSILON = 1e-16


class _Active(threading.local):
    def __init__(self) -> None:
        self.traces: List["Trace"] = []


_ACTIVE = _Active()


@contextlib.contextmanager
def tracing(trace: "Trace", method: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """Make ``trace`` the one :func:`traced_softmax` and :func:`traced_scatter` answer to, in this
    thread, and yield ``method`` reading them in place of PyG's ``softmax`` and ``scatter``.

    For a bound ``method``, the other methods of its object that read those functions read the
    traced ones too while the trace runs (SuperGATConv's ``message()`` calls
    ``self.get_attention()``, which normalises): bound to the object as attributes of its own, which
    shadow the class's, and removed after. Outside a trace, the traced functions are PyG's, so
    another thread calling them meanwhile computes what it would have.
    """
    function = getattr(method, "__func__", None)
    owner = getattr(method, "__self__", None)
    shadows = getattr(owner, "__dict__", None)
    shadowed: List[str] = []
    if function is not None:
        for name, other in _methods_reading_traced(type(owner)).items() if shadows is not None else ():
            if name != function.__name__ and name not in shadows:
                shadows[name] = types.MethodType(with_traced_functions(other), owner)
                shadowed.append(name)
        method = types.MethodType(with_traced_functions(function), owner)
    _ACTIVE.traces.append(trace)
    try:
        yield method
    finally:
        _ACTIVE.traces.pop()
        for name in shadowed:
            shadows.pop(name, None)


class ParameterCalls(TorchFunctionMode):
    """While a trace runs, record the torch calls that compute on the module's parameters and
    buffers alone (:meth:`Trace.record_call`), which no traced tensor sees: a result that later
    meets per-edge values becomes a :class:`~pyg_ugrapher.program.Computed` operand."""

    def __init__(self, trace: "Trace") -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        count = next((value for value in flat_arguments(args, kwargs) if isinstance(value, NodeCount)), None)
        if count is not None:
            count._refuse()
        out = func(*args, **kwargs)
        if not any(isinstance(value, TracedTensor) for value in flat_arguments(args, kwargs)):
            self.trace.record_call(func, args, kwargs, out)
        return out


def _active_trace() -> Optional["Trace"]:
    return _ACTIVE.traces[-1] if _ACTIVE.traces else None


def traced_softmax(
    src: Tensor,
    index: Optional[Tensor] = None,
    ptr: Optional[Tensor] = None,
    num_nodes: Optional[int] = None,
    dim: int = 0,
) -> Tensor:
    """``torch_geometric.utils.softmax`` inside a traced ``message()``: the trace's
    :meth:`Trace.softmax`; PyG's own outside a trace."""
    trace = _active_trace()
    if trace is None:
        return pyg_softmax(src, index, ptr, num_nodes, dim)
    return trace.softmax(src, index, ptr, num_nodes, dim)


def traced_scatter(
    src: Tensor, index: Tensor, dim: int = 0, dim_size: Optional[int] = None, reduce: str = "sum"
) -> Tensor:
    """``torch_geometric.utils.scatter`` inside a traced ``aggregate()``: the trace's
    :meth:`Trace.scatter`; PyG's own elsewhere."""
    trace = _active_trace()
    if trace is None or not trace.aggregating:
        return pyg_scatter(src, index, dim, dim_size, reduce)
    return trace.scatter(src, index, dim, dim_size, reduce)


#: PyG's functions that a traced method reads in their traced form.
_TRACED_FUNCTIONS: Dict[Any, Callable] = {pyg_softmax: traced_softmax, pyg_scatter: traced_scatter}

#: Per class: :func:`_methods_reading_traced`.
_TRACED_METHODS: "weakref.WeakKeyDictionary[type, Dict[str, Callable]]" = weakref.WeakKeyDictionary()


def _methods_reading_traced(cls: type) -> Dict[str, Callable]:
    """The plain functions of ``cls`` (its own or inherited, by attribute name) whose code reads one
    of PyG's functions that have a traced form."""
    methods = _TRACED_METHODS.get(cls)
    if methods is None:
        methods = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                methods.pop(name, None)
                if isinstance(value, types.FunctionType) and with_traced_functions(value) is not value:
                    methods[name] = value
        _TRACED_METHODS[cls] = methods
    return methods


def with_traced_functions(function: Callable) -> Callable:
    """``function`` (a plain function) reading :func:`traced_softmax` and :func:`traced_scatter`
    wherever its module's globals hold PyG's ``softmax`` and ``scatter``; the same function when
    its code reads neither."""
    return with_globals_replaced(function, _TRACED_FUNCTIONS)


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
    #: ``(messages, gather_op)`` of the result of a scatter in ``aggregate()`` (``expr is None``)
    _aggregated: Optional[Tuple["TracedTensor", str]] = None

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
    "the capture models elementwise arithmetic and activations, feature views, slices and sums, Linear "
    "maps and matmuls, and PyG's softmax"
)

_MASK_USE = (
    "message() computes with a comparison result (a boolean tensor) on its own; it is captured as the "
    "condition of torch.where, beside a floating-point tensor (x * (x > 0)) or converted with .to(dtype)"
)


class Trace:
    """The state of one trace: the operand leaves met so far and whether the edge count was read."""

    def __init__(self, num_edges: int, module: Optional[torch.nn.Module] = None) -> None:
        self.num_edges = num_edges
        self.leaves: List[Operand] = []
        self.dtypes: List[torch.dtype] = []  #: of each leaf
        self._leaf_ids: Dict[Operand, int] = {}
        self.reads_rows = False
        #: Handlers running: the shapes they read are the capture's, not message()'s, and do not
        #: make the capture depend on the edge count (a handler that does sets ``reads_rows``).
        self._handling = 0
        self.module = module
        self.values: List[Value] = []
        self.stores: List[Tuple[str, str]] = []
        self._value_names: Dict[Any, str] = {}  #: what a value computes (named "") -> its name
        self._paths: Optional[Dict[int, str]] = None
        #: the traced arguments that hold each edge's receiver (PyG's ``index``, ``ptr``)
        self._receivers: List[TracedTensor] = []
        self.num_dst: Optional[int] = None  #: the number of receivers, where an argument gives it
        self._broadcasts: Set[str] = set()  #: the operand arguments of :class:`Broadcast` values
        #: edge tensors given to ``propagate()`` and the per-edge values computed from them alone
        self._edge_inputs: Set[str] = set()
        #: per ``id()``: a tensor computed from the module's tensors alone, and the call that made it
        #: (its tensor arguments tagged ``("tensor", path)`` or ``("result", id)``), see
        #: :class:`ParameterCalls`
        self._computed: Dict[int, Tuple[Tensor, Call]] = {}
        #: whether ``aggregate()`` is being traced: PyG's ``scatter`` then aggregates the messages
        self.aggregating = False

    # -- leaves -------------------------------------------------------------------------------
    def leaf(self, operand: Operand, dtype: torch.dtype) -> int:
        if operand not in self._leaf_ids:
            self._leaf_ids[operand] = len(self.leaves)
            self.leaves.append(operand)
            self.dtypes.append(dtype)
        return self._leaf_ids[operand]

    def wrap(self, name: str, argument: Argument) -> TracedTensor:
        if argument.kind is None:
            traced = TracedTensor(
                self,
                argument.shape,
                argument.dtype,
                argument.device,
                argument.requires_grad,
                None,
                f"argument {name!r}, {argument.why}",
            )
            if name in RECEIVER_ARGUMENTS:
                self._receivers.append(traced)
            return traced
        if not argument.shape or argument.shape[0] != self.num_edges:
            raise ValueError(
                f"arguments: operand {name!r} needs {self.num_edges} rows, got shape {list(argument.shape)}"
            )
        features = argument.shape[1:]
        if argument.kind == "edge":
            self._edge_inputs.add(name)
        expr = Expr.input(self.leaf(Operand(name, argument.kind, features), argument.dtype))
        return self.value(expr, features, argument.dtype, argument.device, argument.requires_grad)

    def traced_arguments(self, arguments: Mapping[str, Any]) -> Dict[str, Any]:
        """``arguments`` with each :class:`Argument` a traced tensor (:meth:`wrap`), the rest as given."""
        return {
            name: self.wrap(name, value) if isinstance(value, Argument) else value for name, value in arguments.items()
        }

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
        self._handling += 1
        try:
            return handler(self, name, args, kwargs)
        finally:
            self._handling -= 1

    def metadata(self, name: str, func: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        x = args[0]
        if not self._handling:
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

    def traced(self, x: TracedTensor) -> TracedTensor:
        """``x`` as an expression later operations can extend: a dot product, or a view its operands
        cannot follow, is first computed on its own (:meth:`step`: per vertex where it reads one end
        of the edges, else per edge)."""
        if x._expr is None:
            raise CaptureError(f"message() computes with {x._why}")
        if x._reduce or x._computed is not None:
            return self.step(x, None)
        return x

    def combine(self, fn: str, *values: Any, dtype: Optional[torch.dtype] = None, masks: bool = False) -> TracedTensor:
        """``fn(*values)`` with torch's broadcasting, where every edge dimension must line up.

        ``dtype`` is the result's (default: the tensors' promoted dtype). Comparison results may
        take part beside a floating-point tensor, which torch promotes them to, as the condition of
        ``where``, and everywhere with ``masks`` (logical operations).
        """
        rank = max(v.dim() for v in values if isinstance(v, Tensor))
        values = tuple(
            self.broadcast(v, rank) if isinstance(v, Tensor) and not isinstance(v, TracedTensor) else v for v in values
        )
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
            leaf = self.leaves[index]
            shape = _reshaped_leaf(leaf.shape, current, features)
            # a transposed operand follows a view that leaves its transposed dimensions alone
            if shape is None or (leaf.transposed and shape[-2:] != leaf.shape[-2:]):
                return self.value(x._expr, features, x.dtype, x.device, x.requires_grad, computed=current)
            mapping[index] = self.leaf(replace(leaf, shape=shape), self.dtypes[index])
        return self.value(x._expr.remap(mapping), features, x.dtype, x.device, x.requires_grad)

    def transpose(self, x: TracedTensor) -> TracedTensor:
        """``x`` with its last two feature dimensions swapped: each operand is transposed likewise
        (a copy of its rows), or only viewed where one of the two dimensions has a single entry."""
        x = self.traced(x)
        features = x.features
        if len(features) < 2:
            raise CaptureError("message() transposes a value with fewer than two feature dimensions")
        mapping = {}
        for index in x._expr.inputs():
            leaf = self.leaves[index]
            padded = (1,) * (len(features) - len(leaf.shape)) + tuple(leaf.shape)
            if 1 in padded[-2:]:  # a view: no element moves
                if leaf.transposed:
                    raise CaptureError("message() transposes a value twice")
                moved = replace(leaf, shape=swapped(padded))
            else:
                moved = replace(leaf, shape=swapped(padded), transposed=not leaf.transposed)
            mapping[index] = self.leaf(moved, self.dtypes[index])
        return self.value(x._expr.remap(mapping), swapped(features), x.dtype, x.device, x.requires_grad)

    def matmul(self, a: Any, b: Any) -> TracedTensor:
        """``a @ b`` of per-edge matrices (NNConv's ``x_j.unsqueeze(1) @ W_e``): the products of the
        rows of ``a`` and the columns of ``b``, summed over the shared dimension, a dot product."""
        if not isinstance(a, TracedTensor) or not isinstance(b, TracedTensor):
            raise CaptureError("message() multiplies matrices that are not both computed from its arguments")
        if a.dim() < 3 or b.dim() < 3 or a.shape[-1] != b.shape[-2]:
            raise CaptureError(
                f"message() calls matmul of per-edge values of shapes {list(a.features)} and "
                f"{list(b.features)}; only products of per-edge matrices are captured"
            )
        rows = self.reshape(self.traced(a), tuple(a.features[:-1]) + (1, a.shape[-1]))
        columns = self.transpose(b)
        columns = self.reshape(columns, tuple(columns.features[:-2]) + (1,) + tuple(columns.features[-2:]))
        return _sum(self, "torch.matmul", (self.combine("mul", rows, columns), -1), {})

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
            if leaf.index is not None or leaf.transposed:
                raise CaptureError(
                    "message() indexes the features of a value whose features it indexed or transposed "
                    "before; index the arguments once"
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

    # -- values computed before the fused operator --------------------------------------------------
    def _named(self, value: Value, prefix: str) -> str:
        """The argument name of ``value`` (named ``""``): the same for a value met before."""
        name = self._value_names.get(value)
        if name is None:
            name = f"%{prefix}{len(self.values)}"
            self._value_names[value] = name
            self.values.append(replace(value, name=name))
        return name

    def step(
        self, x: TracedTensor, gather_op: Optional[str], grad: bool = True, per_edge: bool = False
    ) -> TracedTensor:
        """A :class:`Step` computing ``x`` per edge (``gather_op=None``) or its ``gather_op`` over
        each receiver's edges, read by later operations as an operand (``edge`` or ``dst_v``); a
        value of one end of the edges is a :class:`NodeStep` instead, unless ``per_edge``."""
        if x._expr is None:
            raise CaptureError(f"message() computes with {x._why}")
        if gather_op is not None:
            x = self.traced(x)
        shape = x.features if x._computed is None else x._computed
        order = list(dict.fromkeys(node.index for node in x._expr.walk() if node.fn == "input"))
        if not order:
            raise CaptureError("message() computes a constant that does not depend on its tensor arguments")
        expr = x._expr.remap({old: new for new, old in enumerate(order)})
        leaves = tuple(self.leaves[i] for i in order)
        ends = {leaf.kind for leaf in leaves if leaf.argument not in self._broadcasts}
        if gather_op is None and not per_edge and len(ends) == 1 and ends != {"edge"}:
            (kind,) = ends
            name = self._named(NodeStep("", expr, leaves, shape, x.features, x._reduce), "node")
        else:
            kind = "edge" if gather_op is None else "dst_v"
            op, operands = fit_operands(expr, leaves, shape, gather_op, x._reduce)
            name = self._named(Step("", op, operands, x.features, grad), "step")
            if gather_op is None and self._of_edge_inputs(x):
                self._edge_inputs.add(name)
        leaf = self.leaf(Operand(name, kind, x.features), x.dtype)
        return self.value(Expr.input(leaf), x.features, x.dtype, x.device, x.requires_grad and grad)

    def broadcast(self, tensor: Tensor, rank: int) -> TracedTensor:
        """A parameter or buffer of the module combined with per-edge values of ``rank`` dimensions:
        a :class:`Broadcast` operand."""
        if not tensor.is_floating_point():
            raise CaptureError(f"message() combines its values with a {tensor.dtype} tensor")
        if tensor.dim() > rank:
            raise CaptureError("message() broadcasts its per-edge values against a larger tensor")
        padded = (1,) * (rank - tensor.dim()) + tuple(tensor.shape)
        if padded[0] != 1:
            raise CaptureError(f"message() combines its edges with a tensor of {padded[0]} rows")
        features = padded[1:]
        path = self._path_of(tensor)
        value: Value
        if path is not None:
            held = module_attribute(self.module, path)
            value = Broadcast("", path, tuple(held.shape), tensor.dtype, features)
        elif self._recorded(tensor):
            calls, reads = self._calls_making(tensor)
            value = Computed("", calls, reads, features)
        else:
            raise CaptureError(
                "message() computes with a tensor that is not an argument of propagate() nor a parameter or "
                "buffer of the module, nor computed from those alone (a tensor made inside message())"
            )
        name = self._named(value, "tensor")
        self._broadcasts.add(name)
        leaf = self.leaf(Operand(name, "edge", features), tensor.dtype)
        return self.value(Expr.input(leaf), features, tensor.dtype, tensor.device, tensor.requires_grad)

    def softmax(self, src: Any, index: Any, ptr: Any, num_nodes: Any, dim: int) -> Any:
        """PyG's ``softmax(src, index, ptr, num_nodes, dim)`` in ``message()``: :meth:`edge_softmax`
        when it normalises over the receivers of the edges."""
        if not isinstance(src, TracedTensor):
            raise CaptureError(
                "message() calls torch_geometric.utils.softmax on a value not computed from its arguments"
            )
        receiver = index if index is not None else ptr
        if not any(receiver is r for r in self._receivers):
            raise CaptureError(
                "message() calls torch_geometric.utils.softmax over other groups than the receivers of the "
                "edges (PyG's index or ptr)"
            )
        if dim not in (0, -src.dim()):
            raise CaptureError(f"message() calls torch_geometric.utils.softmax along dim={dim}, not over the edges")
        num_nodes = plain_count(num_nodes)
        if num_nodes is not None and num_nodes != self.num_dst:
            raise CaptureError(
                "message() calls torch_geometric.utils.softmax with num_nodes that is not the number of receivers"
            )
        if src.dtype not in (torch.float32, torch.float64):
            raise CaptureError(f"message() normalises {src.dtype} scores, which a staged run widens to float32")
        return self.edge_softmax(src)

    def edge_softmax(self, src: TracedTensor) -> TracedTensor:
        r"""PyG's ``softmax`` over the receivers of the edges, as PyG computes it: the scores
        :math:`s`, the receivers' maxima :math:`m_i = \max_j s_{ji}` (no gradient, as PyG's), their
        sums :math:`t_i = \sum_j e^{s_{ji} - m_i}`, and the weights
        :math:`e^{s_{ji} - m_i} / (t_i + 10^{-16})` are :class:`Step` s, the scores (unless they read
        per-edge values alone) and the weights written per edge (``[E, heads]``). The gradients of
        the operators that read them meet per edge, where their terms cancel
        (each weight's gradient sums to little over a receiver's edges), before each vertex sums
        its edges' terms: recomputed in every operator, the terms would cancel only after
        the sums over a hub's edges, and lose the digits they share."""
        scores = self.traced(src)
        leaves = [self.leaves[index] for index in scores._expr.inputs()]
        if any(leaf.kind != "edge" or leaf.argument in self._broadcasts for leaf in leaves):
            scores = self.step(scores, None, per_edge=True)
        shifted, denominator = self._shifted_exponentials(scores)
        return self.step(self.combine("div", shifted, denominator), None, per_edge=True)

    def softmax_aggregate(self, messages: Any, temperature: Any, semi_grad: bool = False) -> Any:
        r"""The messages weighed by their softmax over each receiver (PyG's ``SoftmaxAggregation``),
        as the expression the final operator sums: :math:`e^{t m - M_i} m / (T_i + 10^{-16})`, with
        the maxima :math:`M` and sums :math:`T` two :class:`Step` gathers."""
        if not isinstance(messages, TracedTensor):
            raise CaptureError("message() returns a tensor that does not come from its arguments")
        if semi_grad:
            raise CaptureError("SoftmaxAggregation with semi_grad=True takes no gradient through its weights")
        messages = self.traced(messages)
        if messages.dtype not in (torch.float32, torch.float64):
            raise CaptureError(f"SoftmaxAggregation of {messages.dtype} messages runs staged, in float32")
        scaled = messages
        if not isinstance(temperature, (int, float)) or temperature != 1:
            scaled = self.combine("mul", messages, temperature)
        shifted, denominator = self._shifted_exponentials(scaled)
        return self.combine("div", self.combine("mul", shifted, messages), denominator)

    def _shifted_exponentials(self, scores: TracedTensor) -> Tuple[TracedTensor, TracedTensor]:
        r""":math:`e^{s - m_i}` and :math:`\sum_j e^{s_{ji} - m_i} + 10^{-16}` of a softmax over the
        receivers, with the maxima :math:`m_i` (no gradient, as PyG's) and the sums two gathers."""
        maximum = self.step(scores, "max", grad=False)
        shifted = self.unary("exp", self.combine("sub", scores, maximum))
        return shifted, self.combine("add", self.step(shifted, "sum"), SOFTMAX_EPSILON)

    def run_aggregate(self, messages: Any, method: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
        """What the module's ``aggregate()`` returns for the traced ``messages``; ``arguments`` as
        :func:`capture` takes them."""
        if not isinstance(messages, TracedTensor):
            raise CaptureError("message() returns a tensor that does not come from its arguments")
        kwargs = self.traced_arguments(arguments)
        self.aggregating = True
        try:
            with tracing(self, method) as traced_aggregate, ParameterCalls(self):
                return traced_aggregate(messages, **kwargs)
        except CaptureError as error:
            # the tracer's sentences name message(), whose code it usually runs
            reason = str(error)
            if reason.startswith("message() "):
                raise CaptureError("aggregate() " + reason[len("message() ") :]) from error
            raise
        except Exception as error:
            raise CaptureError(f"aggregate() raised {type(error).__name__} on traced tensors ({error})") from error
        finally:
            self.aggregating = False

    def scatter(self, src: Any, index: Any, dim: int, dim_size: Optional[int], reduce: str) -> TracedTensor:
        """PyG's ``scatter(src, index, dim, dim_size, reduce)`` in ``aggregate()``: the reduction of
        the per-edge values ``src`` over the receivers of the edges, which ``aggregate()`` must
        return as it is (it is the fused operator's result)."""
        if not isinstance(src, TracedTensor) or src._expr is None:
            raise CaptureError("aggregate() scatters a value that is not computed from the messages")
        if not any(index is r for r in self._receivers):
            raise CaptureError(
                "aggregate() scatters over other groups than the receivers of the edges (PyG's index or ptr)"
            )
        if _normalize(dim, src.dim()) != 0:
            raise CaptureError(f"aggregate() scatters along dim={dim}, not over the edges")
        dim_size = plain_count(dim_size)
        if dim_size is None or dim_size != self.num_dst:
            raise CaptureError("aggregate() scatters with dim_size that is not the number of receivers")
        gather_op = _SCATTER_REDUCTIONS.get(reduce)
        if gather_op is None:
            raise CaptureError(f"aggregate() scatters with reduce={reduce!r}; sum, add, mean, max and min are captured")
        out = TracedTensor(
            self,
            (dim_size,) + tuple(src.features),
            src.dtype,
            src.device,
            src.requires_grad,
            None,
            "the result of a scatter in aggregate(), which aggregate() may only return as it is",
        )
        out._aggregated = (src, gather_op)
        return out

    def finish_aggregate(self, result: Any) -> Capture:
        """The capture of a traced ``aggregate()``'s ``result``: the scatter it returns."""
        aggregated = getattr(result, "_aggregated", None) if isinstance(result, TracedTensor) else None
        if aggregated is None or result._trace is not self:
            raise CaptureError(
                "aggregate() returns something else than one torch_geometric.utils.scatter of the messages over "
                "the receivers; only that is captured"
            )
        return self.finish(*aggregated)

    def store(self, module: torch.nn.Module, before: Mapping[str, Any]) -> None:
        """Record the traced values ``message()`` stored on ``module`` (``self._alpha = alpha``): each
        is a per-edge operand argument (a :class:`Step` where it is not one already), set on the
        module at every call."""
        for attribute, value in list(vars(module).items()):
            if not isinstance(value, TracedTensor) or value._trace is not self:
                continue
            if value._expr is None:
                raise CaptureError(f"message() stores {value._why} on the module")
            leaf = self.leaves[value._expr.index] if value._expr.fn == "input" else None
            whole = leaf is not None and leaf.kind == "edge" and leaf.index is None and leaf.expand is None
            if not (whole and value._computed is None and not value._reduce and leaf.shape == value.features):
                value = self.step(value, None, per_edge=True)
            self.stores.append((attribute, self.leaves[value._expr.index].argument))

    def concatenate(self, tensors: Sequence[Any], dim: int) -> Any:
        """``torch.cat`` along the features of traced values: kept in pieces, for a Linear to split;
        ``NotImplemented`` for any other concatenation."""
        if not any(isinstance(t, TracedTensor) for t in tensors):
            return NotImplemented
        ranks = {t.dim() for t in tensors}
        if len(ranks) != 1 or not isinstance(dim, int):
            return NotImplemented
        (rank,) = ranks
        if dim % rank != rank - 1 or rank < 2:
            return NotImplemented
        heads = {tuple(t.shape[:-1]) for t in tensors}
        dtypes = {t.dtype for t in tensors}
        if len(heads) != 1 or len(dtypes) != 1 or next(iter(heads))[0] != self.num_edges:
            return NotImplemented
        features = tuple(tensors[0].shape[1:-1]) + (sum(t.shape[-1] for t in tensors),)
        device = next(t.device for t in tensors if isinstance(t, TracedTensor))
        grad = any(t.requires_grad for t in tensors) and torch.is_grad_enabled()
        out = TracedTensor(self, (self.num_edges,) + features, dtypes.pop(), device, grad, None, _CAT_PIECES)
        out._parts = tuple(tensors)
        return out

    def linear(self, x: Any, weight: Any, bias: Any) -> TracedTensor:
        """``F.linear(x, weight, bias)`` of a linear combination of operands (or a ``torch.cat`` of
        such pieces), with a weight and bias of the module: one :class:`Product` per operand, each a
        new operand of the kernel (see :class:`Product`)."""
        if not isinstance(x, TracedTensor):
            raise CaptureError("message() applies a Linear to a tensor that is not computed from its arguments")
        weight_path, bias_path = self._parameter_path(weight, "weight"), None
        if bias is not None:
            bias_path = self._parameter_path(bias, "bias")
        for path, tensor in ((weight_path, weight), (bias_path, bias)):
            if path is not None and module_attribute(self.module, path) is not tensor:
                raise CaptureError(f"message() applies a Linear to a view of {path}")
        if weight.dim() != 2 or weight.dtype != x.dtype or weight.shape[1] != x.shape[-1]:
            raise CaptureError(
                f"message() applies a Linear whose {weight.dtype} weight of shape {list(weight.shape)} does not "
                f"match its {x.dtype} input of {x.shape[-1]} features"
            )
        columns: Dict[int, List[Tuple[int, int, float]]] = {}
        start = 0
        for piece in x._parts if x._parts is not None else (x,):
            width = piece.shape[-1]
            terms = None
            if isinstance(piece, TracedTensor):
                piece = self.traced(piece)
                terms = linear_terms(piece._expr)
                if terms is None and self._of_edge_inputs(piece):
                    # a transform of the edge features alone (HEATConv's leaky_relu of their
                    # Linear): written per edge, then multiplied row by row, as PyG multiplies it
                    piece = self.step(piece, None, per_edge=True)
                    terms = {piece._expr.index: 1.0}
            if terms is None:
                raise CaptureError(
                    "message() applies a Linear to a value that is not a sum of its arguments times numbers "
                    "(a Linear after an activation, as in an MLP's later layers, multiplies per-edge values)"
                )
            for index, coefficient in terms.items():
                if self.leaves[index].shape != tuple(piece.shape[1:]):
                    raise CaptureError("message() applies a Linear to arguments broadcast against each other")
                if self.leaves[index].transposed:
                    raise CaptureError("message() applies a Linear to a transposed value")
                columns.setdefault(index, []).append((start, start + width, coefficient))
            start += width
        result: Optional[TracedTensor] = None
        requires_grad = weight.requires_grad or (bias is not None and bias.requires_grad) or x.requires_grad
        for index, blocks in columns.items():
            leaf = self.leaves[index]
            computed = any(isinstance(value, Step) and value.name == leaf.argument for value in self.values)
            if computed and leaf.argument not in self._edge_inputs:
                raise CaptureError(
                    "message() applies a Linear to per-edge values it computed (a dot product, a softmax...), "
                    "which would multiply a row per edge"
                )
            product = Product(
                "",
                leaf,
                weight_path,
                tuple(weight.shape),
                weight.dtype,
                tuple(blocks),
                bias_path if result is None else None,
            )
            name = self._named(product, "linear")
            if leaf.argument in self._edge_inputs:
                self._edge_inputs.add(name)
            features = leaf.shape[:-1] + (weight.shape[0],)
            expr = Expr.input(self.leaf(Operand(name, leaf.kind, features), weight.dtype))
            term = self.value(expr, features, weight.dtype, x.device, requires_grad)
            result = term if result is None else self.combine("add", result, term)
        assert result is not None, "a traced Linear input has at least one operand"
        return result

    def _of_edge_inputs(self, x: TracedTensor) -> bool:
        """Whether ``x`` is computed from edge inputs alone (edge tensors given to ``propagate()``,
        and values computed from them and the module's parameters only), one of them at least."""
        arguments = {self.leaves[index].argument for index in x._expr.inputs()}
        return bool(arguments & self._edge_inputs) and arguments <= self._edge_inputs | self._broadcasts

    def _parameter_path(self, tensor: Any, what: str) -> str:
        """The attribute path of ``tensor`` among the module's parameters and buffers; ``what`` names
        it in the error (a Linear's ``"weight"``), or is the whole sentence of the error."""
        if isinstance(tensor, TracedTensor):
            raise CaptureError(f"message() applies a Linear whose {what} is computed from its arguments")
        if not isinstance(tensor, Tensor):
            raise CaptureError(f"message() applies a Linear whose {what} is a {type(tensor).__name__}")
        path = self._path_of(tensor)
        if path is None:
            raise CaptureError(
                what
                if what.startswith("message() ")
                else f"message() applies a Linear whose {what} is not a parameter or buffer of the module "
                f"(a tensor computed from them, or made inside message())"
            )
        return path

    def _path_of(self, tensor: Tensor) -> Optional[str]:
        """The attribute path of ``tensor`` among the module's parameters and buffers, or of the
        tensor it views in the same element order (``self.mu.view(1, K, D)``); ``None`` if neither."""
        paths = self._module_paths()
        path = paths.get(id(tensor))
        base = tensor._base
        if path is None and base is not None and _reshapes(tensor, base):
            path = paths.get(id(base))
        return path

    def _module_paths(self) -> Dict[int, str]:
        """Per ``id()``, the attribute path of each parameter and buffer of the module (made once)."""
        if self._paths is None:
            named = () if self.module is None else self.module.named_parameters(remove_duplicate=False)
            buffers = () if self.module is None else self.module.named_buffers(remove_duplicate=False)
            self._paths = {}
            for path, value in list(named) + list(buffers):
                self._paths.setdefault(id(value), path)
        return self._paths

    def _recorded(self, tensor: Tensor) -> bool:
        """Whether :meth:`record_call` kept how ``tensor`` was made."""
        return self._computed.get(id(tensor), (None,))[0] is tensor

    def record_call(self, func: Callable, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> None:
        """Keep how ``out`` was made when ``func`` computed it from the module's tensors (and
        earlier such results) and constants alone, for :class:`Computed` to make it again."""
        if not isinstance(out, Tensor) or isinstance(out, TracedTensor) or self.module is None:
            return
        name = function_name(func)
        try:
            if torch_function(name) is not func:
                return
        except (AttributeError, ValueError):
            return
        reads: List[bool] = []

        def tag(value: Any) -> Optional[TaggedArgument]:
            if isinstance(value, Tensor):
                if isinstance(value, TracedTensor):
                    return None
                path = self._module_paths().get(id(value))
                if path is not None:
                    reads.append(True)
                    return ("tensor", path)
                if self._recorded(value):
                    reads.append(True)
                    return ("result", id(value))
                return None
            if isinstance(value, (list, tuple)):
                items = tuple(tag(item) for item in value)
                if any(item is None for item in items):
                    return None
                return ("list" if isinstance(value, list) else "tuple", items)
            if isinstance(value, slice):
                return ("slice", (value.start, value.stop, value.step))
            if value is None or value is Ellipsis or isinstance(value, (bool, int, float, str, torch.dtype)):
                return ("value", value)
            return None

        tagged_args = tuple(tag(a) for a in args)
        tagged_kwargs = tuple((key, tag(a)) for key, a in kwargs.items())
        if not reads or any(a is None for a in tagged_args) or any(a is None for _, a in tagged_kwargs):
            return
        self._computed[id(out)] = (out, (name, tagged_args, tagged_kwargs))

    def _calls_making(self, tensor: Tensor) -> Tuple[Tuple[Call, ...], Tuple[Tuple[str, Shape, torch.dtype], ...]]:
        """The calls that made a recorded ``tensor`` (its own last), each ``("result", k)`` naming
        the ``k``-th of them, and the module tensors they read with their shapes and dtypes."""
        calls: List[Call] = []
        done: Dict[int, int] = {}
        reads: Dict[str, Tuple[str, Shape, torch.dtype]] = {}

        def renumber(tagged: TaggedArgument) -> TaggedArgument:
            tag, value = tagged
            if tag == "result":
                return ("result", make(value))
            if tag in ("list", "tuple"):
                return (tag, tuple(renumber(item) for item in value))
            if tag == "tensor":
                held = module_attribute(self.module, value)
                reads[value] = (value, tuple(held.shape), held.dtype)
            return tagged

        def make(key: int) -> int:
            if key not in done:
                name, args, kwargs = self._computed[key][1]
                call = (name, tuple(renumber(a) for a in args), tuple((k, renumber(a)) for k, a in kwargs))
                done[key] = len(calls)
                calls.append(call)
            return done[key]

        make(id(tensor))
        return tuple(calls), tuple(reads.values())

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
        num_edges = self.num_edges if self.reads_rows else None
        values = self._values_of(operands)
        return Capture(op, operands, result.features, gather, num_edges, values, tuple(self.stores))

    def _values_of(self, operands: Sequence[Operand]) -> Tuple[Value, ...]:
        """The values ``operands`` and the stores read, and the earlier ones those read, in order."""
        needed = {operand.argument for operand in operands} | {argument for _, argument in self.stores}
        kept: List[Value] = []
        for value in reversed(self.values):
            if value.name in needed:
                kept.append(value)
                if isinstance(value, Product):
                    needed.add(value.source.argument)
                elif isinstance(value, (Step, NodeStep)):
                    needed.update(operand.argument for operand in value.operands)
        return tuple(reversed(kept))


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
    """``x[key]`` for a ``key`` of slices, ints and an ``...`` that keeps every edge; of a
    ``torch.cat`` (PNA's towers, ``h[:, i]``), each piece is indexed when the concatenated last
    dimension stays whole."""
    x, key = args[0], args[1]
    if not isinstance(x, TracedTensor):
        raise CaptureError(f"message() calls {name} on a value that is not a tensor argument")
    index = _feature_index(key, x.features)
    if x._parts is None:
        return trace.index_features(x, index)
    if len(index) == len(x.features) and index[-1] != (0, x.features[-1], 1):
        raise CaptureError("message() indexes the concatenated dimension of a torch.cat")
    pieces = [
        trace.index_features(piece, index[:-1] + ((0, piece.shape[-1], 1),) if len(index) == len(x.features) else index)
        for piece in x._parts
    ]
    return trace.concatenate(pieces, -1)


def _stack(trace: Trace, name: str, args, kwargs):
    """``torch.stack`` of one value: a new feature dimension (PNA's single tower)."""
    tensors, dim = cat_arguments(args, kwargs)
    if tensors is None or len(tensors) != 1 or not isinstance(tensors[0], TracedTensor) or not isinstance(dim, int):
        raise CaptureError(f"message() calls {name} of several values, which the messages would hold side by side")
    return _unsqueeze(trace, name, (tensors[0], dim), {})


def _matmul(trace: Trace, name: str, args, kwargs):
    if kwargs or len(args) != 2:
        raise CaptureError(f"message() calls {name} with arguments the capture does not model")
    return trace.matmul(*args)


def _repeat(trace: Trace, name: str, args, kwargs):
    """``x.repeat(1, ..., 1)``: the same value (PNA's edge features over a single tower)."""
    sizes = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
    if kwargs or not all(size == 1 for size in sizes) or len(sizes) != args[0].dim():
        raise CaptureError(f"message() calls {name}, which copies values between features")
    return _same(trace, args[0])


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
    if isinstance(dim, int) and rank >= 3 and _normalize(dim, rank) == rank - 2:
        # over the next-to-last dimension: the operands transposed, then over the last one
        features = x.features
        summed = _sum(trace, name, (trace.transpose(x), -1), {})
        return trace.reshape(summed, features[:-2] + ((1,) if keepdim else ()) + features[-1:])
    if dim is None or not isinstance(dim, int) or rank < 2 or _normalize(dim, rank) != rank - 1:
        raise CaptureError(
            f"message() sums over dim={dim!r} of a {rank}-dimensional tensor; only a sum over the "
            f"last feature dimension (a dot product), or the one before it, is captured"
        )
    features = x.features
    kept = features[:-1] + ((1,) if keepdim else ())
    if features[-1] == 1:  # a sum over one element is a view
        return trace.reshape(x, kept)
    return trace.value(x._expr, kept, x.dtype, x.device, x.requires_grad, computed=features, reduce=True)


def _reshapes(view: Tensor, base: Tensor) -> bool:
    """Whether ``view`` holds ``base``'s elements in their order, only viewed in another shape."""
    return (
        view.numel() == base.numel()
        and view.storage_offset() == base.storage_offset()
        and view.is_contiguous()
        and base.is_contiguous()
    )


def linear_terms(expr: Expr) -> Optional[Dict[int, float]]:
    """``expr`` as ``{operand slot: coefficient}`` when it is a linear combination of operands."""
    if expr.fn == "input":
        return {expr.index: 1.0}
    if expr.fn == "neg":
        inner = linear_terms(expr.args[0])
        return None if inner is None else {i: -c for i, c in inner.items()}
    if expr.fn in ("add", "sub"):
        left, right = (linear_terms(arg) for arg in expr.args)
        if left is None or right is None:
            return None
        sign = 1.0 if expr.fn == "add" else -1.0
        out = dict(left)
        for index, coefficient in right.items():
            out[index] = out.get(index, 0.0) + sign * coefficient
        return out
    if expr.fn in ("mul", "div"):
        left, right = expr.args
        if right.fn == "const":
            inner = linear_terms(left)
            scale = right.value if expr.fn == "mul" else 1.0 / right.value
        elif left.fn == "const" and expr.fn == "mul":
            inner, scale = linear_terms(right), left.value
        else:
            return None
        return None if inner is None else {i: c * scale for i, c in inner.items()}
    return None


def linear_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Tuple[Any, Any, Any]:
    """``(input, weight, bias)`` of a call of ``F.linear``."""
    x = args[0] if args else kwargs.get("input")
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return x, weight, bias


def cat_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Tuple[Any, Any]:
    """``(tensors, dim)`` of a call of ``torch.cat``; ``tensors`` is ``None`` for an unexpected call."""
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or set(kwargs) - {"tensors", "dim"}:
        return None, dim
    return list(tensors), dim


def _linear(trace: Trace, name: str, args, kwargs):
    return trace.linear(*linear_arguments(args, kwargs))


def _cat(trace: Trace, name: str, args, kwargs):
    tensors, dim = cat_arguments(args, kwargs)
    result = NotImplemented if tensors is None else trace.concatenate(tensors, dim)
    if result is NotImplemented:
        raise CaptureError(
            f"message() calls {name} other than along the last feature dimension of per-edge values of one "
            f"dtype; a concatenation is captured only as the input of a Linear"
        )
    return result


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
    add(_linear, "torch.nn.functional.linear")
    add(_cat, "torch.cat", "torch.concat", "torch.concatenate")
    add(_stack, "torch.stack")
    add(_matmul, "torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__", "torch.bmm", "torch.Tensor.bmm")
    add(_repeat, "torch.Tensor.repeat")
    return table


HANDLERS = _table()

#: The gather op of each reduction of PyG's ``scatter`` that the capture models.
_SCATTER_REDUCTIONS = {"sum": "sum", "add": "sum", "mean": "mean", "max": "max", "min": "min"}

#: What a ``torch.cat`` of traced values is, until a Linear splits it.
_CAT_PIECES = "the pieces of a torch.cat (captured only as the input of a Linear)"

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
