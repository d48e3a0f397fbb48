"""The plain records of a graph's structure, and the pure-torch helpers that read them.

What the kernels (:mod:`triton_kernels`), the tuner (:mod:`autotune`) and the frontend all read of
a graph: its index arrays (:class:`CSR`, :class:`GraphStructure`), its degree statistics
(:class:`GraphStats`, :func:`csr_stats`), the neighbour-group chunk tables (:func:`chunk_table`),
and the caches kept on a structure's ``rowptr`` (:func:`derived_cache`). This module imports nothing
of the project: :class:`~pyg_ugrapher.GraphTensor` (:mod:`pyg_ugrapher.graph`), which builds these
structures with the kernels' help, stands above the kernels and the tuner. How the caches are
shared by threads and streams: ``docs/caches.md``.
"""

from __future__ import annotations

import math
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Hashable, Iterator, List, NamedTuple, Optional, Protocol, Sequence, Tuple, TypeVar

import torch
from torch import Tensor

#: The largest int32: indices and offsets up to it fit int32 arrays.
INT32_MAX = 2**31 - 1


def index_dtype_for(num_nodes: int, num_edges: int) -> torch.dtype:
    """int32 where every index and offset fits, int64 otherwise."""
    return torch.int32 if max(num_nodes, num_edges) <= INT32_MAX else torch.int64


