"""The graph data of an operator, apart from what is computed on it and how.

A :class:`GraphTensor` holds the user's edges in the user's order and lazily builds, per device and
index dtype, the structures the kernels walk: the destination-sorted CSR (rows are destinations,
so a gather op reduces one row), the source-sorted CSC of the reversed graph (the backward pass),
the COO in user order (message creation), the neighbour-group chunk tables, and the degree
statistics the cost model reads. Edge-level tensors stay in the user's edge order at the API; the
permutation from CSR positions back to edge ids (``eid``) is internal.

One graph may serve several threads at once: two that build a structure at the same time each
build one and the caches keep either, equal in value (``docs/caches.md``).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch._library.custom_ops import CustomOpDef

from autotune import selection
from triton_kernels.codegen import uses_triton
from triton_kernels.csr_pair import build_csr_pair, grouped
from triton_kernels.row_offsets import UserOrderPair, build_user_order_pair

from .structure import (
    CSR,
    DegreeStats,
    GraphStats,
    GraphStructure,
    build_csr,
    capturing,
    chunk_table,
    csr_stats,
    derived_cache,
    in_user_order,
    index_dtype_for,
    keeping_nothing,
    keeps_nothing,
    mark_reused,
    records_steps,
    split_chunk_slots,
    split_rows,
    version,
)

NumNodes = Union[None, int, Tuple[int, int]]
#: The tags of every custom op of this package. The ops find a graph's structure, statistics and
#: schedules in caches keyed by tensor identity and build them, with host syncs, on a miss. In a CUDA
#: graph that ``torch.compile(mode="reduce-overhead")`` records, their inputs are copies in the
#: graph's memory pool, so every lookup would miss and the recording fail. Marked unsafe for CUDA
#: graphs, they run outside the recorded graphs: Inductor partitions the graph around them.
OP_TAGS = tuple(tag for tag in (getattr(torch.Tag, "cudagraph_unsafe", None),) if tag is not None)


def recordable(structure: GraphStructure) -> bool:
    """Whether a compiled graph calls the recordable twins (:func:`recordable_pair`) of the operators
    on ``structure``: a graph of at most :data:`autotune.selection.SMALL_GRAPH_EDGES` edges, counted
    by a plain int, whose schedules read no statistics and wait for nothing. Dynamo hands the code
    it traces a symbolic size as an int: a forward pass compiled with dynamic shapes calls the twins
    and guards on the count (a larger graph recompiles once); the backward pass, traced by
    AOTAutograd on symbolic sizes, calls the tagged ops. Larger graphs (statistics, timed choices,
    chunk tables and operands kept in CSR order) run their operators outside the CUDA graphs."""
    num_edges = structure.num_edges
    return type(num_edges) is int and num_edges <= selection.SMALL_GRAPH_EDGES


def recordable_pair(
    name: str, implementation: Callable[..., Any], fake: Callable[..., Any]
) -> Tuple[CustomOpDef, CustomOpDef]:
    """The custom op ``pyg_ugrapher::<name>`` of ``implementation`` (shapes by ``fake``), twice:
    tagged with :data:`OP_TAGS`, so that ``torch.compile(mode="reduce-overhead")`` runs it outside
    the CUDA graphs it records, and untagged as ``pyg_ugrapher::recordable_<name>``, which those
    graphs record (for graphs that :func:`recordable` admits): it runs ``implementation`` inside
    :func:`~pyg_ugrapher.structure.keeping_nothing`, since a tensor that a cache kept from a
    recorded op would be overwritten by the replays."""
    outside = torch.library.custom_op(f"pyg_ugrapher::{name}", implementation, mutates_args=(), tags=OP_TAGS)

    def keeping(*args: Any) -> Any:
        with keeping_nothing():
            return implementation(*args)

    inside = torch.library.custom_op(
        f"pyg_ugrapher::recordable_{name}",
        keeping,
        mutates_args=(),
        schema=torch.library.infer_schema(implementation, mutates_args=()),
    )
    for op in (outside, inside):
        op.register_fake(fake)
    return outside, inside


def _built_structure(src: Tensor, dst: Tensor, num_src: int, num_dst: int, index_dtype: torch.dtype) -> List[Tensor]:
    """Both sorted directions of the graph ``(src, dst)`` and its endpoints, in ``index_dtype``,
    flattened; every array a new one (a custom op's outputs may alias neither its inputs nor one
    another)."""
    src, dst = src.to(index_dtype, copy=True), dst.to(index_dtype, copy=True)
    csr, csc = build_csr_pair(src, dst, num_src, num_dst, index_dtype)
    return GraphStructure(csr, csc, src, dst).flat()


@torch.library.custom_op("pyg_ugrapher::graph_structure", mutates_args=(), tags=OP_TAGS)
def graph_structure(
    src: Tensor, dst: Tensor, num_src: int, num_dst: int, index_dtype: Optional[torch.dtype] = None
) -> List[Tensor]:
    """:meth:`GraphTensor.structure` of the graph ``(src, dst)``, sorted, in ``index_dtype`` (by
    default ``src``'s), flattened (:meth:`~pyg_ugrapher.structure.GraphStructure.flat`).

    What a compiled graph calls for a graph whose structure was not built before: every call of
    the compiled code passes the same ``src`` and ``dst`` objects, so the structure is built once,
    kept with ``src`` until it dies, and built again if either array changes in place (or ``src``
    comes with another ``dst``, or its ``dst`` died). Not kept where nothing may be (:func:`keeps_nothing`: inside a
    CUDA graph capture, whose replays would rewrite it)."""
    index_dtype = src.dtype if index_dtype is None else index_dtype
    if keeps_nothing(src):
        return _built_structure(src, dst, num_src, num_dst, index_dtype)
    cache = derived_cache(src)
    key = ("graph structure", num_src, num_dst, index_dtype)
    versions = (version(src), version(dst))
    kept = cache.get(key)
    # ``dst`` by a weak reference: a dead one is no tensor's (an id may be reused), and a strong
    # one would keep ``src`` alive, and the entry with it, where ``dst`` is ``src`` or a view of it.
    if kept is None or kept[0]() is not dst or kept[1] != versions:
        kept = (weakref.ref(dst), versions, _built_structure(src, dst, num_src, num_dst, index_dtype))
        cache[key] = kept
    return list(kept[2])


@graph_structure.register_fake
def _(src: Tensor, dst: Tensor, num_src: int, num_dst: int, index_dtype: Optional[torch.dtype] = None) -> List[Tensor]:
    dtype = src.dtype if index_dtype is None else index_dtype

    def empty(size: int) -> Tensor:
        return src.new_empty(size, dtype=dtype)

    num_edges = src.shape[0]
    csr = CSR(empty(num_dst + 1), empty(num_edges), empty(num_edges), empty(num_edges), num_src)
    csc = CSR(empty(num_src + 1), empty(num_edges), empty(num_edges), empty(num_edges), num_dst)
    return GraphStructure(csr, csc, empty(num_edges), empty(num_edges)).flat()


def _check_num(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_nodes: {name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"num_nodes: {name} must be non-negative, got {value}")
    return value


class RangeCheck:
    """The range check of a graph's indices from the extremes that the build of its user-order
    structure kept (:func:`~triton_kernels.row_offsets.build_user_order_pair`), read without waiting
    for the device.

    On a GPU the four extremes are copied into pinned host memory behind the build; the check
    finishes at the first later look that finds the copy done (:meth:`finish`): its graph's next
    operator call, or the construction of any later graph (:func:`finish_range_checks`), so a
    sampler's new graph every step costs no host synchronisation. Until then the structure's
    indices are clamped into range (no kernel reads outside its tensors); a bad index raises
    ``ValueError`` at that later look, and at every use of its graph after. On a CPU the extremes
    are there at once: the check finishes at construction."""

    __slots__ = (
        "extremes", "copied", "num_src", "num_dst", "num_edges", "added_dst_rows",
        "graph", "error", "passed", "reported",
    )  # fmt: skip

    def __init__(self, extremes: Tensor, num_src: int, num_dst: int, graph: "GraphTensor") -> None:
        self.num_src, self.num_dst, self.num_edges = num_src, num_dst, graph.src.numel()
        self.added_dst_rows = graph.added_dst_rows
        # Weakly: a pending check outlives a mini-batch's graph, and needs it only to name an index
        # beyond the index dtype (see finish).
        self.graph = weakref.ref(graph)
        self.error: Optional[ValueError] = None
        self.passed = False
        self.reported = False  # the error was raised to the user (by any call)
        self.copied: Optional[torch.cuda.Event] = None
        if extremes.device.type == "cuda":
            # Pinned: the copy is queued behind the build, and the host goes on.
            self.extremes = torch.empty(extremes.shape, dtype=extremes.dtype, pin_memory=True)
            self.extremes.copy_(extremes, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record(torch.cuda.current_stream(extremes.device))  # the copy's stream
        else:
            self.extremes = extremes

    def ready(self) -> bool:
        """Whether the extremes have reached the host (never waits)."""
        return self.copied is None or self.copied.query()

    def finish(self, wait: bool = False) -> bool:
        """Finish the check if its extremes are on the host (with ``wait``, after waiting for them):
        whether it has finished. Raises ``ValueError`` (now and at every later call) for an index
        out of range."""
        if self.passed:
            return True
        if self.error is None:
            if not wait and not self.ready():
                return False
            if self.copied is not None:
                self.copied.synchronize()
            try:
                self._check(self.extremes.tolist())
            except ValueError as error:
                self.error = error
            else:
                self.passed = True
                return True
        self.reported = True
        raise self.error

    def _check(self, extremes: List[int]) -> None:
        graph = self.graph()
        limits = torch.iinfo(self.extremes.dtype)
        if graph is not None and (limits.min in extremes or limits.max in extremes):
            # Saturated at the index dtype's range (out of any such graph's): the exact check
            # names the index.
            validate_endpoints(graph.src, graph.dst, self.num_src, self.num_dst, added_dst_rows=self.added_dst_rows)
        check_extremes(extremes, self.num_src, self.num_dst, self.added_dst_rows)


#: Range checks whose extremes were still on their way to the host (:class:`RangeCheck`).
_PENDING_CHECKS: List[RangeCheck] = []
_PENDING_LOCK = threading.Lock()


def finish_range_checks() -> None:
    """Finish every pending :class:`RangeCheck` whose extremes have reached the host (never waits):
    a graph whose check fails raises its ``ValueError`` here, whichever graph is built next, unless
    a call of its own raised it already."""
    if not _PENDING_CHECKS:
        return
    with _PENDING_LOCK:
        done = [check for check in _PENDING_CHECKS if check.reported or check.passed or check.ready()]
        for check in done:
            _PENDING_CHECKS.remove(check)
    failed = None
    for check in done:
        if check.reported:
            continue
        try:
            check.finish()
        except ValueError as error:
            failed = failed or (check, error)
    if failed is not None:
        check, error = failed
        raise ValueError(
            f"{error}, in a graph built earlier (num_src={check.num_src}, "
            f"num_dst={check.num_dst - check.added_dst_rows}, "
            f"{check.num_edges} edges), whose check read the GPU's answer without waiting for it"
        ) from error


class GraphTensor:
    r"""A directed graph :math:`(u \to v)` with ``num_src`` source and ``num_dst`` destination vertices.

    Build it with :meth:`from_edge_index` (a ``[2, E]`` tensor, source row first as in PyG, or a PyG
    ``EdgeIndex``) or :meth:`from_data` (a PyG ``Data``). The sizes may differ (bipartite message
    passing, PyG's ``size=(N_src, N_dst)``). Structures are built on first use and cached per
    device and index dtype, so one graph serves the CPU and several GPUs. They are built again,
    and the indices validated again, when the edges given change in place (their tensor's
    version; an inference tensor has none, so its in-place changes are not seen).

    Args:
        src: ``[E]`` source vertex of each edge.
        dst: ``[E]`` destination vertex of each edge.
        num_src: number of source vertices.
        num_dst: number of destination vertices.
        index_dtype: force int32 or int64 indices in the kernels; default: int32 where it fits.
        validate: check dtypes, shapes and index ranges (one device sync; not while a CUDA graph
            is being captured). A small GPU graph whose structure keeps the user's order is
            checked by the kernel that builds that structure, which construction then builds,
            without a sync: its index out of range raises ``ValueError`` at a later call
            (:class:`RangeCheck`), and its structure reads it clamped into range until then;
            :meth:`validate` checks at once.
    """

    #: Destination rows that the graph has past those of the index it was made of (a spare row:
    #: :func:`~pyg_ugrapher.graph_argument.spare_row_looped_graph`), whose destinations out of range
    #: it moved one row further per added row: its range errors name the index's own numbers.
    added_dst_rows: int = 0

    def __init__(
        self,
        src: Tensor,
        dst: Tensor,
        num_src: int,
        num_dst: int,
        *,
        index_dtype: Optional[torch.dtype] = None,
        validate: bool = True,
    ) -> None:
        num_src = _check_num("num_src", num_src)
        num_dst = _check_num("num_dst", num_dst)
        # Inside a CUDA graph capture a check would wait for the GPU: the recorder checks instead
        # (see pyg_ugrapher.graph_argument.built_in_recording).
        check_now = validate and not (isinstance(src, Tensor) and capturing(src))
        # A small graph on the GPU is checked by the kernel that builds its structure in the user's
        # order (its first use builds it anyway): the check costs no launch of its own and one read
        # of four numbers, where a separate check takes three launches and the same read. Not a
        # graph with a side of no vertex: no range to clamp into, and its error needs no device read.
        checked_by_build = (
            check_now
            and isinstance(src, Tensor)
            and src.numel() > 0
            and min(num_src, num_dst) > 0
            and uses_triton(src.device)
            and selection.reads_user_order(src.numel(), src.device)
            and not _read_by_recorded_step(src)
        )
        if checked_by_build:
            check_endpoints(src, dst)
            finish_range_checks()
        elif check_now:
            validate_endpoints(src, dst, num_src, num_dst, added_dst_rows=self.added_dst_rows)
        if index_dtype is None:
            index_dtype = index_dtype_for(max(num_src, num_dst), src.numel())
        elif index_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index_dtype: must be torch.int32 or torch.int64, got {index_dtype}")
        elif index_dtype == torch.int32 and index_dtype_for(max(num_src, num_dst), src.numel()) != torch.int32:
            raise ValueError("index_dtype: this graph is too large for int32 indices")
        self.src = src.to(torch.int64)
        self.dst = dst.to(torch.int64)
        self.num_src = num_src
        self.num_dst = num_dst
        self.index_dtype = index_dtype
        # Shared with the reversed graph, whose CSR is this graph's CSC and vice versa.
        self._csr_cache: Dict[torch.device, CSR] = {}
        self._csc_cache: Dict[torch.device, CSR] = {}
        self._coo_cache: Dict[torch.device, Tuple[Tensor, Tensor]] = {}
        self._structure_cache: Dict[torch.device, GraphStructure] = {}
        # The reversed graph: held by the graph that made it, which it refers back to weakly, so
        # that the two form no reference cycle. A cycle would outlive its edges until the garbage
        # collector found it: a mini-batch's structures (device memory) kept past its step.
        self._reverse: Optional[GraphTensor] = None
        self._reverse_of: Optional[weakref.ReferenceType] = None
        self._validate = validate
        self._versions = (version(self.src), version(self.dst))
        self._range_check: Optional[RangeCheck] = None
        if checked_by_build:
            device = self._resolve(None)
            # Built now for a later first use, maybe in training: never as inference tensors.
            with torch.inference_mode(False):
                built = build_user_order_pair(self.src, self.dst, num_src, num_dst, index_dtype, extrema=True)
            check = RangeCheck(built.extremes, num_src, num_dst, self)
            if not check.finish():
                self._range_check = check
                with _PENDING_LOCK:
                    _PENDING_CHECKS.append(check)
            self._cache_user_order(device, built)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_edge_index(
        cls,
        edge_index: Tensor,
        num_nodes: NumNodes = None,
        *,
        index_dtype: Optional[torch.dtype] = None,
        validate: bool = True,
    ) -> "GraphTensor":
        """From a ``[2, E]`` tensor (row 0 = source) or a PyG ``EdgeIndex``.

        ``num_nodes`` is an int (both sides), a ``(num_src, num_dst)`` pair, or ``None`` to infer
        it from the indices (an ``EdgeIndex`` supplies its own sparse size).
        """
        if not isinstance(edge_index, Tensor):
            raise TypeError(f"edge_index: expected a torch.Tensor of shape [2, E], got {type(edge_index).__name__}")
        if num_nodes is None and hasattr(edge_index, "sparse_size"):
            sizes = edge_index.sparse_size()
            if sizes[0] is not None and sizes[1] is not None:
                num_nodes = (int(sizes[0]), int(sizes[1]))
        if hasattr(edge_index, "as_tensor"):
            edge_index = edge_index.as_tensor()
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index: expected shape [2, E], got {list(edge_index.shape)}")
        _check_index_dtype(edge_index)
        src, dst = edge_index[0], edge_index[1]
        if num_nodes is None:
            inferred = int(edge_index.max()) + 1 if edge_index.numel() else 0
            num_src = num_dst = inferred
        elif isinstance(num_nodes, tuple) or isinstance(num_nodes, list):
            if len(num_nodes) != 2:
                raise ValueError(f"num_nodes: expected an int or a (num_src, num_dst) pair, got {num_nodes}")
            num_src = _check_num("num_src", num_nodes[0])
            num_dst = _check_num("num_dst", num_nodes[1])
        else:
            num_src = num_dst = _check_num("num_nodes", num_nodes)
        return cls(src, dst, num_src, num_dst, index_dtype=index_dtype, validate=validate)

    @classmethod
    def from_data(cls, data, **kwargs) -> "GraphTensor":
        """From a PyG ``Data`` (its ``edge_index`` and ``num_nodes``)."""
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise ValueError("data: has no edge_index")
        return cls.from_edge_index(edge_index, data.num_nodes, **kwargs)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        return self.src.numel()

    @property
    def device(self) -> torch.device:
        """Where the user's edges live; structures for other devices are built on demand."""
        return self.src.device

    @property
    def edge_index(self) -> Tensor:
        return torch.stack([self.src, self.dst])

    @property
    def is_bipartite(self) -> bool:
        return self.num_src != self.num_dst

    def __repr__(self) -> str:
        sizes = (
            f"num_nodes={self.num_src}" if not self.is_bipartite else f"num_src={self.num_src}, num_dst={self.num_dst}"
        )
        return f"GraphTensor({sizes}, num_edges={self.num_edges}, device={self.device})"

    def validate(self) -> "GraphTensor":
        """Check the edges' dtypes, shapes and index ranges now, waiting for the device (one sync),
        and return the graph (as PyG's ``EdgeIndex.validate``): where a new small GPU graph's check
        is still on its way (:class:`RangeCheck`), its answer; otherwise the whole check, also for a
        graph built with ``validate=False``. Raises ``ValueError`` for an index out of range."""
        check = self._range_check
        if check is not None and not check.passed:
            self._finish_range_check(wait=True)
        else:
            validate_endpoints(self.src, self.dst, self.num_src, self.num_dst, added_dst_rows=self.added_dst_rows)
        return self

    # -- structures --------------------------------------------------------------------------
    def _resolve(self, device: Union[None, str, torch.device]) -> torch.device:
        device = self.device if device is None else torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def _current(self) -> bool:
        """Whether the edges are unchanged since the structures were read (:meth:`_refresh`), by
        their versions read directly: the check of every operator call."""
        try:
            return self._versions == (self.src._version, self.dst._version)
        except RuntimeError:  # an inference tensor counts no versions: version() says None
            return self._versions == (version(self.src), version(self.dst))

    def _finish_range_check(self, wait: bool = False) -> None:
        """Finish the pending :class:`RangeCheck` of the edges if the device has answered (with
        ``wait``, once it has): raise ``ValueError`` for an index out of range."""
        check = self._range_check
        if check is not None and check.finish(wait):
            self._range_check = None

    def _refresh(self) -> None:
        """Drop this graph's and its reverse's structures if the edges changed in place since
        they were read (validated again first, as at construction): they were stale, and an
        index changed out of range would have been read out of bounds. Not under ``torch.compile``,
        which cannot trace a tensor's version (a compiled graph reads the structures it was
        traced with, or builds them inside)."""
        if torch.compiler.is_compiling():
            return
        versions = (version(self.src), version(self.dst))
        if versions == self._versions:
            return
        if self._validate:
            validate_endpoints(self.src, self.dst, self.num_src, self.num_dst, added_dst_rows=self.added_dst_rows)
            check = self._range_check
            if check is not None:  # of the edges before the change: they are checked now
                check.error, check.passed = None, True
                self._range_check = None
        self._csr_cache.clear()
        self._csc_cache.clear()
        twin = self._twin()
        for graph in (self, twin):
            if graph is not None:
                graph._coo_cache.clear()
                graph._structure_cache.clear()
        self._versions = versions
        if twin is not None:
            twin._versions = versions[::-1]

    def csr(self, device: Union[None, str, torch.device] = None) -> CSR:
        """Destination-sorted CSR: row ``v`` lists the edges into ``v``."""
        self._refresh()
        device = self._resolve(device)
        if device not in self._csr_cache:
            # Sorted (not a sampler's new graph, which keeps the user's order): of checked indices.
            self._finish_range_check(wait=True)
            src, dst = self.coo(device)
            csr, csc = build_csr_pair(src, dst, self.num_src, self.num_dst, self.index_dtype)
            self._csr_cache[device] = csr
            # The backward pass walks the CSC: built with the CSR, it costs no second sort.
            self._csc_cache.setdefault(device, csc)
        return self._csr_cache[device]

    def csc(self, device: Union[None, str, torch.device] = None) -> CSR:
        """Source-sorted CSR of the reversed graph: row ``u`` lists the edges out of ``u``."""
        return self.reverse().csr(device)

    def coo(self, device: Union[None, str, torch.device] = None) -> Tuple[Tensor, Tensor]:
        """``(src, dst)`` in the user's edge order, in the index dtype."""
        self._refresh()
        device = self._resolve(device)
        if device not in self._coo_cache:
            # The user's indices as they are, which the sorting build reads: checked first.
            self._finish_range_check(wait=True)
            self._coo_cache[device] = (self.src.to(device, self.index_dtype), self.dst.to(device, self.index_dtype))
        return self._coo_cache[device]

    def structure(
        self, device: Union[None, str, torch.device] = None, *, sort: Optional[bool] = None
    ) -> GraphStructure:
        """Every index array the operators read, as one record: the CSR, the CSC, and ``src`` and
        ``dst`` in user order, all in the index dtype (a custom op takes it flattened,
        :meth:`~pyg_ugrapher.structure.GraphStructure.flat`).

        ``sort=False`` keeps both directions' edges in the user's order
        (:func:`~triton_kernels.row_offsets.build_user_order_pair`); the default does so where the
        automatic schedules read them so (:func:`autotune.selection.reads_user_order`: small GPU
        graphs, a sampler's mini-batches, which then pay no sort), and sorts elsewhere and under
        ``torch.compile``.
        A custom op that returns a structure asks for a sorted one: a user-order structure
        repeats ``src`` and ``dst``, and a custom op's outputs may not alias one another.

        Under ``torch.compile`` a structure not built yet is built by one opaque op inside the
        compiled graph (no graph break), once: :func:`graph_structure` keeps it with the edges.
        """
        compiling = torch.compiler.is_compiling()
        if compiling:
            sort = True
        else:
            if not self._current():
                self._refresh()
            if self._range_check is not None:
                self._finish_range_check()
        # Looked up per operator call, which passes a tensor's (resolved) device: no resolving then.
        key = device if sort is None else (device, sort)
        built = self._structure_cache.get(key)
        if built is None:
            device = self._resolve(device)
            key = device if sort is None else (device, sort)
            built = self._structure_cache.get(key)
        if built is not None:
            return built
        # A whole step being recorded pays its host time once: the sorted structure and the cost
        # model's schedules (mark_reused) serve every replay. Not a graph built inside the capture
        # (a padded mini-batch's), which every replay rebuilds for a new batch: a sort there would
        # be replayed too, and its schedules are the small-graph rule's anyway.
        recorded = sort is None and _read_by_recorded_step(self.src)
        if sort is None:
            sort = recorded or not selection.reads_user_order(self.num_edges, device)
        if compiling and device not in self._csr_cache:
            self._finish_range_check(wait=True)  # the op reads the user's indices as they are
            arrays = graph_structure(
                self.src.to(device), self.dst.to(device), self.num_src, self.num_dst, self.index_dtype
            )
            return GraphStructure.from_flat(arrays, user_order=False)
        if not sort:
            # The graph's own edges where they live (the kernel copies them into the index dtype).
            src, dst = (self.src, self.dst) if device == self.src.device else self.coo(device)
            pair = build_user_order_pair(src, dst, self.num_src, self.num_dst, self.index_dtype)
            return self._cache_user_order(device, pair, key)
        built = GraphStructure(self.csr(device), self.csc(device), *self.coo(device))
        if recorded:
            _mark_reused(built)
        self._structure_cache[key] = built
        return built

    def _cache_user_order(self, device: torch.device, pair: UserOrderPair, key: Any = None) -> GraphStructure:
        """Cache the structure in the user's order ``pair`` on ``device`` (under ``key``, default
        ``device``), and its index-dtype copies of the edges as :meth:`coo`; where :meth:`coo` has
        copies already, the structure reads those (each endpoint array is one tensor everywhere)."""
        src, dst = self._coo_cache.setdefault(device, (pair.csr.col, pair.csc.col))
        csr, csc = pair.csr, pair.csc
        if csr.col is not src:
            csr, csc = replace(csr, col=src, rows=dst), replace(csc, col=dst, rows=src)
        built = GraphStructure(csr, csc, src, dst)
        self._structure_cache[device if key is None else key] = built
        return built

    def eager_structure(self, device: torch.device) -> GraphStructure:
        """:meth:`structure` on a resolved ``device`` (an operand's), outside ``torch.compile``:
        what every eager operator call looks up. A structure in the user's order read while a whole
        step is recorded (outside its capture) is replaced by the sorted one, whose schedules the
        cost model picks (:func:`~pyg_ugrapher.structure.mark_reused`): every replay reads it, so
        its sort and statistics are paid once for faster kernels at every replay."""
        if not self._current():
            self._refresh()
        if self._range_check is not None:
            self._finish_range_check()
        built = self._structure_cache.get(device)
        if built is not None and built.csr.user_order and _read_by_recorded_step(built.src):
            del self._structure_cache[device]  # built again by structure(): sorted and marked
            built = None
        return built if built is not None else self.structure(device)

    def _twin(self) -> Optional["GraphTensor"]:
        """The reversed graph if it was made and is alive."""
        if self._reverse is not None:
            return self._reverse
        return self._reverse_of() if self._reverse_of is not None else None

    def reverse(self) -> "GraphTensor":
        """The graph with every edge turned around; shares this graph's caches."""
        twin = self._twin()
        if twin is None:
            twin = GraphTensor.__new__(GraphTensor)
            twin.src, twin.dst = self.dst, self.src
            twin.num_src, twin.num_dst = self.num_dst, self.num_src
            twin.index_dtype = self.index_dtype
            twin._validate = self._validate
            twin._range_check = self._range_check
            twin._versions = self._versions[::-1]
            twin._csr_cache, twin._csc_cache = self._csc_cache, self._csr_cache
            twin._coo_cache = {}
            twin._structure_cache = {}
            twin._reverse = None
            twin._reverse_of = weakref.ref(self)
            self._reverse = twin
        return twin

    def stats(self, device: Union[None, str, torch.device] = None) -> GraphStats:
        """Degree statistics (rows = destinations), cached."""
        return csr_stats(self.csr(device))

    def chunks(self, group_size: int, device: Union[None, str, torch.device] = None) -> Tuple[Tensor, Tensor]:
        """The neighbour-group chunk table of the CSR (see :func:`chunk_table`)."""
        return chunk_table(self.csr(device), group_size)

    def in_degree(self, device: Union[None, str, torch.device] = None) -> Tensor:
        rowptr = self.csr(device).rowptr
        return (rowptr[1:] - rowptr[:-1]).to(torch.int64)

    def out_degree(self, device: Union[None, str, torch.device] = None) -> Tensor:
        return self.reverse().in_degree(device)

    # -- reordering --------------------------------------------------------------------------
    def reorder(self, method: str = "rcm") -> Tuple["GraphTensor", Tensor]:
        """Relabel the vertices for locality; returns ``(graph, perm)`` with ``perm[new] = old``.

        ``"degree"`` sorts vertices by decreasing total degree (hubs share cache lines);
        ``"rcm"`` is reverse Cuthill-McKee on the symmetrised graph (neighbours get close ids).
        Only for graphs whose two sides are the same vertex set. Vertex features must be permuted
        with ``x[perm]`` and outputs mapped back with ``out[inverse]`` where
        ``inverse[perm] = arange(N)``; edges keep their order.
        """
        if self.is_bipartite:
            raise ValueError("method: reordering needs the same vertex set on both sides, this graph is bipartite")
        n = self.num_src
        degree = self.in_degree(self.device) + self.out_degree(self.device)
        if method == "degree":
            perm = torch.argsort(-degree, stable=True)
        elif method == "rcm":
            perm = _reverse_cuthill_mckee(self.src, self.dst, n, degree)
        else:
            raise ValueError(f"method: unknown reordering {method!r}; expected 'rcm' or 'degree'")
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(n, device=perm.device)
        graph = GraphTensor(inverse[self.src], inverse[self.dst], n, n, index_dtype=self.index_dtype, validate=False)
        return graph, perm


def _reverse_cuthill_mckee(src: Tensor, dst: Tensor, n: int, degree: Tensor) -> Tensor:
    """Level-synchronous RCM: BFS from a minimum-degree vertex of each component; within a level,
    vertices are ordered by the position of their earliest visited neighbour, then by degree."""
    device = src.device
    sym = build_csr(torch.cat([src, dst]), torch.cat([dst, src]), n, n, torch.int64)
    order = torch.full((n,), -1, dtype=torch.int64, device=device)
    position = 0
    by_degree = torch.argsort(degree, stable=True)
    cursor = 0
    while position < n:
        while order[by_degree[cursor]] >= 0:
            cursor += 1
        frontier = by_degree[cursor : cursor + 1]
        order[frontier] = position
        position += 1
        while frontier.numel():
            counts = sym.rowptr[frontier + 1] - sym.rowptr[frontier]
            parents = torch.repeat_interleave(frontier, counts)
            starts = torch.repeat_interleave(sym.rowptr[frontier], counts)
            offsets = torch.arange(parents.numel(), device=device) - torch.repeat_interleave(
                torch.cumsum(counts, 0) - counts, counts
            )
            neighbours = sym.col[starts + offsets]
            fresh = order[neighbours] < 0
            neighbours, parents = neighbours[fresh], parents[fresh]
            if neighbours.numel() == 0:
                break
            # Key each new vertex by its earliest-ordered parent, then its degree.
            key = order[parents] * (n + 1) + degree[neighbours]
            best = torch.full((n,), torch.iinfo(torch.int64).max, dtype=torch.int64, device=device)
            best.scatter_reduce_(0, neighbours, key, reduce="amin")
            frontier = torch.unique(neighbours)
            frontier = frontier[torch.argsort(best[frontier], stable=True)]
            order[frontier] = torch.arange(position, position + frontier.numel(), device=device)
            position += frontier.numel()
    perm = torch.empty(n, dtype=torch.int64, device=device)
    perm[order] = torch.arange(n, device=device)
    return perm.flip(0)


def _check_index_dtype(index: Tensor) -> None:
    if index.dtype in (torch.bool,) or index.is_floating_point() or index.is_complex():
        raise TypeError(f"edge_index: indices must be an integer tensor, got {index.dtype}")


def check_endpoints(src: Tensor, dst: Tensor) -> None:
    """Check an edge list's endpoint tensors on the host: tensors of integers, one-dimensional, of
    one length, on one device (``edge_index`` errors). Their ranges: :func:`check_extremes`."""
    for name, index in (("src", src), ("dst", dst)):
        if not isinstance(index, Tensor):
            raise TypeError(f"edge_index: {name} must be a tensor, got {type(index).__name__}")
        _check_index_dtype(index)
        if index.dim() != 1:
            raise ValueError(f"edge_index: {name} must be one-dimensional, got shape {list(index.shape)}")
    if src.numel() != dst.numel():
        raise ValueError(f"edge_index: src and dst differ in length ({src.numel()} vs {dst.numel()})")
    if src.device != dst.device:
        raise ValueError(f"edge_index: src and dst are on different devices ({src.device}, {dst.device})")


def check_extremes(extremes: Sequence[int], num_src: int, num_dst: int, added_dst_rows: int = 0) -> None:
    """Check an edge list's index ranges from ``extremes``: the lowest source and destination
    index, then the highest (each may be clamped towards 0, as
    :attr:`~triton_kernels.row_offsets.UserOrderPair.extremes` are: the check reads the same).
    A destination out of range is reported in the numbers of the index the edge list was made of,
    ``added_dst_rows`` lower (:attr:`GraphTensor.added_dst_rows`)."""
    src_low, dst_low, src_high, dst_high = extremes
    if min(src_low, dst_low) < 0:
        raise ValueError(f"edge_index: negative vertex index {min(src_low, dst_low)}")
    if src_high >= num_src:
        raise ValueError(f"edge_index: source index {src_high} out of range for num_src={num_src}")
    if dst_high >= num_dst:
        raise ValueError(
            f"edge_index: destination index {dst_high - added_dst_rows} out of range for "
            f"num_dst={num_dst - added_dst_rows}"
        )


def validate_endpoints(
    src: Tensor, dst: Tensor, num_src: int, num_dst: int, extra: Sequence[Tensor] = (), *, added_dst_rows: int = 0
) -> List[int]:
    """Check an edge list's endpoint tensors and their index ranges (``edge_index`` errors) in one
    device sync, which also reads the integer scalar tensors ``extra`` (in the index dtype, returned
    as ints): a caller that needs a count from the device pays no second sync. ``added_dst_rows``:
    :func:`check_extremes`."""
    check_endpoints(src, dst)
    if src.numel() == 0:
        return [int(t) for t in extra]
    # One device sync for all four bounds (a new mini-batch graph pays this every step).
    src_low, src_high = torch.aminmax(src)
    dst_low, dst_high = torch.aminmax(dst)
    scalars = [src_low, dst_low, src_high, dst_high] + [t.to(src_low.dtype) for t in extra]
    read = torch.stack(scalars).tolist()
    check_extremes(read[:4], num_src, num_dst, added_dst_rows)
    return read[4:]


def _read_by_recorded_step(index: Tensor) -> bool:
    """Whether a structure read now is read while a whole step is recorded, outside the capture
    itself (its warm-up): a structure built inside the capture, on ``index``'s device, is rebuilt
    by every replay (:func:`~pyg_ugrapher.structure.records_steps`)."""
    return records_steps() and not capturing(index)


def _mark_reused(structure: GraphStructure) -> None:
    """:func:`~pyg_ugrapher.structure.mark_reused` for both directions of a sorted structure."""
    for csr in (structure.csr, structure.csc):
        mark_reused(csr.rowptr)


def as_graph(graph: Union["GraphTensor", Tensor], num_nodes: NumNodes = None) -> "GraphTensor":
    """Accept a GraphTensor as is, or build one from an edge index."""
    if isinstance(graph, GraphTensor):
        return graph
    return GraphTensor.from_edge_index(graph, num_nodes)


# Besides this module's own names, the structure records and helpers (:mod:`pyg_ugrapher.structure`)
# and the structure builders (:mod:`triton_kernels.csr_pair`, :mod:`triton_kernels.row_offsets`) that
# a graph's structures are made of, for code that imports them from here.
__all__: Sequence[str] = [
    "GraphTensor",
    "as_graph",
    "validate_endpoints",
    "RangeCheck",
    "finish_range_checks",
    "graph_structure",
    "OP_TAGS",
    "GraphStructure",
    "CSR",
    "GraphStats",
    "DegreeStats",
    "chunk_table",
    "split_rows",
    "split_chunk_slots",
    "csr_stats",
    "derived_cache",
    "build_csr",
    "index_dtype_for",
    "in_user_order",
    "version",
    "build_csr_pair",
    "build_user_order_pair",
    "grouped",
]
