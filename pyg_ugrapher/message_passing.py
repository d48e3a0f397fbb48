r"""``MessagePassing``: PyG's base class, with ``message()`` and the aggregation fused into one IR op.

PyG's message passing computes

.. math::
    \mathbf{x}_i^{\prime} = \gamma\left(\mathbf{x}_i, \bigoplus_{j \in \mathcal{N}(i)}
    \phi\left(\mathbf{x}_i, \mathbf{x}_j, \mathbf{e}_{j,i}\right)\right)

by materialising every message :math:`\phi(\cdot)` as an ``[E, F]`` tensor and then reducing it.
Here :math:`\phi` (``message()``) is traced once per argument signature into an
:class:`~pyg_ugrapher.ir.OpInfo` (see :mod:`pyg_ugrapher.capture`) whose gather op is
:math:`\bigoplus` (``aggr``), and :func:`~pyg_ugrapher.compute` runs both in one kernel that never
writes the messages; :math:`\gamma` (``update()``) is applied to its result as in PyG. A message
that is not one elementwise IR op, and every PyG feature that needs the materialised messages,
runs PyG's own ``propagate()`` instead, with the reason kept in :attr:`MessagePassing.fallback_reason`.
A module may be called from several threads at once; what it shares between them: ``docs/caches.md``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric import EdgeIndex
from torch_geometric.index import ptr2index
from torch_geometric.inspector import Inspector
from torch_geometric.nn.aggr import SoftmaxAggregation
from torch_geometric.nn.conv import MessagePassing as PyGMessagePassing
from torch_geometric.typing import Adj, Size
from torch_geometric.utils import is_sparse, is_torch_sparse_tensor

from .aggregation import GATHER_OPS, GatherRunner, in_pytorch, on_graph_operators
from .aggregation import aggregate as aggregate_parts
from .backward import canonical
from .capture import Argument, CaptureError, is_node_count
from .capture import capture as trace_message
from .graph import GraphTensor
from .graph_argument import HOST_BOUND_EDGES, derived, host_bound, layer_structure, note_bounds
from .ir import Expr, OpInfo
from .ops import AUTO, call_graph_op, compute
from .program import Capture, OpRunner, Step, build_operand, build_value
from .staging import ON_EDGES, Staged, StagedTrace, stage
from .structure import GraphStructure, records_steps

#: The gather op :meth:`MessagePassing._static_check` names for PyG's ``SoftmaxAggregation``: a staged
#: run aggregates the messages by gathers that recompute them
#: (:meth:`~pyg_ugrapher.staging.StagedTrace.softmax_aggregate`).
SOFTMAX_GATHER = "softmax"

#: The gather op :meth:`MessagePassing._static_check` names for an aggregation module computed part
#: by part (:mod:`pyg_ugrapher.aggregation`: ``MultiAggregation``, ``DegreeScalerAggregation``): a
#: staged run aggregates the per-edge messages with each part.
PARTS_GATHER = "parts"


#: The gather op :meth:`MessagePassing._static_check` names for a module with its own
#: ``aggregate()``: traced with ``message()``, it must return one PyG ``scatter`` of the messages
#: over the receivers, whose reduction is the gather op; anything else runs PyG's path.
AGGREGATE_GATHER = "aggregate()"

#: How many argument signatures a module keeps captures for.
MAX_CAPTURES = 64
#: The edge count ``message()`` is traced with under ``torch.compile``, whose edge count may be
#: symbolic (``dynamic=True``), never a number the trace could take: a capture that reads the count
#: holds for that count alone, and there PyG's propagation runs (:func:`_compiled_capture`).
COMPILED_TRACE_EDGES = 2
#: The node counts (``size_i``...) a compiled trace gives ``message()``: a capture never depends on
#: them (:class:`~pyg_ugrapher.capture.NodeCount`), and the call's may be symbolic.
COMPILED_TRACE_NODES = 3

FallbackObserver = Callable[["MessagePassing", str], None]


class _FallbackObservers(threading.local):
    """This thread's observers of fallbacks (or of staged runs)."""

    def __init__(self) -> None:
        self.callbacks: List[FallbackObserver] = []


_FALLBACK_OBSERVERS = _FallbackObservers()
_STAGE_OBSERVERS = _FallbackObservers()


@contextmanager
def observe_fallbacks(callback: FallbackObserver) -> Iterator[None]:
    """Call ``callback(module, reason)`` whenever a :class:`MessagePassing` inside the ``with`` block
    runs PyG's own ``propagate()`` instead of a captured op (``ug.plan`` reports these), in this
    thread."""
    callbacks = _FALLBACK_OBSERVERS.callbacks
    callbacks.append(callback)
    try:
        yield
    finally:
        callbacks.remove(callback)


@contextmanager
def observe_stages(callback: FallbackObserver) -> Iterator[None]:
    """Call ``callback(module, description)`` whenever a :class:`MessagePassing` inside the ``with``
    block runs ``message()`` or ``edge_update()`` staged (:mod:`pyg_ugrapher.staging`; ``ug.plan``
    reports these), in this thread; ``description`` says what ran in PyTorch and why."""
    callbacks = _STAGE_OBSERVERS.callbacks
    callbacks.append(callback)
    try:
        yield
    finally:
        callbacks.remove(callback)


def _notify_stage(module: "MessagePassing", description: str) -> None:
    for callback in list(_STAGE_OBSERVERS.callbacks):
        callback(module, description)


class _Fallback(Exception):
    """Raised while preparing a captured propagation: run PyG's path; ``str()`` is the reason."""

    def __str__(self) -> str:
        # In Python, not Exception's C method, which torch 2.11's Dynamo cannot trace (a fallback
        # under torch.compile then broke the graph).
        return self.args[0] if self.args else ""


class _Stage(_Fallback):
    """Raised when ``message()`` is not one fused operator: run it staged (:mod:`pyg_ugrapher.staging`)."""


class _Lifted(NamedTuple):
    """A node tensor PyG would index by one endpoint of every edge (``x_i``, ``x_j``), not indexed."""

    tensor: Tensor
    dim: int  #: the row of ``edge_index`` PyG would index it with
    kind: str  #: ``"src_v"`` or ``"dst_v"``


class _Failure(NamedTuple):
    reason: str
    num_edges: Optional[int]  #: the verdict holds for this edge count only (the trace read it)
    stageable: bool = False  #: a staged run may still serve the signature


#: Modules by their :attr:`_State.token`: what :func:`_compiled_capture` is given instead of the
#: module, since a compiled graph's constant function takes constants only (torch 2.11's Dynamo
#: refuses a module argument there).
_MODULES: "weakref.WeakValueDictionary[int, PyGMessagePassing]" = weakref.WeakValueDictionary()
_TOKENS = itertools.count()


class _Call(threading.local):
    """What the module's call in this thread is doing: another thread may call the module meanwhile."""

    def __init__(self) -> None:
        #: PyG's collection of ``message()`` arguments runs for a capture: node tensors stay unindexed.
        self.collecting = False
        #: PyG's ``propagate()`` runs a fallback whose propagate pre-hooks already ran: it sees none.
        self.hooks_ran = False


class _State:
    """Everything this class adds to a module, in one attribute: the module's plain-valued attributes
    key the captures (``message()`` may read them), and this object is not one of them. Captures are
    shared by every thread (two threads that trace one signature at once store equal captures);
    :attr:`last` and :attr:`fallback_reason` are those of the module's latest call in any thread."""

    def __init__(self, module: Optional[PyGMessagePassing] = None) -> None:
        self.token = next(_TOKENS)  #: the module's key in :data:`_MODULES`
        if module is not None:
            _MODULES[self.token] = module
        self.captures: "OrderedDict[Hashable, Union[Capture, _Failure]]" = OrderedDict()
        self.last: Optional[Capture] = None
        self.fallback_reason: Optional[str] = None
        self.staged: Optional[str] = None  #: what the latest staged call ran, as a sentence
        #: why the latest edge_updater() call ran PyG's path; ``None`` when it ran staged
        self.edge_fallback: Optional[str] = None
        self.trace_count = 0
        self.call = _Call()
        #: ``(name, default)`` of the message()/aggregate()/update() arguments (:func:`_argument_defaults`)
        self.defaults: Optional[Tuple[Tuple[str, Any], ...]] = None

    def __reduce__(self):
        # Captures are not saved with a module: they are re-traced on first use.
        return _State, ()