@dataclass(frozen=True)
class CSR:
    """Compressed rows: the edges of each row are contiguous.

    For a graph's :meth:`~pyg_ugrapher.GraphTensor.csr` the rows are destination vertices and ``col``
    holds sources; for :meth:`~pyg_ugrapher.GraphTensor.csc` (the reversed graph) it is the other
    way round.
    """

    rowptr: Tensor  #: ``[num_rows + 1]`` offsets of each row's edges
    col: Tensor  #: ``[E]`` the other endpoint of each edge, in row order
    eid: Tensor  #: ``[E]`` the user's edge id at each position
    rows: Tensor  #: ``[E]`` the row of each position (``rowptr`` expanded), for edge-parallel work
    num_cols: int
    #: The edges in the user's order instead of by row
    #: (:func:`~triton_kernels.row_offsets.build_user_order_pair`): ``col``,
    #: ``rows`` and ``eid`` are per edge id, and ``rowptr`` only gives each row's degree.
    user_order: bool = False

    @property
    def num_rows(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.col.device


@dataclass(frozen=True)
class DegreeStats:
    """Distribution of one side's degrees."""

    mean: float
    std: float
    max: float
    skew: float  #: Fisher skewness, 0 for a regular graph
    top1_fraction: float  #: fraction of all edges held by the 1% highest-degree vertices
    isolated_fraction: float  #: fraction of vertices with no edge on this side


@dataclass(frozen=True)
class GraphStats:
    """Size and shape of a graph, as the cost model sees it.

    ``rows`` describes the vertices an operator reduces into (destinations for a graph, sources
    for its reverse); ``cols`` the vertices it gathers from.
    """

    num_rows: int
    num_cols: int
    num_edges: int
    rows: DegreeStats
    cols: DegreeStats


class HasStats(Protocol):
    """A graph that gives its size and degree statistics, as :class:`~pyg_ugrapher.GraphTensor` does:
    what the tuner (:mod:`autotune.selection`) takes besides a :class:`CSR` or :class:`GraphStats`."""

    @property
    def num_edges(self) -> int: ...

    def stats(self) -> GraphStats: ...


#: How many arrays a flattened :class:`GraphStructure` has (:meth:`GraphStructure.flat`).
STRUCTURE_ARRAYS = 10


class GraphStructure(NamedTuple):
    """Every index array of one graph on one device, in the index dtype: what an operator reads.

    A custom op takes it flattened (:meth:`flat`; :meth:`from_flat` reads it back): a
    ``torch.library`` schema holds tensors, not records.
    """

    csr: CSR  #: destination-sorted: row ``v`` lists the edges into ``v`` (a gather reduces one row)
    csc: CSR  #: source-sorted, the reversed graph's CSR: row ``u`` lists the edges out of ``u``
    src: Tensor  #: ``[E]`` sources in the user's edge order
    dst: Tensor  #: ``[E]`` destinations in the user's edge order

    @property
    def num_src(self) -> int:
        return self.csr.num_cols

    @property
    def num_dst(self) -> int:
        return self.csr.rowptr.shape[0] - 1  # csr.num_rows, read once per reference operator call

    @property
    def num_edges(self) -> int:
        return self.src.numel()

    def reverse(self) -> "GraphStructure":
        """The reversed graph's structure: CSR and CSC swap, and so do the endpoints."""
        return GraphStructure(self.csc, self.csr, self.dst, self.src)

    def flat(self) -> List[Tensor]:
        """The ten arrays a custom op takes: the CSR's ``rowptr``, ``col``, ``eid`` and ``rows``,
        the CSC's, then ``src`` and ``dst``."""
        csr, csc = self.csr, self.csc
        return [csr.rowptr, csr.col, csr.eid, csr.rows, csc.rowptr, csc.col, csc.eid, csc.rows, self.src, self.dst]

    @classmethod
    def from_flat(cls, arrays: Sequence[Tensor], user_order: Optional[bool] = None) -> "GraphStructure":
        """The structure of :meth:`flat`'s arrays. ``user_order``: whether its edges are in the
        user's order (:attr:`CSR.user_order`); ``None`` looks it up (:func:`in_user_order`), which
        ``torch.compile`` cannot trace: a compiled caller knows its structures are sorted."""
        rowptr, col, eid, rows, csc_rowptr, csc_col, csc_eid, csc_rows, src, dst = arrays
        if user_order is None:
            user_order = in_user_order(rowptr)
        return cls(
            CSR(rowptr, col, eid, rows, csc_rowptr.numel() - 1, user_order),
            CSR(csc_rowptr, csc_col, csc_eid, csc_rows, rowptr.numel() - 1, user_order),
            src,
            dst,
        )


class EdgeList(NamedTuple):
    """A graph as its edges in the user's order and its node counts, nothing sorted or counted:
    what the reference executor's gathers and scatters read (:mod:`pyg_ugrapher.reference`), and
    what a compiled layer on a small graph runs its operators on (``torch.compile`` fuses them as
    it fuses PyG's; see :func:`pyg_ugrapher.graph_argument.traced_graph`)."""

    src: Tensor  #: ``[E]`` sources
    dst: Tensor  #: ``[E]`` destinations
    num_src: int
    num_dst: int

    @property
    def num_edges(self) -> int:
        return self.src.shape[0]


_MISSING = object()


class IdentityMap:
    """A mapping keyed by objects' identity that forgets an entry when its key dies, as
    ``torch.utils.weak.WeakIdKeyDictionary`` does, at a fraction of its lookup cost (a plain
    ``dict`` lookup by ``id``): an operator call makes several lookups (its graph's
    caches, its decisions, its reused edge operands). Keys must support weak references. Lookups
    and stores are single dictionary operations; :meth:`setdefault` is atomic across threads."""

    __slots__ = ("_items", "_lock")

    def __init__(self) -> None:
        self._items: Dict[int, Tuple[weakref.ref, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: object, default: Any = None) -> Any:
        item = self._items.get(id(key))
        # A dead key's entry goes with it; an id reused before that would fail the identity test.
        if item is None or item[0]() is not key:
            return default
        return item[1]

    def __getitem__(self, key: object) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: object, value: Any) -> None:
        items, ident = self._items, id(key)

        def forget(ref: weakref.ref) -> None:
            if items.get(ident, (None,))[0] is ref:
                del items[ident]

        items[ident] = (weakref.ref(key, forget), value)

    def setdefault(self, key: object, default: Any) -> Any:
        """``self[key]``, set to ``default`` first where ``key`` has no entry: of two threads that
        miss at once, both get the entry of the first."""
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        with self._lock:
            value = self.get(key, _MISSING)
            if value is _MISSING:
                self[key] = value = default
            return value

    def __len__(self) -> int:
        return len(self._items)


T = TypeVar("T")


@contextmanager
def collecting(logs: List[List[T]]) -> Iterator[List[T]]:
    """A new list in ``logs`` for the duration of the block, one per open block (nested or in
    several threads): code that records into every list of ``logs`` reaches each open block."""
    items: List[T] = []
    logs.append(items)
    try:
        yield items
    finally:
        logs.remove(items)


# Derived structures are cached on the rowptr tensor itself (by identity, weakly): the custom op
# of the frontend receives only tensors, and this lets it find a graph's chunk tables and
# statistics again without the GraphTensor and without recomputing them per call.
_DERIVED = IdentityMap()


def capturing(tensor: Tensor) -> bool:
    """Whether work on ``tensor``'s device is being captured into a CUDA graph (``torch.compile``'s
    ``mode="reduce-overhead"``, ``torch.cuda.graph``): tensors made then live in the graph's
    memory pool, which later replays overwrite, so no cache may keep them (:func:`keeps_nothing`),
    and nothing may wait for the device."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


class _Keeping(threading.local):
    #: Open :func:`keeping_nothing` blocks of this thread.
    depth = 0


_KEEPING = _Keeping()


@contextmanager
def keeping_nothing() -> Iterator[None]:
    """Inside the block no cache keeps a tensor (:func:`keeps_nothing`): the ops that
    ``torch.compile(mode="reduce-overhead")`` may record run in it. Their warm-up runs, not captured
    yet, allocate in the CUDA graph's memory pool as well, whose every live tensor must be an output
    of the recording (a kept one would be overwritten by the replays, and the recorder refuses it)."""
    _KEEPING.depth += 1
    try:
        yield
    finally:
        _KEEPING.depth -= 1


class _Recording(threading.local):
    #: Open :func:`recording_steps` blocks of this thread.
    depth = 0


_RECORDING = _Recording()


@contextmanager
def recording_steps() -> Iterator[None]:
    """Inside the block a whole step is being recorded into a CUDA graph (its warm-up runs and its
    capture, see :class:`~pyg_ugrapher.recording.RecordedStep`): host time per call is paid once,
    so what is fastest on the device runs (:func:`records_steps`)."""
    _RECORDING.depth += 1
    try:
        yield
    finally:
        _RECORDING.depth -= 1


def records_steps() -> bool:
    """Whether a :func:`recording_steps` block is open in this thread."""
    return _RECORDING.depth > 0


def keeps_nothing(tensor: Tensor) -> bool:
    """Whether no cache may keep a tensor made from ``tensor`` now: inside :func:`keeping_nothing`,
    or while ``tensor``'s device captures a CUDA graph (:func:`capturing`)."""
    return _KEEPING.depth > 0 or (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def version(tensor: Tensor) -> Hashable:
    """``tensor._version`` for caches keyed on a tensor until it changes in place; ``None`` for an
    inference tensor (made under ``torch.inference_mode``), which counts no versions (reading one
    raises): its in-place changes, possible only in inference mode, are not seen."""
    return None if tensor.is_inference() else tensor._version


class CheckedIndex(NamedTuple):
    """What the code that made a ``[2, E]`` edge index knows of it without reading the device (a
    sampler's batch): every index lies below ``num_nodes``, and ``self_loops`` edges are self loops."""

    version: Hashable
    num_nodes: int
    self_loops: int


# Facts recorded by note_checked, by the edge index object (weakly).
_CHECKED = IdentityMap()


def note_checked(edge_index: Tensor, num_nodes: int, self_loops: int) -> None:
    """Record that every index of ``edge_index`` lies in ``[0, num_nodes)`` and that ``self_loops``
    of its edges are self loops, so that a layer that builds the graph of this index need not wait
    for the device to check them (:func:`checked`). For the code that made the index and knows
    both (a sampler); kept until the index dies or changes in place; never for an inference tensor,
    whose changes are not counted."""
    if version(edge_index) is not None:
        _CHECKED[edge_index] = CheckedIndex(version(edge_index), int(num_nodes), int(self_loops))


def checked(edge_index: Tensor, num_src: int, num_dst: int) -> Optional[CheckedIndex]:
    """The facts :func:`note_checked` recorded for ``edge_index`` if it has not changed since and
    they put both of its rows below ``num_src`` and ``num_dst``; ``None`` otherwise."""
    facts = _CHECKED.get(edge_index)
    if facts is None or facts.version != version(edge_index) or facts.num_nodes > min(num_src, num_dst):
        return None
    return facts


def derived_cache(rowptr: Tensor) -> Dict:
    """The per-structure cache of a CSR, keyed by its ``rowptr`` tensor object: one per structure,
    whichever threads ask first. Its entries are values derived from the structure alone, so two
    threads that compute one at once store equal values (see ``docs/caches.md``)."""
    cache = _DERIVED.get(rowptr)
    if cache is None:
        cache = _DERIVED.setdefault(rowptr, {})
    return cache


def largest_row(csr: CSR) -> Optional[int]:
    """The most edges of one row of ``csr``, once known without waiting for the device: on a GPU
    the first call starts its computation and a copy to the host, and returns ``None`` until that
    copy has arrived (a later call then reads it; kept with the structure). ``None`` also where
    nothing may be kept (:func:`keeps_nothing`). On a CPU the value itself."""
    rowptr = csr.rowptr
    if csr.num_rows == 0 or csr.num_edges == 0:
        return 0
    if not rowptr.is_cuda:
        return int((rowptr[1:] - rowptr[:-1]).max())
    if keeps_nothing(rowptr):
        return None
    cache = derived_cache(rowptr)
    probe = cache.get("largest row")
    if probe is None:
        host = torch.empty((), dtype=rowptr.dtype, pin_memory=True)
        host.copy_((rowptr[1:] - rowptr[:-1]).max(), non_blocking=True)
        arrived = torch.cuda.Event()
        arrived.record()
        probe = cache["largest row"] = [host, arrived, None]
    if probe[2] is None and probe[1].query():
        probe[2] = int(probe[0])
    return probe[2]


def degree_stats(degree: Tensor, num_edges: int) -> Tensor:
    """The fields of :class:`DegreeStats` of the degrees ``degree`` of a graph of ``num_edges`` edges,
    as one float64 tensor on their device (what :func:`csr_stats` reads in one sync)."""
    n = degree.numel()
    if n == 0:
        return torch.zeros(6, dtype=torch.float64, device=degree.device)
    d = degree.to(torch.float64)
    mean = d.mean()
    std = d.std(unbiased=False)
    skew = torch.where(std > 0, ((d - mean) ** 3).mean() / std.clamp_min(1e-12) ** 3, torch.zeros_like(std))
    k = max(1, math.ceil(0.01 * n))
    top = torch.topk(d, k).values.sum() / max(num_edges, 1)
    isolated = (degree == 0).to(torch.float64).mean()
    return torch.stack([mean, std, d.max(), skew, top, isolated])


#: Degree arrays of up to this many entries are summarised on the host after one copy: on a GPU
#: the summary is ~25 tiny kernels, which cost more host time than the copy and the host's passes
#: over so few degrees (a sampler's new mini-batch graph pays it every step). Above it the host's
#: passes (the top-k above all) cost more than the kernels, increasingly with the vertices: a
#: layer whose ``forward()`` makes a new edge index on every call pays them on every call.
HOST_STATS_MAX_DEGREES = 1 << 14


def csr_stats(csr: CSR) -> GraphStats:
    """Degree statistics of a CSR, computed once per structure (one device sync)."""
    cache = derived_cache(csr.rowptr)
    if "stats" not in cache:
        row_degree = (csr.rowptr[1:] - csr.rowptr[:-1]).to(torch.int64)
        col_degree = (
            torch.bincount(csr.col, minlength=csr.num_cols)
            if csr.num_edges
            else torch.zeros(csr.num_cols, dtype=torch.int64, device=csr.device)
        )
        if csr.num_rows + csr.num_cols <= HOST_STATS_MAX_DEGREES:
            row_degree, col_degree = torch.cat([row_degree, col_degree]).cpu().split([csr.num_rows, csr.num_cols])
        values = torch.cat([degree_stats(row_degree, csr.num_edges), degree_stats(col_degree, csr.num_edges)]).tolist()
        cache["stats"] = GraphStats(
            csr.num_rows, csr.num_cols, csr.num_edges, DegreeStats(*values[:6]), DegreeStats(*values[6:])
        )
    return cache["stats"]


def chunk_table(csr: CSR, group_size: int) -> Tuple[Tensor, Tensor]:
    """Neighbour groups: every row split into chunks of at most ``group_size`` edges.

    Returns ``(chunk_row, chunk_start)``; a chunk ends at ``min(start + group_size, rowptr[row+1])``.
    Every row has at least one chunk, so isolated rows are still written by the kernel. Chunks are
    ordered by decreasing length (stably, so equal lengths keep row order): a kernel that walks
    several chunks side by side then finds chunks of one length together, and a power-law graph's
    many tiny rows share programs instead of idling next to full chunks. Cached per structure
    and group size.
    """
    return _chunks(csr, group_size).table


def split_rows(csr: CSR, group_size: int) -> Tensor:
    """The rows of more than ``group_size`` edges (int64, ascending): those :func:`chunk_table`
    splits into several chunks, the only rows whose partial results a neighbour-group kernel
    combines with atomics. Cached with the chunk table."""
    return _chunks(csr, group_size).split_rows


def split_chunk_slots(csr: CSR, group_size: int) -> Tuple[Tensor, Tensor, int]:
    """Where the chunks of split rows (:func:`split_rows`) leave partial results that a second
    kernel combines: ``(slot, slot_start, num_slots)``. ``slot`` gives each chunk of
    :func:`chunk_table` its index among the chunks of split rows, numbered row by row and chunk by
    chunk within a row (-1 for a row of one chunk); ``slot_start`` gives each split row its first
    slot, so its chunks own ``slot_start[i]`` to ``slot_start[i] + ceil(degree / group_size) - 1``.
    Cached with the chunk table."""
    chunks = _chunks(csr, group_size)
    return chunks.slot, chunks.slot_start, chunks.num_slots


class _Chunks(NamedTuple):
    table: Tuple[Tensor, Tensor]
    split_rows: Tensor
    slot: Tensor
    slot_start: Tensor
    num_slots: int


def _chunks(csr: CSR, group_size: int) -> _Chunks:
    if group_size < 1:
        raise ValueError(f"group_size: must be positive, got {group_size}")
    cache = derived_cache(csr.rowptr)
    key = ("chunks", group_size)
    found = cache.get(key)
    if found is None:
        rowptr = csr.rowptr.to(torch.int64)
        degree = rowptr[1:] - rowptr[:-1]
        counts = torch.clamp((degree + group_size - 1) // group_size, min=1)
        split = counts > 1
        split_counts = torch.where(split, counts, 0)
        # One host sync for the three sizes: a mini-batch graph pays it once per group size.
        total, num_split, num_slots = (
            torch.stack([counts.sum(), split.sum(), split_counts.sum()]).tolist() if counts.numel() else (0, 0, 0)
        )
        rows = torch.repeat_interleave(torch.arange(csr.num_rows, device=csr.device), counts, output_size=total)
        first = torch.cumsum(counts, 0) - counts
        within = torch.arange(total, device=csr.device) - first[rows]
        start = rowptr[:-1][rows] + within * group_size
        length = torch.minimum(rowptr[1:][rows] - start, torch.full_like(start, group_size))
        order = torch.argsort(length, descending=True, stable=True)
        first_slot = torch.cumsum(split_counts, 0) - split_counts
        slot = torch.where(split[rows], first_slot[rows] + within, -1)
        split_index = torch.nonzero_static(split, size=num_split).view(-1)
        dtype = csr.rowptr.dtype
        found = _Chunks(
            (rows[order].to(dtype), start[order].to(dtype)),
            split_index,
            slot[order].to(dtype),
            first_slot[split_index].to(dtype),
            num_slots,
        )
        # Kept where it may be; tables built before a capture are read in it (and its warm-ups).
        if not keeps_nothing(csr.rowptr):
            cache[key] = found
    return found


def build_csr(rows: Tensor, cols: Tensor, num_rows: int, num_cols: int, dtype: torch.dtype) -> CSR:
    """Sort edges by ``rows`` (stable, so equal rows keep the user's edge order)."""
    num_edges = rows.numel()
    sorted_rows, perm = torch.sort(rows, stable=True)
    counts = (
        torch.bincount(sorted_rows, minlength=num_rows)
        if num_edges
        else torch.zeros(num_rows, dtype=torch.int64, device=rows.device)
    )
    rowptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return CSR(rowptr.to(dtype), cols[perm].to(dtype), perm.to(dtype), sorted_rows.to(dtype), num_cols)


#: The ``rowptr`` of both directions of every structure in the user's order (:attr:`CSR.user_order`),
#: weakly: :meth:`GraphStructure.from_flat` finds the flag again from a custom op's arrays.
_USER_ORDER = IdentityMap()


def mark_user_order(rowptr: Tensor) -> None:
    """Record that ``rowptr`` is the row offsets of a structure in the user's order (see
    :func:`~triton_kernels.row_offsets.build_user_order_pair`)."""
    _USER_ORDER[rowptr] = True


def in_user_order(rowptr: Tensor) -> bool:
    """Whether ``rowptr`` is the row offsets of a structure in the user's order (:func:`mark_user_order`)."""
    return _USER_ORDER.get(rowptr, False)


#: The ``rowptr`` of both directions of every sorted structure of a graph that a whole step is
#: recorded on (:func:`mark_reused`), weakly.
_REUSED = IdentityMap()


def mark_reused(rowptr: Tensor) -> None:
    """Record that ``rowptr`` is the row offsets of a sorted structure of a graph that a whole step
    is recorded on, whose every replay reads it again: its schedules are worth the graph's
    statistics and the cost model's scoring, whatever its size (:func:`autotune.selection.select`)."""
    _REUSED[rowptr] = True


def marked_reused(rowptr: Tensor) -> bool:
    """Whether ``rowptr`` belongs to the structure of a graph a whole step is recorded on (:func:`mark_reused`)."""
    return _REUSED.get(rowptr, False)
