"""The graph data of an operator, apart from what is computed on it and how.

A :class:`GraphTensor` holds the user's edges in the user's order and lazily builds, per device and
index dtype, the structures the kernels walk: the destination-sorted CSR (rows are destinations,
so a gather op reduces one row), the source-sorted CSC of the reversed graph (the backward pass),
the COO in user order (message creation), the neighbour-group chunk tables, and the degree
statistics the cost model reads. Edge-level tensors stay in the user's edge order at the API; the
permutation from CSR positions back to edge ids (``eid``) is internal.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

NumNodes = Union[None, int, Tuple[int, int]]
_INT32_MAX = 2**31 - 1


def index_dtype_for(num_nodes: int, num_edges: int) -> torch.dtype:
    """int32 where every index and offset fits, int64 otherwise."""
    return torch.int32 if max(num_nodes, num_edges) <= _INT32_MAX else torch.int64


@dataclass(frozen=True)
class CSR:
    """Compressed rows: the edges of each row are contiguous.

    For a graph's :meth:`GraphTensor.csr` the rows are destination vertices and ``col`` holds
    sources; for :meth:`GraphTensor.csc` (the reversed graph) it is the other way round.
    """

    rowptr: Tensor  #: ``[num_rows + 1]`` offsets of each row's edges
    col: Tensor  #: ``[E]`` the other endpoint of each edge, in row order
    eid: Tensor  #: ``[E]`` the user's edge id at each position
    rows: Tensor  #: ``[E]`` the row of each position (``rowptr`` expanded), for edge-parallel work
    num_cols: int
    #: The edges in the user's order instead of by row (:func:`build_user_order_pair`): ``col``,
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


#: The tags of every custom op of this package. The ops find a graph's structure, statistics and
#: schedules in caches keyed by tensor identity and build them, with host syncs, on a miss. In a CUDA
#: graph that ``torch.compile(mode="reduce-overhead")`` records, their inputs are copies in the
#: graph's memory pool, so every lookup would miss and the recording fail
#: (``benchmarks/results/h200-compiled-overhead``, probe 59). Marked unsafe for CUDA graphs, they run
#: outside the recorded graphs: Inductor partitions the graph around them.
OP_TAGS = tuple(tag for tag in (getattr(torch.Tag, "cudagraph_unsafe", None),) if tag is not None)

_MISSING = object()


class IdentityMap:
    """A mapping keyed by objects' identity that forgets an entry when its key dies, as
    ``torch.utils.weak.WeakIdKeyDictionary`` does, at an eighth of its lookup cost (0.10 against
    0.85 us on the project's CPU machine): an operator call makes several lookups (its graph's
    caches, its decisions, its reused edge operands). Keys must support weak references."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: Dict[int, Tuple[weakref.ref, Any]] = {}

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

    def __len__(self) -> int:
        return len(self._items)


# Derived structures are cached on the rowptr tensor itself (by identity, weakly): the custom op
# of the frontend receives only tensors, and this lets it find a graph's chunk tables and
# statistics again without the GraphTensor and without recomputing them per call.
_DERIVED = IdentityMap()