@torch.compiler.disable
def _propagate_eagerly(module: "MessagePassing", edge_index: Tensor, size: Size, kwargs: Dict[str, Any]) -> Tensor:
    """``module.propagate`` of a ``torch.sparse`` adjacency, never traced (see ``propagate``)."""
    return module._propagate(edge_index, size, kwargs)


#: The default :attr:`MessagePassing.staged_min_edges`.
STAGED_MIN_EDGES = 1 << 20
#: The default :attr:`MessagePassing.fused_min_edges`: the drop-in layers' own
#: :data:`~pyg_ugrapher.graph_argument.HOST_BOUND_EDGES`.
FUSED_MIN_EDGES = HOST_BOUND_EDGES


#: Where a module keeps its propagate() pre-hooks (PyG's ``_propagate_forward_pre_hooks``).
PRE_HOOKS = "_ug_propagate_forward_pre_hooks"


def adopt(layer: PyGMessagePassing) -> None:
    """Give a PyG layer whose class was just made a subclass of :class:`MessagePassing` (in place:
    :func:`pyg_ugrapher.accelerate` routes a layer so) the state of one built as such."""
    layer.__dict__["_ug_state"] = _State(layer)
    layer.__dict__[PRE_HOOKS] = layer.__dict__.pop("_propagate_forward_pre_hooks", OrderedDict())