def capturing(tensor: Tensor) -> bool:
    """Whether work on ``tensor``'s device is being captured into a CUDA graph (``torch.compile``'s
    ``mode="reduce-overhead"``, ``torch.cuda.graph``): tensors made then live in the graph's
    memory pool, which later replays overwrite, so no cache may keep them."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def version(tensor: Tensor) -> Hashable:
    """``tensor._version`` for caches keyed on a tensor until it changes in place; ``None`` for an
    inference tensor (made under ``torch.inference_mode``), which counts no versions (reading one
    raises): its in-place changes, possible only in inference mode, are not seen."""
    return None if tensor.is_inference() else tensor._version


def derived_cache(rowptr: Tensor) -> Dict:
    """The per-structure cache of a CSR, keyed by its ``rowptr`` tensor object."""
    cache = _DERIVED.get(rowptr)
    if cache is None:
        cache = {}
        _DERIVED[rowptr] = cache
    return cache


def _degree_stats(degree: Tensor, num_edges: int) -> Tensor:
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
#: the summary is ~25 tiny kernels, which cost more host time than the copy (a sampler's new
#: mini-batch graph pays it every step).
HOST_STATS_MAX_DEGREES = 1 << 20


def csr_stats(csr: CSR) -> GraphStats:
    """Degree statistics of a CSR, computed once per structure (one device sync)."""
    cache = derived_cache(csr.rowptr)
    if "stats" not in cache:
        row_degree = (csr.rowptr[1:] - csr.rowptr[:-1]).to(torch.int64)
        col_degree = torch.bincount(csr.col, minlength=csr.num_cols) if csr.num_edges else \
            torch.zeros(csr.num_cols, dtype=torch.int64, device=csr.device)
        if csr.num_rows + csr.num_cols <= HOST_STATS_MAX_DEGREES:
            row_degree, col_degree = torch.cat([row_degree, col_degree]).cpu().split(
                [csr.num_rows, csr.num_cols])
        values = torch.cat([_degree_stats(row_degree, csr.num_edges),
                            _degree_stats(col_degree, csr.num_edges)]).tolist()
        cache["stats"] = GraphStats(csr.num_rows, csr.num_cols, csr.num_edges,
                                    DegreeStats(*values[:6]), DegreeStats(*values[6:]))
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
    if key not in cache:
        rowptr = csr.rowptr.to(torch.int64)
        degree = rowptr[1:] - rowptr[:-1]
        counts = torch.clamp((degree + group_size - 1) // group_size, min=1)
        split = counts > 1
        split_counts = torch.where(split, counts, 0)
        # One host sync for the three sizes: a mini-batch graph pays it once per group size.
        total, num_split, num_slots = torch.stack([counts.sum(), split.sum(), split_counts.sum()]).tolist() \
            if counts.numel() else (0, 0, 0)
        rows = torch.repeat_interleave(torch.arange(csr.num_rows, device=csr.device), counts,
                                       output_size=total)
        first = torch.cumsum(counts, 0) - counts
        within = torch.arange(total, device=csr.device) - first[rows]
        start = rowptr[:-1][rows] + within * group_size
        length = torch.minimum(rowptr[1:][rows] - start, torch.full_like(start, group_size))
        order = torch.argsort(length, descending=True, stable=True)
        first_slot = torch.cumsum(split_counts, 0) - split_counts
        slot = torch.where(split[rows], first_slot[rows] + within, -1)
        split_index = torch.nonzero_static(split, size=num_split).view(-1)
        dtype = csr.rowptr.dtype
        cache[key] = _Chunks((rows[order].to(dtype), start[order].to(dtype)), split_index, slot[order].to(dtype),
                             first_slot[split_index].to(dtype), num_slots)
    return cache[key]


def build_csr(rows: Tensor, cols: Tensor, num_rows: int, num_cols: int, dtype: torch.dtype) -> CSR:
    """Sort edges by ``rows`` (stable, so equal rows keep the user's edge order)."""
    num_edges = rows.numel()
    sorted_rows, perm = torch.sort(rows, stable=True)
    counts = torch.bincount(sorted_rows, minlength=num_rows) if num_edges else \
        torch.zeros(num_rows, dtype=torch.int64, device=rows.device)
    rowptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return CSR(rowptr.to(dtype), cols[perm].to(dtype), perm.to(dtype), sorted_rows.to(dtype), num_cols)


def build_csr_pair(src: Tensor, dst: Tensor, num_src: int, num_dst: int, dtype: torch.dtype
                   ) -> Tuple[CSR, CSR]:
    """The destination-sorted CSR and the source-sorted CSC of the edges ``(src, dst)``, by one
    stable sort of both directions' row keys at once (``dst``, then ``src + num_dst``).

    A sampler's mini-batch is a new graph every step and needs both directions (the backward walks
    the CSC), so their build is host time every step: one sort and a ``searchsorted`` for the row
    offsets instead of two of :func:`build_csr`'s sort, ``bincount`` (a device sync) and
    ``cumsum`` halves the operations and leaves no sync. Where the operators' kernels run, one
    kernel then writes every array (:mod:`triton_kernels.csr_pair`), instead of about fifteen torch
    operations. ``src`` and ``dst`` are in ``dtype``.
    """
    num_edges = src.numel()
    key_dtype = dtype if num_src + num_dst <= _INT32_MAX else torch.int64
    keys = torch.cat([dst.to(key_dtype), src.to(key_dtype) + num_dst])
    sorted_keys, perm = torch.sort(keys, stable=True)
    from triton_kernels import csr_pair, uses_triton  # here: triton_kernels imports this module
    if uses_triton(src.device) and csr_pair.fits(num_edges, num_src, num_dst):
        arrays = csr_pair.csr_pair_arrays(sorted_keys, perm, src, dst, num_src, num_dst)
        return CSR(*arrays[:4], num_src), CSR(*arrays[4:], num_dst)
    bounds = torch.arange(num_dst + num_src + 1, dtype=key_dtype, device=src.device)
    rowptr = torch.searchsorted(sorted_keys, bounds, out_int32=dtype == torch.int32)
    csr_perm, csc_perm = perm[:num_edges], perm[num_edges:] - num_edges
    # Every array has a storage of its own, never a view of a buffer of both directions: the
    # graph_structure op and the layers' graph ops return both directions, and a custom op's outputs
    # may not alias one another; and caches keyed by an array's identity (statistics and decisions
    # by ``rowptr``, permuted edge operands by ``eid``) miss when a compiled graph's backward gets a
    # saved view back as a new tensor object (a compiled GAT step then recomputed its statistics).
    csr = CSR(rowptr[:num_dst + 1].clone(), src[csr_perm], csr_perm.to(dtype, copy=True),
              sorted_keys[:num_edges].to(dtype, copy=True), num_src)
    csc = CSR(rowptr[num_dst:] - num_edges, dst[csc_perm], csc_perm.to(dtype),
              (sorted_keys[num_edges:] - num_dst).to(dtype), num_dst)
    return csr, csc


#: The ``rowptr`` of every structure built by :func:`build_user_order_pair`, which says so (weakly).
_USER_ORDER = IdentityMap()


def build_user_order_pair(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> Tuple[CSR, CSR]:
    """Both directions of the edges ``(src, dst)`` (in the index dtype) kept in the user's order
    (:attr:`CSR.user_order`), with each direction's row offsets: what an edge-parallel kernel that
    combines every row by atomics reads (:func:`autotune.selection.reads_user_order`). No sort:
    on a GPU, a zeroed buffer, one kernel counting both directions' degrees
    (:mod:`triton_kernels.row_offsets`), two running sums and the edge ids, against
    :func:`build_csr_pair`'s sort and its kernel with eight outputs. Every array but the offsets
    and the edge ids is ``src`` or ``dst`` itself."""
    from triton_kernels import row_offsets, uses_triton  # here: triton_kernels imports this module
    if uses_triton(src.device):
        rowptr, csc_rowptr = row_offsets.row_offsets(src, dst, num_src, num_dst)
    else:
        counts = [torch.bincount(index.to(torch.int64), minlength=n) for index, n in ((dst, num_dst), (src, num_src))]
        rowptr, csc_rowptr = (torch.cat([c.new_zeros(1), c.cumsum(0)]).to(src.dtype) for c in counts)
    eid = torch.arange(src.numel(), dtype=src.dtype, device=src.device)
    for offsets in (rowptr, csc_rowptr):
        _USER_ORDER[offsets] = True
    return CSR(rowptr, src, eid, dst, num_src, True), CSR(csc_rowptr, dst, eid, src, num_dst, True)


def in_user_order(rowptr: Tensor) -> bool:
    """Whether ``rowptr`` is the row offsets of a structure of :func:`build_user_order_pair`."""
    return _USER_ORDER.get(rowptr, False)


def grouped(csr: CSR) -> CSR:
    """``csr`` with its edges grouped by row (stably: each row's edges in the user's order), as
    :func:`build_csr_pair` builds it; a user-order structure's (:attr:`CSR.user_order`), sorted
    once and cached with it, for a kernel that walks rows (a schedule the user named on a small
    graph); ``csr`` itself otherwise."""
    if not csr.user_order:
        return csr
    cache = derived_cache(csr.rowptr)
    if "grouped" not in cache:
        cache["grouped"] = build_csr_pair(csr.col, csr.rows, csr.num_cols, csr.num_rows, csr.col.dtype)[0]
    return cache["grouped"]


@torch.library.custom_op("pyg_ugrapher::graph_structure", mutates_args=(), tags=OP_TAGS)
def graph_structure(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> List[Tensor]:
    """:meth:`GraphTensor.structure` of the graph ``(src, dst)`` (same index dtype), uncached."""
    csr, csc = build_csr_pair(src, dst, num_src, num_dst, src.dtype)
    return [csr.rowptr, csr.col, csr.eid, csr.rows, csc.rowptr, csc.col, csc.eid, csc.rows,
            src.clone(), dst.clone()]


@graph_structure.register_fake
def _(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> List[Tensor]:
    edges = [src.new_empty(src.shape) for _ in range(3)]
    return ([src.new_empty(num_dst + 1)] + edges + [src.new_empty(num_src + 1)]
            + [src.new_empty(src.shape) for _ in range(5)])


def _check_num(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_nodes: {name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"num_nodes: {name} must be non-negative, got {value}")
    return value


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
        validate: check dtypes, shapes and index ranges (one device sync).
    """

    def __init__(self, src: Tensor, dst: Tensor, num_src: int, num_dst: int, *,
                 index_dtype: Optional[torch.dtype] = None, validate: bool = True) -> None:
        num_src = _check_num("num_src", num_src)
        num_dst = _check_num("num_dst", num_dst)
        if validate:
            validate_endpoints(src, dst, num_src, num_dst)
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
        self._structure_cache: Dict[torch.device, List[Tensor]] = {}
        self._reverse: Optional[GraphTensor] = None
        self._validate = validate
        self._versions = (version(self.src), version(self.dst))

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, edge_index: Tensor, num_nodes: NumNodes = None, *,
                        index_dtype: Optional[torch.dtype] = None, validate: bool = True) -> "GraphTensor":
        """From a ``[2, E]`` tensor (row 0 = source) or a PyG ``EdgeIndex``.

        ``num_nodes`` is an int (both sides), a ``(num_src, num_dst)`` pair, or ``None`` to infer
        it from the indices (an ``EdgeIndex`` supplies its own sparse size).
        """
        if not isinstance(edge_index, Tensor):
            raise TypeError(f"edge_index: expected a torch.Tensor of shape [2, E], got "
                            f"{type(edge_index).__name__}")
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
        sizes = f"num_nodes={self.num_src}" if not self.is_bipartite else \
            f"num_src={self.num_src}, num_dst={self.num_dst}"
        return f"GraphTensor({sizes}, num_edges={self.num_edges}, device={self.device})"

    # -- structures --------------------------------------------------------------------------
    def _resolve(self, device: Union[None, str, torch.device]) -> torch.device:
        device = self.device if device is None else torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

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
            validate_endpoints(self.src, self.dst, self.num_src, self.num_dst)
        self._csr_cache.clear()
        self._csc_cache.clear()
        for graph in (self, self._reverse):
            if graph is not None:
                graph._coo_cache.clear()
                graph._structure_cache.clear()
        self._versions = versions
        if self._reverse is not None:
            self._reverse._versions = versions[::-1]

    def csr(self, device: Union[None, str, torch.device] = None) -> CSR:
        """Destination-sorted CSR: row ``v`` lists the edges into ``v``."""
        self._refresh()
        device = self._resolve(device)
        if device not in self._csr_cache:
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
            self._coo_cache[device] = (self.src.to(device, self.index_dtype),
                                       self.dst.to(device, self.index_dtype))
        return self._coo_cache[device]

    def structure(self, device: Union[None, str, torch.device] = None, *, sort: Optional[bool] = None
                  ) -> List[Tensor]:
        """The index arrays the custom op takes: CSR (rowptr, col, eid, rows), then the CSC, then
        ``src`` and ``dst`` in user order, all in the index dtype.

        ``sort=False`` keeps both directions' edges in the user's order
        (:func:`build_user_order_pair`); the default does so where the automatic schedules read
        them so (:func:`autotune.selection.reads_user_order`: small GPU graphs, a sampler's
        mini-batches, which then pay no sort), and sorts elsewhere and under ``torch.compile``.
        A custom op that returns a structure asks for a sorted one: a user-order structure
        repeats ``src`` and ``dst``, and a custom op's outputs may not alias one another.

        Under ``torch.compile`` a structure not built yet is built by one opaque op inside the
        compiled graph (no graph break, but no caching either: build it once outside to reuse it).
        """
        self._refresh()
        compiling = torch.compiler.is_compiling()
        if compiling:
            sort = True
        # Looked up per operator call, which passes a tensor's (resolved) device: no resolving then.
        key = device if sort is None else (device, sort)
        built = self._structure_cache.get(key)
        if built is None:
            device = self._resolve(device)
            key = device if sort is None else (device, sort)
            built = self._structure_cache.get(key)
        if built is not None:
            return built
        if sort is None:
            from autotune.selection import reads_user_order  # here: autotune imports this package
            sort = not reads_user_order(self.num_edges, device)
        if compiling and device not in self._csr_cache:
            return graph_structure(self.src.to(device, self.index_dtype), self.dst.to(device, self.index_dtype),
                                   self.num_src, self.num_dst)
        src, dst = self.coo(device)
        csr, csc = (self.csr(device), self.csc(device)) if sort else \
            build_user_order_pair(src, dst, self.num_src, self.num_dst)
        built = [csr.rowptr, csr.col, csr.eid, csr.rows, csc.rowptr, csc.col, csc.eid, csc.rows, src, dst]
        self._structure_cache[key] = built
        return built

    def reverse(self) -> "GraphTensor":
        """The graph with every edge turned around; shares this graph's caches."""
        if self._reverse is None:
            rev = GraphTensor.__new__(GraphTensor)
            rev.src, rev.dst = self.dst, self.src
            rev.num_src, rev.num_dst = self.num_dst, self.num_src
            rev.index_dtype = self.index_dtype
            rev._validate = self._validate
            rev._versions = self._versions[::-1]
            rev._csr_cache, rev._csc_cache = self._csc_cache, self._csr_cache
            rev._coo_cache = {}
            rev._structure_cache = {}
            rev._reverse = self
            self._reverse = rev
        return self._reverse

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
            raise ValueError("method: reordering needs the same vertex set on both sides, "
                             "this graph is bipartite")
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
        graph = GraphTensor(inverse[self.src], inverse[self.dst], n, n,
                            index_dtype=self.index_dtype, validate=False)
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
        frontier = by_degree[cursor:cursor + 1]
        order[frontier] = position
        position += 1
        while frontier.numel():
            counts = sym.rowptr[frontier + 1] - sym.rowptr[frontier]
            parents = torch.repeat_interleave(frontier, counts)
            starts = torch.repeat_interleave(sym.rowptr[frontier], counts)
            offsets = torch.arange(parents.numel(), device=device) - \
                torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
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


def validate_endpoints(src: Tensor, dst: Tensor, num_src: int, num_dst: int, extra: Sequence[Tensor] = ()
                       ) -> List[int]:
    """Check an edge list's endpoint tensors and their index ranges (``edge_index`` errors) in one
    device sync, which also reads the integer scalar tensors ``extra`` (in the index dtype, returned
    as ints): a caller that needs a count from the device pays no second sync."""
    for name, index, bound in (("src", src, num_src), ("dst", dst, num_dst)):
        if not isinstance(index, Tensor):
            raise TypeError(f"edge_index: {name} must be a tensor, got {type(index).__name__}")
        _check_index_dtype(index)
        if index.dim() != 1:
            raise ValueError(f"edge_index: {name} must be one-dimensional, got shape {list(index.shape)}")
    if src.numel() != dst.numel():
        raise ValueError(f"edge_index: src and dst differ in length ({src.numel()} vs {dst.numel()})")
    if src.device != dst.device:
        raise ValueError(f"edge_index: src and dst are on different devices ({src.device}, {dst.device})")
    if src.numel() == 0:
        return [int(t) for t in extra]
    # One device sync for all four bounds (a new mini-batch graph pays this every step).
    src_low, src_high = torch.aminmax(src)
    dst_low, dst_high = torch.aminmax(dst)
    scalars = [src_low, dst_low, src_high, dst_high] + [t.to(src_low.dtype) for t in extra]
    src_low, dst_low, src_high, dst_high, *values = torch.stack(scalars).tolist()
    low, high = [src_low, dst_low], [src_high, dst_high]
    if min(low) < 0:
        raise ValueError(f"edge_index: negative vertex index {min(low)}")
    if high[0] >= num_src:
        raise ValueError(f"edge_index: source index {high[0]} out of range for num_src={num_src}")
    if high[1] >= num_dst:
        raise ValueError(f"edge_index: destination index {high[1]} out of range for num_dst={num_dst}")
    return values


def as_graph(graph: Union["GraphTensor", Tensor], num_nodes: NumNodes = None) -> "GraphTensor":
    """Accept a GraphTensor as is, or build one from an edge index."""
    if isinstance(graph, GraphTensor):
        return graph
    return GraphTensor.from_edge_index(graph, num_nodes)


__all__: Sequence[str] = ["GraphTensor", "CSR", "GraphStats", "DegreeStats", "chunk_table", "split_rows",
                          "split_chunk_slots", "csr_stats", "derived_cache", "build_csr", "build_csr_pair",
                          "build_user_order_pair", "grouped", "in_user_order", "index_dtype_for", "as_graph",
                          "validate_endpoints", "version"]