class MessagePassing(PyGMessagePassing):
    r"""A drop-in for :class:`torch_geometric.nn.MessagePassing` whose propagation runs as one fused
    uGrapher operator.

    .. math::
        \mathbf{x}_i^{\prime} = \gamma\left(\mathbf{x}_i, \bigoplus_{j \in \mathcal{N}(i)}
        \phi\left(\mathbf{x}_i, \mathbf{x}_j, \mathbf{e}_{j,i}\right)\right)

    Subclass it exactly as PyG's class: implement ``message()`` (and optionally ``update()``) and call
    :meth:`propagate` from ``forward()``. On the first call with a given argument signature (names,
    which arguments are present, their dtypes and feature shapes, plain-valued module attributes)
    ``message()`` is traced into an :class:`~pyg_ugrapher.ir.OpInfo`: ``x_j`` becomes an operand read
    at the source vertex, ``x_i`` at the destination vertex, tensors with one row per edge at the
    edge. Elementwise arithmetic, activations, feature views and a final dot product are captured
    (:mod:`pyg_ugrapher.capture`); ``aggr`` (``"sum"``/``"add"``, ``"mean"``, ``"max"``, ``"min"`` or
    the matching :class:`~torch_geometric.nn.aggr.Aggregation`) becomes the gather op.

    PyG's own ``propagate()`` runs instead, never a wrong answer, when ``message()`` is not one
    elementwise IR op (``torch.cat``, per-edge ``nn.Module`` s, tuples, data-dependent Python...),
    for other aggregations, an ``aggregate()`` of the class's own that is not one PyG ``scatter``
    of the messages over the receivers, hooks on ``message()``/``aggregate()``,
    explain mode, ``decomposed_layers > 1``, and inputs for which PyG runs
    ``message_and_aggregate()``, and for eager calls on small GPU graphs (:attr:`fused_min_edges`).
    :attr:`fallback_reason` says why, as a sentence. A ``message()`` or
    ``edge_update()`` that is not one IR op runs *staged* (:mod:`pyg_ugrapher.staging`) on a graph
    of at least :attr:`staged_min_edges` edges, and PyG's way on a smaller one.

    Args:
        aggr: the aggregation, as in PyG.
        aggr_kwargs: arguments of a resolved aggregation, as in PyG.
        flow: ``"source_to_target"`` or ``"target_to_source"``.
        node_dim: the node dimension of node tensors; captured when it is their first dimension.
        decomposed_layers: PyG's feature decomposition; values above 1 run PyG's path.

    Example::

        >>> class WeightedSum(ug.MessagePassing):
        ...     def forward(self, x, edge_index, edge_weight):
        ...         return self.propagate(edge_index, x=x, edge_weight=edge_weight)
        ...     def message(self, x_j, edge_weight):
        ...         return x_j * edge_weight.view(-1, 1)
        >>> conv = WeightedSum(aggr="mean")
        >>> out = conv(x, edge_index, edge_weight)   # one u_mul_e_mean kernel
        >>> conv.fallback_reason is None
        True
    """

    #: A propagation (or ``edge_updater()`` call) that would run staged, or whose capture runs
    #: graph operators before the fused one (a softmax: :class:`~pyg_ugrapher.program.Step`), does
    #: so on a graph of at least this many edges; on a smaller one PyG's runs (compiled under
    #: ``torch.compile``), except while :class:`~pyg_ugrapher.recording.RecordedStep` records a step.
    #: A staged run costs host time per traced operation on every call, and each graph operator
    #: host time of its own, more than PyG's torch calls cost where the graph is too small for the
    #: graph operators to make up for it (the layers and training-step benchmarks,
    #: ``docs/performance.md``). Set it on the class, a subclass or a layer (``0``: on every graph).
    staged_min_edges: int = STAGED_MIN_EDGES
    #: An eager propagation on a GPU graph of fewer than this many edges runs PyG's propagation
    #: (:attr:`fallback_reason` says so), except under ``torch.compile``, while
    #: :class:`~pyg_ugrapher.recording.RecordedStep` records a step and while a CUDA graph is
    #: captured. Such a step is bound by host time: PyG's few torch calls and their backward in
    #: C++ cost less of it than a graph operator's call and its backward in Python, and its kernels
    #: take microseconds either way (the training-step benchmark, ``docs/performance.md``). Set it
    #: on the class, a subclass or a layer (``0``: the fused operator on every graph).
    fused_min_edges: int = FUSED_MIN_EDGES

    def __new__(cls, *args: Any, **kwargs: Any) -> "MessagePassing":
        # The state is made with the object, not in __init__: the class also works as a mixin before
        # a PyG layer (``class FastGIN(ug.MessagePassing, GINConv)``), whose __init__ skips ours, and
        # a module first called under torch.compile finds it registered (Dynamo cannot trace that).
        module = super().__new__(cls)
        module.__dict__["_ug_state"] = _State(module)
        return module

    def __setstate__(self, data: Dict[str, Any]) -> None:
        # A deep copy or an unpickled module has a state of its own (see _State.__reduce__), a
        # shallow copy its original's: give it one. Either way, register it.
        super().__setstate__(data)
        if _MODULES.get(self._ug.token) is not None:
            self.__dict__["_ug_state"] = _State()
        _MODULES[self._ug.token] = self

    @property
    def _ug(self) -> _State:
        return self.__dict__["_ug_state"]

    @property
    def _propagate_forward_pre_hooks(self) -> "OrderedDict[int, Callable]":
        # PyG's propagate() running a fallback whose pre-hooks already ran (:meth:`_fallback`) finds
        # none, in that thread only: the module itself is never changed for a call. Kept in the
        # instance dictionary under another name than the property's, which Dynamo (torch 2.11)
        # would resolve through the property again, endlessly.
        if self._ug.call.hooks_ran:
            return OrderedDict()
        return self.__dict__[PRE_HOOKS]

    @_propagate_forward_pre_hooks.setter
    def _propagate_forward_pre_hooks(self, hooks: "OrderedDict[int, Callable]") -> None:
        self.__dict__[PRE_HOOKS] = hooks

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        # PyG installs a generated copy of its own propagate() on every subclass, which would bypass
        # ours; keep ours, as PyG itself does for a class with a custom propagate(). edge_updater()
        # keeps PyG's generic implementation.
        cls = self.__class__
        cls._orig_propagate = cls._jinja_propagate = cls.propagate

    # -- what the last call did ------------------------------------------------------------------
    @property
    def fallback_reason(self) -> Optional[str]:
        """Why the last :meth:`propagate` ran PyG's own path, as a sentence; ``None`` when it ran a
        captured op."""
        return self._ug.fallback_reason

    @property
    def staged_reason(self) -> Optional[str]:
        """When the last :meth:`propagate` ran ``message()`` staged (graph operators around what ran
        in PyTorch, see :mod:`pyg_ugrapher.staging`): what ran and why, as a sentence; else ``None``."""
        return self._ug.staged

    @property
    def capture(self) -> Optional[Capture]:
        """The capture the last :meth:`propagate` ran (its ops, operands and message shape), or
        ``None`` after a fallback."""
        return self._ug.last

    @property
    def trace_count(self) -> int:
        """How many times ``message()`` was traced: once per new argument signature."""
        return self._ug.trace_count

    # -- propagation -------------------------------------------------------------------------------
    def propagate(self, edge_index: Adj, size: Size = None, **kwargs: Any) -> Tensor:
        r"""Compute :math:`\gamma(\mathbf{x}_i, \bigoplus_j \phi(\ldots))` for every destination.

        Takes what PyG's ``propagate()`` takes: ``edge_index`` as a ``[2, E]`` tensor, a PyG
        ``EdgeIndex``, a transposed sparse adjacency ``adj_t[dst, src]`` (``torch.sparse`` or
        ``torch_sparse.SparseTensor``, whose values fill ``edge_weight``/``edge_attr`` when those
        are ``None``); ``size=(N_src, N_dst)``; and the keyword arguments of ``message()`` and
        ``update()``, where ``x`` may be a pair ``(x_src, x_dst)`` for bipartite graphs.
        """
        if isinstance(edge_index, Tensor) and is_torch_sparse_tensor(edge_index):
            # Dynamo runs a frame that reads a sparse tensor eagerly and compiles its callees one by
            # one, where a view of the adjacency crashes it: the propagation runs whole outside the
            # compiled graph, as in eager mode.
            return _propagate_eagerly(self, edge_index, size, kwargs)
        return self._propagate(edge_index, size, kwargs)

    def _propagate(self, edge_index: Adj, size: Size, kwargs: Dict[str, Any]) -> Tensor:
        for hook in self._propagate_forward_pre_hooks.values():
            res = hook(self, (edge_index, size, kwargs))
            if res is not None:
                edge_index, size, kwargs = res
        return self._propagate_hooked(edge_index, size, kwargs)

    def _propagate_hooked(self, edge_index: Adj, size: Size, kwargs: Dict[str, Any]) -> Tensor:
        """:meth:`propagate` once its pre-hooks ran."""
        kwargs = self._with_defaults(kwargs)
        gather, reason = self._static_check()
        if reason is not None:
            return self._fallback(reason, edge_index, size, kwargs)
        mutable_size = self._check_input(edge_index, size)
        if _runs_pyg_eagerly(self, edge_index):
            return self._fallback(_host_bound_reason(self), edge_index, size, kwargs)
        try:
            prepared = self._prepare(edge_index, mutable_size, kwargs, gather)
        except _Fallback as fallback:
            return self._fallback(str(fallback), edge_index, size, kwargs)
        if prepared is None:
            return _staged_eagerly(self, edge_index, size, kwargs)
        captured, graph, operands, collected = prepared
        if isinstance(captured, _StagedRun):
            self._ug.fallback_reason, self._ug.last = None, None
            out = captured.run(graph, operands)
            _notify_stage(self, self._ug.staged)
        elif isinstance(captured, _CapturedParts):
            self._ug.fallback_reason, self._ug.last, self._ug.staged = None, captured.capture, None
            out = captured.run(graph, operands)
        elif isinstance(captured, _Compiled):
            out = captured.run(graph, operands)
        else:
            self._ug.fallback_reason, self._ug.last, self._ug.staged = None, captured, None
            out = _run(graph, captured.op, operands)
            out = out.reshape(out.shape[:1] + captured.message_shape)
            if captured.gather is not None:
                out = _run(graph, captured.gather, [out])
        update_kwargs = self.inspector.collect_param_data("update", collected)
        update_kwargs = {name: self._materialize(value, edge_index) for name, value in update_kwargs.items()}
        out = self.update(out, **update_kwargs)
        for hook in self._propagate_forward_hooks.values():
            res = hook(self, (edge_index, mutable_size, kwargs), out)
            if res is not None:
                out = res
        return out

    def edge_updater(self, edge_index: Adj, size: Size = None, **kwargs: Any) -> Any:
        """PyG's ``edge_updater()``, with ``edge_update()`` run staged (see :mod:`pyg_ugrapher.staging`):
        its elementwise parts and PyG's ``softmax`` as graph operators, on the node tensors as they
        are. A class with its own ``edge_updater()``, a sparse adjacency or ``torch.compile`` get
        PyG's path (:attr:`edge_fallback_reason` says why)."""
        if torch.compiler.is_compiling():
            # Exactly PyG's code, for Dynamo to trace as it traces PyG's own layer.
            return _generic_edge_updater()(self, edge_index, size=size, **kwargs)
        custom = _custom_edge_updater(type(self))
        if custom is not None:
            self._ug.edge_fallback = "the class defines its own edge_updater()"
            return custom(self, edge_index, size=size, **kwargs)
        for hook in self._edge_update_forward_pre_hooks.values():
            res = hook(self, (edge_index, size, kwargs))
            if res is not None:
                edge_index, size, kwargs = res
        try:
            out = self._staged_edge_update(edge_index, kwargs)
            self._ug.edge_fallback = None
        except _Fallback as fallback:
            self._ug.edge_fallback = str(fallback)
            out = self._pyg_edge_update(edge_index, kwargs)
        for hook in self._edge_update_forward_hooks.values():
            res = hook(self, (edge_index, size, kwargs), out)
            if res is not None:
                out = res
        return out

    @property
    def edge_fallback_reason(self) -> Optional[str]:
        """Why the last ``edge_updater()`` call ran PyG's path, as a sentence; ``None`` when it ran staged."""
        return self._ug.edge_fallback

    def _pyg_edge_update(self, edge_index: Adj, kwargs: Dict[str, Any]) -> Any:
        # As PyG's generic edge_updater() after its pre-hooks (its size argument is not used there).
        mutable_size = self._check_input(edge_index, size=None)
        collected = self._collect(self._edge_user_args, edge_index, mutable_size, kwargs)
        return self.edge_update(**self.inspector.collect_param_data("edge_update", collected))

    def _staged_edge_update(self, edge_index: Adj, kwargs: Dict[str, Any]) -> Tensor:
        if not isinstance(edge_index, Tensor) or is_torch_sparse_tensor(edge_index):
            raise _Fallback("only a [2, E] edge_index runs edge_update() staged")
        mutable_size = self._check_input(edge_index, size=None)
        num_edges = _num_edges(edge_index)
        # Before the collection: a smaller graph's fallback collects PyG's way.
        _stage_or_fall_back(self, "edge_update() runs staged", num_edges)
        self._ug.call.collecting = True
        try:
            collected = self._collect(self._edge_user_args, edge_index, mutable_size, kwargs)
        finally:
            self._ug.call.collecting = False
        edge_kwargs = self.inspector.collect_param_data("edge_update", collected)
        arguments, tensors, _ = self._describe(edge_kwargs, num_edges)
        graph = self._call_graph(edge_index, collected)
        try:
            staged = self._run_staged(self.edge_update, graph, edge_index, edge_kwargs, arguments, tensors, collected)
        except CaptureError as error:
            raise _Fallback(str(error)) from None
        _notify_stage(self, staged.describe("edge_update()"))
        return staged.messages

    def _call_graph(self, edge_index: Adj, collected: Dict[str, Any]) -> GraphTensor:
        """The graph of a call, its node counts as PyG's collection gives them (else the largest index)."""
        src, dst = _endpoints(edge_index, self.flow)
        num_src = collected["size_j"] if collected["size_j"] is not None else _count(src)
        num_dst = collected["dim_size"] if collected["dim_size"] is not None else _count(dst)
        return _graph(edge_index, self.flow, src, dst, num_src, num_dst)

    def _run_staged(
        self,
        method: Callable[..., Any],
        graph: GraphTensor,
        edge_index: Adj,
        method_kwargs: Dict[str, Any],
        arguments: Dict[str, Any],
        tensors: Dict[str, Tensor],
        collected: Dict[str, Any],
        gather: Optional[str] = None,
        aggregate: Optional[Callable[[StagedTrace, Any], Tensor]] = None,
    ) -> Staged:
        """``method`` (``message`` or ``edge_update``) run staged (:func:`~pyg_ugrapher.staging.stage`)
        on ``graph``: its operand arguments traced over their real tensors, the others as PyG gives
        them. Raises :class:`CaptureError` where it cannot run staged."""
        staged_arguments = {
            name: arguments[name] if name in tensors else self._materialize(value, edge_index)
            for name, value in method_kwargs.items()
        }
        run = functools.partial(_run, graph)
        trace = StagedTrace(graph.num_edges, tensors, run, _receivers(collected), graph.num_dst)
        return stage(method, staged_arguments, trace, gather, owner=self, aggregate=aggregate)

    def _collect(
        self, args: Set[str], edge_index: Adj, size: List[Optional[int]], kwargs: Dict[str, Any]
    ) -> Dict[str, Any]:
        """PyG's collection of the arguments of ``message()`` or ``edge_update()``, with a pair
        ``(x_src, x_dst)`` read as PyG reads it for this class. PyG's generated ``propagate()`` and
        ``edge_updater()`` take ``x_j`` from the pair's first tensor and ``x_i`` from its second,
        whatever the flow; its generic ones, which this builds on and which PyG runs for a class it
        cannot generate them for, take them the other way round under
        ``flow="target_to_source"``. The sizes they set are the same."""
        out = super()._collect(args, edge_index, size, kwargs)
        if self.flow == "source_to_target" or not _generated_by_pyg(type(self), args is self._edge_user_args):
            return out
        for arg in args:
            suffix = arg[-2:]
            pair = kwargs.get(arg[:-2]) if suffix in ("_i", "_j") else None
            if isinstance(pair, (tuple, list)):
                value = pair[0] if suffix == "_j" else pair[1]
                row = self._source_row if suffix == "_j" else 1 - self._source_row
                out[arg] = self._lift(value, edge_index, row) if isinstance(value, Tensor) else None
        return out

    def _lift(self, src: Tensor, edge_index: Adj, dim: int) -> Any:
        # While message() arguments are collected, node tensors stay unindexed: the fused op reads
        # them at each edge's endpoint, so PyG's [E, F] copy of them is never made.
        if self._ug.call.collecting:
            return _Lifted(src, dim, "src_v" if dim == self._source_row else "dst_v")
        return super()._lift(src, edge_index, dim)

    @property
    def _source_row(self) -> int:
        """The row of ``edge_index`` holding the senders of messages (PyG's ``j``)."""
        return 0 if self.flow == "source_to_target" else 1

    def _with_defaults(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``kwargs`` with the defaults of the ``message()``/``update()`` arguments it lacks, as PyG's
        compiled ``propagate()`` gives them (its generic one, which ours builds on, would pass
        ``inspect.Parameter.empty``)."""
        missing = {name: value for name, value in _argument_defaults(self._ug.token) if name not in kwargs}
        return {**missing, **kwargs} if missing else kwargs

    def _materialize(self, value: Any, edge_index: Adj) -> Any:
        """What PyG's collection gives ``update()``: lifted node tensors indexed for real."""
        if isinstance(value, _Lifted):
            return super()._lift(value.tensor, edge_index, value.dim)
        return value

    # -- deciding -------------------------------------------------------------------------------
    def unfused_reason(self) -> Optional[str]:
        """Why no call of this module can run as a fused operator in its current state (explain
        mode, decomposed layers, hooks on ``message()`` or ``aggregate()``, an aggregation that is
        not a gather op), as a sentence; ``None`` when calls may. The drop-in layers then run their
        PyG algorithm through :meth:`propagate`, which falls back to PyG's own propagation."""
        return self._static_check()[1]

    def _static_check(self) -> Tuple[Optional[str], Optional[str]]:
        """``(gather_op, None)``, or ``(None, reason)`` when no call of this module can be captured
        in its current configuration."""
        if self.explain:
            return None, "explain mode is on: PyG's explainer masks the materialised per-edge messages"
        if self.decomposed_layers > 1:
            return None, (
                f"decomposed_layers={self.decomposed_layers}: PyG slices the features into "
                f"several propagations, which the fused op does not need"
            )
        if (
            self._message_forward_pre_hooks
            or self._message_forward_hooks
            or self._aggregate_forward_pre_hooks
            or self._aggregate_forward_hooks
        ):
            return None, "hooks on message() or aggregate() need the materialised per-edge messages"
        if "aggregate" in vars(self) or type(self).aggregate is not PyGMessagePassing.aggregate:
            return AGGREGATE_GATHER, None
        module = self.aggr_module
        gather = GATHER_OPS.get(type(module)) if isinstance(self.aggr, str) else None
        if type(module) is SoftmaxAggregation:
            gather = SOFTMAX_GATHER
        elif gather is None and on_graph_operators(module):
            gather = PARTS_GATHER
        if gather is None:
            what = (
                "aggr=None (the module aggregates itself)"
                if module is None
                else f"the aggregation {type(module).__name__} ({self.aggr!r})"
            )
            return None, (
                f"{what} is not a gather op of the IR; only sum/add, mean, max and min (or "
                f"Sum/Mean/Max/MinAggregation) are captured, and var, std, softmax and lists with "
                f"one of these among their parts run staged"
            )
        if module._forward_hooks or module._forward_pre_hooks:
            return None, "hooks on the aggregation module need the materialised per-edge messages"
        return gather, None

    def _prepare(
        self, edge_index: Adj, size: List[Optional[int]], kwargs: Dict[str, Any], gather: str
    ) -> Optional[Tuple[Capture, GraphTensor, List[Tensor], Dict[str, Any]]]:
        """The capture, graph and operands of this call, and PyG's collected arguments (for
        ``update()``); raises :class:`_Fallback` when the call cannot be captured. ``None`` under
        ``torch.compile`` for a call that runs staged: it runs outside the compiled graph."""
        if self.fuse and _runs_fused(self, edge_index):
            raise _Fallback("PyG runs the module's message_and_aggregate() for this graph input, not message()")
        num_edges = _num_edges(edge_index)
        differentiable_coo = (
            is_torch_sparse_tensor(edge_index) and edge_index.layout == torch.sparse_coo and edge_index.requires_grad
        )
        # PyG's own collection, so that sizes, pairs, flows and sparse values mean what they mean in
        # PyG. It flags a COO adjacency coalesced in place, which autograd cannot differentiate (PyG's
        # compiled propagate avoids that): collect from a detached alias, then put the adjacency's
        # differentiable values back.
        self._ug.call.collecting = True
        try:
            collected = self._collect(
                self._user_args, edge_index.detach() if differentiable_coo else edge_index, size, kwargs
            )
        finally:
            self._ug.call.collecting = False
        if differentiable_coo:
            self._restore_sparse_values(collected, edge_index, kwargs)
        message_kwargs = self.inspector.collect_param_data("message", collected)
        traced_kwargs = message_kwargs
        if gather == AGGREGATE_GATHER:
            traced_kwargs = {**self.inspector.collect_param_data("aggregate", collected), **message_kwargs}
        arguments, tensors, signature = self._describe(traced_kwargs, num_edges)
        if torch.compiler.is_compiling():
            if gather == PARTS_GATHER:
                return _stage_or_fall_back(self, self._parts_reason(), num_edges)
            return self._prepare_compiled(edge_index, collected, tensors, signature, num_edges, gather)
        key = (gather, torch.is_grad_enabled(), _settings(self)) + signature
        try:
            if gather == PARTS_GATHER and in_pytorch(self.aggr_module):
                raise _Stage(self._parts_reason())
            captured: Union[Capture, _StagedRun, _CapturedParts] = self._lookup(key, arguments, num_edges, gather)
            self._check_node_dim(captured.message_shape)
            steps = sum(isinstance(value, Step) for value in captured.values)
            _steps_or_fall_back(self, steps, num_edges, parts=gather == PARTS_GATHER)
            reason = None
        except _Stage as stage:
            reason = str(stage)
            if gather == PARTS_GATHER and not reason.startswith("the aggregation"):
                reason = f"{self._parts_reason()}; {reason}"
        if reason is not None:
            _stage_or_fall_back(self, reason, num_edges)
        graph = self._call_graph(edge_index, collected)
        if reason is not None:
            captured = self._stage(
                key, reason, graph, edge_index, message_kwargs, arguments, tensors, collected, gather
            )
            return captured, graph, [], collected
        operands = _capture_operands(captured, tensors, self, functools.partial(_run, graph), graph.num_edges)
        if gather == PARTS_GATHER:
            captured = _CapturedParts(captured, self._parts(collected, graph))
        return captured, graph, operands, collected

    def _stage(
        self,
        key: Tuple[Hashable, ...],
        reason: str,
        graph: GraphTensor,
        edge_index: Adj,
        message_kwargs: Dict[str, Any],
        arguments: Dict[str, Any],
        tensors: Dict[str, Tensor],
        collected: Dict[str, Any],
        gather: str,
    ) -> "_StagedRun":
        """Run ``message()`` staged (:meth:`_run_staged`)."""
        aggregate = None
        parts = None
        if gather == PARTS_GATHER:
            parts = self._parts(collected, graph)
            gather = "sum"  # what a captured message op is finished with; each part sets its own
        elif gather == SOFTMAX_GATHER:
            module = self.aggr_module
            temperature = module.t if module.channels == 1 else module.t.view(-1, module.channels)
            semi_grad = not module.learn and module.semi_grad

            def aggregate(trace: StagedTrace, messages: Any) -> Tensor:
                return trace.softmax_aggregate(messages, temperature, semi_grad)

        try:
            staged = self._run_staged(
                self.message, graph, edge_index, message_kwargs, arguments, tensors, collected, gather, aggregate
            )
            self._check_node_dim(staged.message_shape)
        except (CaptureError, _Fallback) as error:
            self._ug.captures[key] = _Failure(f"{reason}; a staged run fails too: {error}", None)
            raise _Fallback(self._ug.captures[key].reason) from None
        self._ug.staged = f"{staged.describe()} ({reason})"
        return _StagedRun(staged, gather, parts)

    def _parts(self, collected: Dict[str, Any], graph: GraphTensor) -> "PartsAggregation":
        """The aggregation module of this call, computed part by part from ``(run_gather, messages)``
        (:func:`~pyg_ugrapher.aggregation.aggregate`)."""
        module, dim_size, node_dim = self.aggr_module, graph.num_dst, self.node_dim
        index, ptr = collected.get("index"), collected.get("ptr")

        def parts(run_gather: GatherRunner, messages: Callable[[], Tensor]) -> Tensor:
            return aggregate_parts(module, run_gather, messages, index, ptr, dim_size, node_dim)

        return parts

    def _parts_reason(self) -> str:
        """Why a propagation with an aggregation computed part by part runs staged."""
        module = self.aggr_module
        reason = f"the aggregation {type(module).__name__} runs part by part"
        pytorch = in_pytorch(module)
        if pytorch:
            return f"{reason}, {', '.join(dict.fromkeys(pytorch))} {ON_EDGES}"
        return f"{reason}, every part on graph operators"

    def _check_node_dim(self, message_shape: Tuple[int, ...]) -> None:
        rank = 1 + len(message_shape)
        if not -rank <= self.node_dim < rank or self.node_dim % rank != 0:
            raise _Fallback(
                f"node_dim={self.node_dim} does not name the first dimension of the "
                f"{rank}-dimensional messages, so PyG aggregates along another dimension"
            )

    def _prepare_compiled(
        self,
        edge_index: Adj,
        collected: Dict[str, Any],
        tensors: Dict[str, Tensor],
        signature: Tuple[Hashable, ...],
        num_edges: int,
        gather: str,
    ) -> Optional[Tuple["_Compiled", GraphStructure, List[Tensor], Dict[str, Any]]]:
        """:meth:`_prepare` under ``torch.compile``: the capture is looked up (or traced) at trace
        time and enters the compiled graph as constants (:func:`_compiled_capture`); the graph is
        the structure the drop-in layers' custom op returns."""
        if (
            not isinstance(edge_index, Tensor)
            or is_torch_sparse_tensor(edge_index)
            or isinstance(edge_index, EdgeIndex)
        ):
            raise _Fallback("under torch.compile only a plain [2, E] edge_index is captured")
        num_src, num_dst = collected["size_j"], collected["dim_size"]
        if num_src is None or num_dst is None:
            raise _Fallback(
                "under torch.compile the node counts must come from the node tensors or "
                "size=, not from the largest index"
            )
        # The signature without its first entry, message() itself, which the constant function
        # reads from the module (a function is not a constant of the trace).
        captured = _compiled_capture(self._ug.token, signature[1:], gather)
        if isinstance(captured, _CompiledStage):
            return _stage_or_fall_back(self, captured.reason, num_edges)
        if isinstance(captured, str):
            raise _Fallback(captured)
        _steps_or_fall_back(self, sum(constants[0] == "step" for constants in captured.values), num_edges)
        self._check_node_dim(captured.message_shape)
        self._ug.fallback_reason = None
        graph = layer_structure(edge_index, self.flow, num_src, num_dst)
        if captured.values:

            def run(op: str, operands: List[Tensor]) -> Tensor:
                return call_graph_op(graph, operands, op, AUTO)

            for constants in captured.values:
                tensors[constants[1]] = build_value(constants, tensors, self, run, num_edges)
            for attribute, argument in captured.stores:
                setattr(self, attribute, tensors[argument])
        operands = [build_operand(tensors[argument], *recipe) for argument, *recipe in captured.operands]
        return captured, graph, operands, collected

    def _restore_sparse_values(self, collected: Dict[str, Any], adj_t: Tensor, kwargs: Dict[str, Any]) -> None:
        """Where PyG's collection fills arguments from a sparse adjacency's values, use ``adj_t``'s own."""
        values = adj_t.values()
        collected["adj_t"] = adj_t
        for name, value in (
            ("edge_weight", values),
            ("edge_attr", None if values.dim() == 1 else values),
            ("edge_type", values),
        ):
            given = kwargs.get(name, inspect.Parameter.empty) if name in self._user_args else None
            if given is None:
                collected[name] = value

    def _describe(
        self, message_kwargs: Dict[str, Any], num_edges: int
    ) -> Tuple[Dict[str, Any], Dict[str, Tensor], Tuple[Hashable, ...]]:
        """The trace's view of each ``message()`` argument, the real tensor behind each operand, and
        the argument signature that keys captures."""
        arguments: Dict[str, Any] = {}
        tensors: Dict[str, Tensor] = {}
        signature: List[Hashable] = [getattr(self.message, "__func__", self.message)]
        for name, value in message_kwargs.items():
            if isinstance(value, _Lifted):
                tensor = value.tensor
                if self.node_dim % tensor.dim() != 0:
                    raise _Fallback(
                        f"node_dim={self.node_dim} makes PyG index dimension "
                        f"{self.node_dim % tensor.dim()} of the node tensor behind {name!r} "
                        f"(shape {list(tensor.shape)}); only the first dimension is captured"
                    )
                _check_plain(name, tensor)
                why = _not_an_operand(tensor)
                argument = Argument.of(tensor, None if why else value.kind, why, rows=num_edges)
            elif isinstance(value, Tensor):
                _check_plain(name, value)
                tensor = value
                why = _not_an_operand(tensor) or (
                    ""
                    if tensor.size(0) == num_edges
                    else f"a tensor of shape {list(tensor.shape)}, which has no row per edge ({num_edges} edges)"
                )
                argument = Argument.of(tensor, None if why else "edge", why)
            else:
                try:
                    # A node count keys no capture: one that computes with it is refused
                    # (capture.NodeCount), so the capture serves every graph.
                    signature.append((name, _NODE_COUNT if is_node_count(name, value) else _freeze(value)))
                except TypeError:
                    raise _Fallback(
                        f"message() takes argument {name!r} of type {type(value).__name__}, which cannot key a capture"
                    ) from None
                arguments[name] = value
                continue
            arguments[name] = argument
            if argument.kind is not None:
                tensors[name] = tensor
            shape = argument.shape if argument.kind is None else argument.shape[1:]
            if argument.kind is None and shape and shape[0] == num_edges:
                # one row per edge (an integer index, say): keyed without the count, which a
                # capture that reads it records (Capture.num_edges)
                shape = (_EDGE_ROWS,) + shape[1:]
            signature.append(
                (name, argument.kind, shape, argument.dtype, argument.device, argument.requires_grad, argument.why)
            )
        return arguments, tensors, tuple(signature)

    def _lookup(self, key: Tuple[Hashable, ...], arguments: Dict[str, Any], num_edges: int, gather: str) -> Capture:
        """The cached capture of this signature, tracing ``message()`` when there is none."""
        captures = self._ug.captures
        entry = captures.get(key)
        stale = isinstance(entry, Capture) and entry.values and not entry.matches(self)
        if entry is None or stale or entry.num_edges not in (None, num_edges):
            self._ug.trace_count += 1
            try:
                temperature = None
                if gather == SOFTMAX_GATHER:
                    aggregation = self.aggr_module
                    if aggregation.semi_grad and not aggregation.learn:
                        raise CaptureError(
                            "SoftmaxAggregation with semi_grad=True takes no gradient through its weights"
                        )
                    temperature = aggregation.t if aggregation.learn else float(aggregation.t)
                message_arguments, aggregate = arguments, None
                if gather == AGGREGATE_GATHER:
                    message_arguments = {name: arguments[name] for name in self.inspector.get_param_names("message")}
                    aggregate_names = self.inspector.get_param_names("aggregate")
                    aggregate = (self.aggregate, {name: arguments[name] for name in aggregate_names})
                # The trace runs Python on tensor subclasses: under torch.compile it runs eagerly.
                # an aggregation computed part by part runs each part's gather op on the captured op
                traced_gather = "sum" if gather in (PARTS_GATHER, AGGREGATE_GATHER) else gather
                entry = torch.compiler.disable(trace_message)(
                    self.message, message_arguments, num_edges, traced_gather, self, temperature, aggregate
                )
            except CaptureError as error:
                reason = str(error)
                if gather == SOFTMAX_GATHER:
                    reason = f"{reason} (under the aggregation SoftmaxAggregation)"
                if gather == AGGREGATE_GATHER:
                    # a staged run aggregates with the gather ops of the IR, not the module's own
                    reason = f"{reason}; with its own aggregate(), the module runs PyG's propagation"
                entry = _Failure(reason, error.num_edges, stageable=gather != AGGREGATE_GATHER)
            captures[key] = entry
            if len(captures) > MAX_CAPTURES:
                captures.popitem(last=False)
        else:
            try:
                captures.move_to_end(key)
            except KeyError:  # evicted by another thread's call since the lookup
                pass
        if isinstance(entry, _Failure):
            raise (_Stage if entry.stageable else _Fallback)(entry.reason)
        return entry

    def _fallback(self, reason: str, edge_index: Adj, size: Size, kwargs: Dict[str, Any]) -> Tensor:
        """PyG's own propagation of inputs the propagate pre-hooks already rewrote."""
        self._ug.fallback_reason, self._ug.last, self._ug.staged = reason, None, None
        for callback in list(_FALLBACK_OBSERVERS.callbacks):
            callback(self, reason)
        call = self._ug.call
        call.hooks_ran = True
        try:
            return _pyg_propagate()(self, edge_index, size, **kwargs)
        finally:
            call.hooks_ran = False


class _StagedRun(NamedTuple):
    """A staged ``message()`` call, aggregated by :meth:`run`: with ``gather``, given ``parts`` by
    ``parts(run_gather, messages)`` (an aggregation module computed part by part, see
    :func:`~pyg_ugrapher.aggregation.aggregate`), or aggregated inside the trace already
    (``staged.aggregated``)."""

    staged: Staged
    gather: str
    parts: Optional["PartsAggregation"] = None

    def run(self, graph: GraphTensor, operands: List[Tensor]) -> Tensor:
        capture = self.staged.capture
        if self.staged.aggregated is not None:
            return self.staged.aggregated
        if self.parts is not None:
            operands = None if capture is None else _capture_operands(capture, self.staged.tensors)
            return self.parts(*_gather_sources(graph, capture, operands, self.staged.messages))
        if capture is None:
            return _run(graph, _copy_edges(self.gather), [self.staged.messages])
        out = _run(graph, capture.op, _capture_operands(capture, self.staged.tensors))
        out = out.reshape(out.shape[:1] + capture.message_shape)
        if capture.gather is not None:
            out = _run(graph, capture.gather, [out])
        return out


#: An aggregation module computed part by part: ``parts(run_gather, messages) -> Tensor``.
PartsAggregation = Callable[[GatherRunner, Callable[[], Tensor]], Tensor]


class _CapturedParts(NamedTuple):
    """A captured ``message()`` aggregated part by part (PNA's degree scalers, lists of
    aggregations): each part's gather op runs on the captured op's edge function."""

    capture: Capture
    parts: PartsAggregation

    @property
    def message_shape(self) -> Tuple[int, ...]:
        return self.capture.message_shape

    def run(self, graph: GraphTensor, operands: List[Tensor]) -> Tensor:
        return self.parts(*_gather_sources(graph, self.capture, operands, None))


def _gather_sources(
    graph: GraphTensor, capture: Optional[Capture], operands: Optional[List[Tensor]], real: Optional[Tensor]
) -> Tuple[GatherRunner, Callable[[], Tensor]]:
    """``(run_gather, messages)`` for :func:`~pyg_ugrapher.aggregation.aggregate`: a captured
    message op (over ``operands``) is run with each gather op, or the ``real`` per-edge messages are
    gathered; each result (a mean is asked again by a variance) and the per-edge messages are
    computed once, if asked."""
    computed: List[Tensor] = []
    gathered: Dict[Tuple[str, bool, bool], Tensor] = {}

    def messages() -> Tensor:
        if not computed:
            if capture is None:
                computed.append(real)
            else:
                op = capture.op if capture.gather is not None else _with_gather(capture.op, None, False)
                out = _run(graph, op, operands)
                computed.append(out.reshape(out.shape[:1] + capture.message_shape))
        return computed[0]

    def run_gather(gather_op: str, squared: bool) -> Tensor:
        key = (gather_op, squared, torch.is_grad_enabled())  # a semi-gradient mean of squares has none
        if key not in gathered:
            if capture is None or capture.gather is not None:
                values = messages()
                out = _run(graph, _copy_edges(gather_op), [values * values if squared else values])
            else:
                out = _run(graph, _with_gather(capture.op, gather_op, squared), operands)
                out = out.reshape(out.shape[:1] + capture.message_shape)
            gathered[key] = out
        return gathered[key]

    return run_gather, messages


#: Per class and method (``propagate`` or ``edge_updater``): whether PyG generates the method
#: for it (:func:`_generated_by_pyg`).
_GENERATED: "weakref.WeakKeyDictionary[type, Dict[bool, bool]]" = weakref.WeakKeyDictionary()


@torch.compiler.assume_constant_result
def _generated_by_pyg(cls: type, edge_updater: bool) -> bool:
    """Whether PyG would run its generated ``propagate()`` (or ``edge_updater()``) for the layer
    class ``cls`` were it PyG's (for a routed class, the PyG class it was made from): PyG generates
    one where its inspector reads the method's call in the class's source
    (``MessagePassing._set_jittable_templates``), and runs its generic one otherwise (no source, a
    call it cannot parse). Decided once per class, by PyG's own reading of that call; under
    ``torch.compile`` a constant of the compiled graph, decided when it is traced (Dynamo cannot
    trace the reading of a source file: a graph break at each of its steps)."""
    known = _GENERATED.setdefault(cls, {})
    if edge_updater not in known:
        method = "edge_updater" if edge_updater else "propagate"
        try:
            Inspector(getattr(cls, "accelerated_from", cls)).get_params_from_method_call(
                method, exclude=[0, "edge_index", "size"]
            )
            known[edge_updater] = True
        except Exception:  # as PyG's own generation, which falls back to the generic method on any error
            known[edge_updater] = False
    return known[edge_updater]


def _capture_operands(
    capture: Capture,
    tensors: Mapping[str, Tensor],
    module: Optional[torch.nn.Module] = None,
    run: Optional[OpRunner] = None,
    num_edges: int = 0,
) -> List[Tensor]:
    """The operands of ``capture``'s op, built from the real tensors of its operand arguments and
    its values (:meth:`~pyg_ugrapher.program.Capture.operand_tensors`)."""
    tensors = capture.operand_tensors(tensors, module, run, num_edges)
    return [operand.build(tensors[operand.argument]) for operand in capture.operands]


@functools.lru_cache(maxsize=None)
def _with_gather(op: OpInfo, gather: Optional[str], squared: bool) -> OpInfo:
    """``op``'s message, or its square, with the gather op ``gather`` (``None``: per edge)."""
    message = op.expr * op.expr if squared else op.expr
    return canonical(message, op.inputs, gather, False)


@functools.lru_cache(maxsize=None)
def _copy_edges(gather: str) -> OpInfo:
    """``copy_e_<gather>``: the aggregation of real per-edge messages."""
    return canonical(Expr.input(0), ("edge",), gather, False)


def _receivers(collected: Dict[str, Any]) -> List[Tensor]:
    """What PyG's collection gives ``message()`` as the receiver of each edge (``index``, ``ptr``)."""
    return [collected[name] for name in ("index", "ptr") if isinstance(collected.get(name), Tensor)]


def _generic_edge_updater() -> Callable[..., Any]:
    """PyG's generic ``edge_updater()`` (kept as ``_orig_edge_updater`` where PyG replaced it)."""
    base = vars(PyGMessagePassing)
    return base.get("_orig_edge_updater", base["edge_updater"])


def _custom_edge_updater(cls: type) -> Optional[Callable[..., Any]]:
    """A class's own ``edge_updater()`` (one PyG's generic one is not), if it has one after ours."""
    base = vars(PyGMessagePassing)
    generic = _generic_edge_updater()
    mro = cls.__mro__
    for owner in mro[mro.index(MessagePassing) + 1 :]:
        attributes = vars(owner)
        if "edge_updater" in attributes:
            method = attributes["edge_updater"]
            # PyG installs a generated copy of its generic method on every class it instantiates.
            generated = method is attributes.get("_jinja_edge_updater") or method is base.get("_jinja_edge_updater")
            original = attributes.get("_orig_edge_updater", method) if generated else method
            return None if original is generic else method
    return None


# -- torch.compile ----------------------------------------------------------------------------------
class _Compiled(NamedTuple):
    """A :class:`Capture` as plain constants, which a compiled graph can hold."""

    op: str  #: the serialised op
    gather: Optional[str]  #: the serialised gather op of a reducing message, if any
    message_shape: Tuple[int, ...]
    #: per operand: its :meth:`~pyg_ugrapher.program.Operand.recipe`, the argument and the fields
    #: of :func:`~pyg_ugrapher.program.build_operand`
    operands: Tuple[Tuple[Any, ...], ...]
    #: per value computed before the op: its :meth:`constants` (see
    #: :func:`~pyg_ugrapher.program.build_value`)
    values: Tuple[Tuple[Any, ...], ...] = ()
    stores: Tuple[Tuple[str, str], ...] = ()  #: see :attr:`~pyg_ugrapher.program.Capture.stores`

    def run(self, structure: GraphStructure, operands: List[Tensor]) -> Tensor:
        out = call_graph_op(structure, operands, self.op, AUTO)
        out = out.reshape(out.shape[:1] + self.message_shape)
        if self.gather is not None:
            out = call_graph_op(structure, [out], self.gather, AUTO)
        return out


class _CompiledStage(NamedTuple):
    """What :func:`_compiled_capture` returns for a ``message()`` that runs staged."""

    reason: str


def _stage_or_fall_back(module: "MessagePassing", reason: str, num_edges: int) -> None:
    """``None`` (run staged; under ``torch.compile``, outside the compiled graph) for a call of
    ``module`` that would run staged (``reason`` says why) on a graph of at least its
    :attr:`~MessagePassing.staged_min_edges` edges; raises :class:`_Fallback` on a smaller one."""
    limit = module.staged_min_edges
    if int(num_edges) < limit:
        compiled = " compiled" if torch.compiler.is_compiling() else ""
        raise _Fallback(
            f"{reason}; a graph of fewer than {limit} edges runs PyG's{compiled} propagation, which "
            f"costs less host time there than a staged run (see MessagePassing.staged_min_edges)"
        )


def _runs_pyg_eagerly(module: "MessagePassing", edge_index: Adj) -> bool:
    """Whether a propagation of ``module`` over ``edge_index`` (checked already) runs PyG's
    propagation because its step is bound by host time: an eager call on a ``[2, E]`` index of
    fewer than :attr:`~MessagePassing.fused_min_edges` edges that
    :func:`~pyg_ugrapher.graph_argument.host_bound` finds bound by host time."""
    # Compiling first: Dynamo then reads no size (no guard on it).
    return (
        not torch.compiler.is_compiling()
        and isinstance(edge_index, Tensor)
        and edge_index.layout == torch.strided
        and host_bound(edge_index.size(1), edge_index, module.fused_min_edges)
    )


def _host_bound_reason(module: "MessagePassing") -> str:
    """Why :func:`_runs_pyg_eagerly` ran PyG's propagation, as a sentence."""
    return (
        f"an eager call on a graph of fewer than {module.fused_min_edges} edges runs PyG's propagation, "
        f"which costs less host time there (see MessagePassing.fused_min_edges)"
    )


def _steps_or_fall_back(module: "MessagePassing", steps: int, num_edges: int, parts: bool = False) -> None:
    """Raise :class:`_Fallback` for a capture that runs ``steps`` graph operators besides the fused
    one (a softmax's), or a gather per part of an aggregation computed part by part (``parts``), on
    a graph of fewer than :attr:`~MessagePassing.staged_min_edges` edges, outside a recording of a
    whole step (:func:`~pyg_ugrapher.structure.records_steps`)."""
    limit = module.staged_min_edges
    if (steps or parts) and int(num_edges) < limit and not records_steps():
        compiled = " compiled" if torch.compiler.is_compiling() else ""
        runs = "a gather per part of its aggregation" if parts else f"{steps + 1} graph operators"
        raise _Fallback(
            f"the capture runs {runs}; a graph of fewer than {limit} edges runs PyG's{compiled} "
            f"propagation, which costs less host time there (see MessagePassing.staged_min_edges)"
        )


@torch.compiler.disable
def _staged_eagerly(module: "MessagePassing", edge_index: Adj, size: Size, kwargs: Dict[str, Any]) -> Tensor:
    """A staged propagation under ``torch.compile``, outside the compiled graph: a staged run calls
    ``message()`` on traced tensors every time, which Dynamo cannot trace."""
    return module._propagate_hooked(edge_index, size, kwargs)


@torch.compiler.assume_constant_result
def _argument_defaults(token: int) -> Tuple[Tuple[str, Any], ...]:
    """The ``(name, default)`` pairs of the ``message()``/``aggregate()``/``update()`` arguments of
    the module of ``token`` (see :data:`_MODULES`), read once and kept on its state. A constant of a
    compiled graph (pairs, not a dict, whose keys Dynamo would guard on): a compiled call that read
    the state itself would guard on it, and the first call, which fills it, would be compiled twice."""
    module = _MODULES[token]
    state = module._ug
    if state.defaults is None:
        params = module.inspector.get_flat_param_dict(
            ["message", "aggregate", "update"], exclude=list(module.special_args)
        )
        state.defaults = tuple(
            (name, param.default)
            for name, param in params.items()
            if param.default is not inspect.Parameter.empty and not name.endswith(("_i", "_j"))
        )
    return state.defaults


@torch.compiler.assume_constant_result
def _compiled_capture(
    token: int, signature: Tuple[Hashable, ...], gather: str
) -> Union[_Compiled, _CompiledStage, str]:
    """The capture of ``message()`` of the module of ``token`` (see :data:`_MODULES`) for an
    argument signature, as constants (or the reason it cannot be captured). Runs in Python while
    ``torch.compile`` traces: the tracing of ``message()`` is not itself traceable. The module's
    plain attributes are read here, once; a compiled model that changes one that ``message()``
    reads needs ``torch._dynamo.reset()``. Traced on :data:`COMPILED_TRACE_EDGES` edges, not the
    call's count, which may be symbolic (a constant function takes constants only): a capture, or
    a verdict against capturing, that depends on the count is refused."""
    module = _MODULES[token]
    num_edges = COMPILED_TRACE_EDGES
    arguments = {}
    for entry in signature:
        if len(entry) == 2:
            arguments[entry[0]] = COMPILED_TRACE_NODES if entry[1] == _NODE_COUNT else _thaw(entry[1])
        else:
            name, kind, shape, dtype, device, requires_grad, why = entry
            if kind is not None:
                shape = (num_edges,) + shape
            elif shape and shape[0] == _EDGE_ROWS:
                shape = (num_edges,) + shape[1:]
            arguments[name] = Argument(shape, dtype, device, requires_grad, kind, why)
    message = getattr(module.message, "__func__", module.message)
    key = (gather, torch.is_grad_enabled(), _settings(module), message) + signature
    reads_rows = (
        "message() reads the number of edges, which a compiled graph may not know (dynamic shapes): "
        "PyG's propagation runs"
    )
    try:
        captured = module._lookup(key, arguments, num_edges, gather)
    except (_Stage, _Fallback) as refused:
        failure = module._ug.captures.get(key)
        if isinstance(failure, _Failure) and failure.num_edges is not None:
            return reads_rows
        return _CompiledStage(str(refused)) if isinstance(refused, _Stage) else str(refused)
    if captured.num_edges is not None:
        return reads_rows
    return _Compiled(
        captured.op.serialize(),
        None if captured.gather is None else captured.gather.serialize(),
        captured.message_shape,
        tuple(o.recipe() for o in captured.operands),
        tuple(value.constants() for value in captured.values),
        captured.stores,
    )


# -- helpers ------------------------------------------------------------------------------------------
def _pyg_propagate() -> Callable[..., Tensor]:
    """PyG's generic ``propagate()``. Instantiating PyG's base class itself replaces its ``propagate``
    by one generated for the base class's ``message()``; PyG keeps the original as ``_orig_propagate``."""
    attributes = vars(PyGMessagePassing)
    return attributes.get("_orig_propagate", attributes["propagate"])


def _run(graph: GraphTensor, op: OpInfo, operands: Sequence[Tensor]) -> Tensor:
    if op.is_builtin:
        return compute(graph, op, *operands)
    return compute(graph, op, operands=operands)


def _runs_fused(module: PyGMessagePassing, edge_index: Adj) -> bool:
    """Whether PyG's ``propagate()`` calls ``message_and_aggregate()`` for this input (mirrors it)."""
    if is_sparse(edge_index):
        return True
    return isinstance(edge_index, EdgeIndex) and module.SUPPORTS_FUSED_EDGE_INDEX and edge_index.is_sorted_by_col


def _num_edges(edge_index: Adj) -> int:
    if is_torch_sparse_tensor(edge_index):
        return edge_index._nnz()
    if isinstance(edge_index, Tensor):
        return edge_index.size(1)
    return edge_index.nnz()


def _endpoints(edge_index: Adj, flow: str) -> Tuple[Tensor, Tensor]:
    """``(senders, receivers)`` of every edge, in PyG's edge order; aliases that do not keep
    ``edge_index`` alive (they end up in the graph cache, keyed weakly by ``edge_index``)."""
    if is_torch_sparse_tensor(edge_index):  # adj_t[receiver, sender], edges in storage order
        layout = edge_index.layout
        if layout == torch.sparse_coo:
            index = edge_index._indices().detach()
            return index[1], index[0]
        nnz = edge_index._nnz()
        if layout == torch.sparse_csr:
            return edge_index.col_indices().detach(), ptr2index(edge_index.crow_indices().detach(), nnz)
        if layout == torch.sparse_csc:
            return ptr2index(edge_index.ccol_indices().detach(), nnz), edge_index.row_indices().detach()
        raise _Fallback(f"the sparse layout {layout} is not one PyG's message() path reads")
    if isinstance(edge_index, Tensor):
        plain = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
        plain = plain.detach()
        j = 0 if flow == "source_to_target" else 1
        return plain[j], plain[1 - j]
    row, col, _ = edge_index.coo()  # torch_sparse.SparseTensor adj_t[receiver, sender]
    return col.detach(), row.detach()


def _count(index: Tensor) -> int:
    """PyG's node count when no tensor or size gives it: the largest index plus one."""
    return int(index.max()) + 1 if index.numel() else 0


def _graph(edge_index: Adj, flow: str, src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> GraphTensor:
    """The graph of a call, cached on the graph argument as the drop-in layers' graphs are
    (:func:`~pyg_ugrapher.graph_argument.derived`): built once for every layer and epoch that use
    it, and inside a CUDA graph capture built by the recording itself."""
    if not isinstance(edge_index, Tensor):
        return _new_graph(src, dst, num_src, num_dst)
    note_bounds(edge_index, flow, num_src, num_dst)
    return derived(
        edge_index,
        ("message_passing", flow, num_src, num_dst),
        lambda: _new_graph(src.detach(), dst.detach(), num_src, num_dst),
    )


def _new_graph(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> GraphTensor:
    try:
        return GraphTensor(src, dst, num_src, num_dst)
    except (TypeError, ValueError) as error:
        raise _Fallback(f"the graph does not fit the node tensors ({error}); PyG's path reports it") from None


def _check_plain(name: str, tensor: Tensor) -> None:
    """Only dense tensors of torch's own classes are traced: a subclass (``EdgeIndex``...) or a sparse
    tensor could answer the trace's questions differently from what it is. An integer tensor is never
    an operand (only its shape is read, and a staged run passes it as it is), so PyG's ``Index`` of
    the receivers, which an ``EdgeIndex`` input gives ``message()``, may be one."""
    if tensor.layout == torch.strided and not tensor.is_floating_point() and not tensor.is_complex():
        return
    if tensor.layout != torch.strided or type(tensor) not in (Tensor, Parameter):
        what = type(tensor).__name__ if type(tensor) not in (Tensor, Parameter) else f"{tensor.layout} tensor"
        raise _Fallback(f"message() takes {name!r}, a {what}, which the capture does not trace")


def _not_an_operand(tensor: Tensor) -> str:
    """Why ``tensor`` cannot be read by a kernel as an operand (completes a sentence), or ``""``."""
    if not tensor.is_floating_point():
        return f"a {tensor.dtype} tensor (operands are floating-point)"
    if tensor.dim() == 0:
        return "a 0-dimensional tensor"
    return ""


#: A node count (``size_i``...) in capture keys, whatever its value.
_NODE_COUNT = ("node count",)
#: The first dimension of a non-operand tensor argument with one row per edge, in capture keys.
_EDGE_ROWS = "edges"

_ATOMS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, type)


def _freeze(value: Any) -> Hashable:
    """A hashable, type-exact image of a plain Python value; ``TypeError`` for anything else."""
    if isinstance(value, _ATOMS):
        return type(value).__name__, value
    if isinstance(value, (tuple, list, torch.Size)):
        return type(value).__name__, tuple(_freeze(item) for item in value)
    raise TypeError(type(value).__name__)


def _thaw(frozen: Hashable) -> Any:
    """The value :func:`_freeze` made ``frozen`` of."""
    kind, value = frozen
    if kind in ("tuple", "list", "Size"):
        items = [_thaw(item) for item in value]
        return {"tuple": tuple, "list": list, "Size": torch.Size}[kind](items)
    return value


def _settings(module: torch.nn.Module) -> Tuple[Hashable, ...]:
    """The module's plain-valued attributes (``self.negative_slope``, ``self.training``...):
    ``message()`` may read them, so a change re-traces it. ``None`` is left out with the tensors:
    an attribute ``message()`` stores a tensor in (``self._alpha``) holds ``None`` before."""
    settings = []
    for name, value in vars(module).items():
        if value is None:
            continue
        try:
            settings.append((name, _freeze(value)))
        except TypeError:
            continue
    return tuple(settings)


__all__ = ["MessagePassing", "observe_fallbacks", "observe_stages"]
