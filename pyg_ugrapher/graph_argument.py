r"""The graph argument of a drop-in layer, turned into a cached :class:`~pyg_ugrapher.GraphTensor`.

PyG layers take the graph as a ``[2, E]`` index tensor, a PyG ``EdgeIndex``, a ``torch.sparse``
adjacency ``adj_t`` (rows are destinations) or a ``torch_sparse.SparseTensor`` ``adj_t``. A
:class:`~pyg_ugrapher.GraphTensor` builds its CSR, CSC and statistics once; building one per forward
would redo that work every step. So everything derived from a graph argument is cached on that
argument object itself, weakly and by identity (:func:`derived`): a graph used by several layers, or
for many epochs, is prepared once, and the cache entry dies with the graph. An in-place change of the
graph's index tensors (their ``_version``) drops its entries. Shared by threads: ``docs/caches.md``.

A ``SparseTensor`` is read as the ``[2, nnz]`` edge index of its stored entries in its storage
order, with its sizes and values (:func:`sparse_tensor_graph`), and the layer then runs its
edge-index path: that keeps duplicate entries, as PyG's ``SparseTensor`` operators do (PyG's
self-loop helpers coalesce a ``torch.sparse`` adjacency), and compiles. The values are read
per layer as PyG's layer reads them: edge weights (``GCNConv``, ``GraphConv``), edge features where
they have more than one dimension (``GINEConv``, ``GATConv``), or not at all (``SAGEConv``,
``GINConv``).

Under ``torch.compile`` that Python-side cache cannot be traced. On a small graph
(:func:`traced_graph`) a layer's graph is its edges in the user's order, and its operators are the
reference executor's torch operations, which Inductor fuses: no custom op, nothing sorted or looked
up. On a larger graph a layer's graph is the output of a custom op (``pyg_ugrapher::layer_graph``
/ ``pyg_ugrapher::looped_graph``) that looks the same cache up at run time and returns the
structure arrays that
:func:`pyg_ugrapher.ops.graph_op` takes; the operators then go to ``graph_op`` directly, with their
serialised :class:`~pyg_ugrapher.OpInfo` a trace-time constant (:func:`op_text`). A compiled model
thus has no graph break, one graph serves every graph of a mini-batch loader (only tensors
change), and the structure of a graph seen before is not rebuilt. Removing stored self loops
keeps a data-dependent number of edges: the fake implementation gives it as an unbacked size,
which ``torch.compile`` traces with ``fullgraph=True`` and breaks the graph at otherwise (and
eager, counting them waits for the device). ``GCNConv``'s sums keep the stored loops at weight 0
instead (:func:`padded_looped_graph`), and ``GATConv``, ``GCNConv``'s other aggregations and
``GATv2Conv`` (on :func:`spare_row_index`) point them to a spare destination row
(:func:`spare_row_looped_graph`): fixed sizes, no break, no sync. Only a call with
``return_attention_weights=True``, which returns the looped index itself, and ``GATv2Conv`` on a
bipartite graph under ``flow="target_to_source"`` still remove them. Reading a ``SparseTensor``
(duck-typed, and cached in Python) is a graph break; the rest of the layer compiles as for an edge
index.

A ``torch.sparse`` adjacency cannot enter a compiled graph at all: Dynamo does not trace a frame
that reads a sparse tensor (even only to pass it on) but runs it eagerly as a whole, and still
compiles each function that frame calls on its own. A layer's eager path would then be compiled in
pieces (``GCNConv`` in up to ten graphs), or crash inside Dynamo where a piece gets a tensor that
views the adjacency (``SAGEConv``, ``GINConv``, ``GraphConv``, ``GATConv``). So a layer given one
runs its ``forward`` whole outside ``torch.compile`` (:func:`eager_with_torch_sparse`): exactly the
eager computation, graph and normalisation cached on the adjacency as in eager mode, its values
differentiable. (A model's ``forward`` that holds the adjacency runs eagerly for the same reason;
what it calls without the adjacency still compiles.) With ``fullgraph=True`` Dynamo refuses the
sparse tensor itself.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from functools import lru_cache, wraps
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Hashable,
    Iterator,
    List,
    Literal,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import add_remaining_self_loops, add_self_loops, to_edge_index
from torch_geometric.utils.loop import compute_loop_attr

from autotune import selection
from triton_kernels import self_loops
from triton_kernels.codegen import uses_triton

from . import ops, reference
from .graph import OP_TAGS, GraphTensor, validate_endpoints
from .ir import OpInfo
from .structure import (
    CSR,
    STRUCTURE_ARRAYS,
    EdgeList,
    GraphStructure,
    IdentityMap,
    checked,
    collecting,
    records_steps,
    version,
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_INT32_MAX = torch.iinfo(torch.int32).max

# graph argument -> (its version when the entries were built, {key: entry}). Entries must not hold
# the key itself (views of its tensors would): they are built from ``detach()``-ed aliases.
_DERIVED = IdentityMap()
# The same for entries built inside a CUDA graph capture (:func:`built_in_recording`): they live in
# the recording's memory pool and hold what its replays compute, so only captures read them.
_RECORDED = IdentityMap()

GATHERS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


# One list per open ``graphs_read_while_capturing`` block.
_CAPTURE_READERS: List[List[Union[Tensor, SparseTensor]]] = []
# One list per open ``graph_bounds_noted`` block.
_BOUND_LOGS: List[List[Tuple[Tensor, "GraphBounds"]]] = []


class GraphBounds(NamedTuple):
    """What a layer call requires of a ``[2, E]`` edge index: row ``src_row`` holds sources below
    ``num_src``, the other row destinations below ``num_dst``."""

    src_row: int
    num_src: int
    num_dst: int


def graphs_read_while_capturing() -> ContextManager[List[Union[Tensor, SparseTensor]]]:
    """Collect the graph arguments whose cached structures are read inside the block while a CUDA
    graph is being captured: the recording holds those structures, not the code that built them,
    so a replay is right only while these arguments keep their values (graphs that the capture
    builds itself, :func:`built_in_recording`, are not collected)."""
    return collecting(_CAPTURE_READERS)


def graph_bounds_noted() -> ContextManager[List[Tuple[Tensor, GraphBounds]]]:
    """Collect every ``[2, E]`` edge index a layer reads inside the block with its
    :class:`GraphBounds`: what :class:`~pyg_ugrapher.RecordedStep` checks a replayed graph against."""
    return collecting(_BOUND_LOGS)


def note_bounds(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> None:
    """Record a layer call's bounds on a dense edge index in every open :func:`graph_bounds_noted`."""
    if _BOUND_LOGS and type(edge_index) is Tensor and edge_index.layout == torch.strided:
        bounds = GraphBounds(endpoints(flow)[0], num_src, num_dst)
        for noted in _BOUND_LOGS:
            noted.append((edge_index, bounds))


def rebuilt_by_recordings(graph: object) -> bool:
    """Whether a CUDA graph that captures a layer call on ``graph`` builds its structures itself
    (:func:`built_in_recording`): a dense CUDA edge index of up to
    :data:`autotune.selection.SMALL_GRAPH_EDGES` edges."""
    return (
        isinstance(graph, Tensor)
        and graph.is_cuda
        and graph.layout == torch.strided
        and graph.size(-1) <= selection.SMALL_GRAPH_EDGES
    )


# Per thread (a capture is): whether the capture under way holds small graphs' structures.
_HOLDING = threading.local()


@contextmanager
def holding_graphs(hold: bool = True) -> Iterator[None]:
    """Inside the block, a CUDA graph capture reads the cached structures of every graph instead of
    building small ones itself (:func:`built_in_recording`), as for a large graph: its replays
    build nothing, and serve the graphs captured alone. For a first recording of a step, whose
    graphs may never change (:class:`~pyg_ugrapher.RecordedStep`)."""
    previous = getattr(_HOLDING, "value", False)
    _HOLDING.value = hold
    try:
        yield
    finally:
        _HOLDING.value = previous


def built_in_recording(graph: object) -> bool:
    """Whether ``graph``'s structures are built inside the CUDA graph being captured
    (:func:`rebuilt_by_recordings`, while its stream captures). Such a recording rebuilds them from
    the index at every replay, with fixed sizes, without a host sync, and picks the schedules of
    small graphs (which read no statistics), so one recording serves every graph of its sizes (a
    mini-batch loader's, padded to a few sizes). The indices are not checked there (that would
    wait for the GPU): :class:`~pyg_ugrapher.RecordedStep` checks and clamps them inside its
    recordings. A larger graph's structures, and every graph's inside :func:`holding_graphs`, are
    built outside and read from the cache: a recording holds them, and serves that graph alone."""
    return (
        rebuilt_by_recordings(graph)
        and torch.cuda.is_current_stream_capturing()
        and not getattr(_HOLDING, "value", False)
    )


def _version(graph: Union[Tensor, SparseTensor]) -> Hashable:
    if isinstance(graph, Tensor):
        try:
            return graph._version
        except RuntimeError:  # an inference tensor: see structure.version
            return None
    row, col, _ = graph.coo()
    return version(row), version(col)


def derived(graph: Union[Tensor, SparseTensor], key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, cached on ``graph`` (a tensor, or a ``SparseTensor`` and its index tensors) under
    ``key`` until ``graph`` dies or changes in place. Inside a capture that builds ``graph``'s
    structures (:func:`built_in_recording`), ``build()`` is recorded and its entries kept apart."""
    # A CPU graph is never captured: the common case asks nothing more.
    recording = isinstance(graph, Tensor) and graph.is_cuda and built_in_recording(graph)
    if not recording and _CAPTURE_READERS and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        for read in _CAPTURE_READERS:
            read.append(graph)
    cache = _RECORDED if recording else _DERIVED
    version = _version(graph)
    slot = cache.get(graph)
    if slot is None or slot[0] != version:
        slot = (version, {})
        cache[graph] = slot
    entries = slot[1]
    if key not in entries:
        # Entries are constants of the graph: built outside autograd, and never as inference
        # tensors, which a later training step could not save for its backward pass.
        with torch.inference_mode(False), torch.no_grad():
            entries[key] = build()
    return entries[key]


def gather_op(aggr: object) -> str:
    """The IR gather op of a PyG ``aggr`` string."""
    if not isinstance(aggr, str) or aggr not in GATHERS:
        raise ValueError(
            f"aggr: expected one of {sorted(GATHERS)}, got {aggr!r} (aggregation "
            f"modules and lists of aggregations are not supported)"
        )
    return GATHERS[aggr]


def check_features(name: str, x: object, static: bool = False) -> Tensor:
    """A ``[N, F]`` floating-point node or edge feature matrix; with ``static``, also a static
    graph's ``[B, N, F]`` batch of feature matrices (see :func:`nodes_first`)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name}: expected floating-point features, got {x.dtype}")
    if static and x.ndim not in (2, 3):
        raise ValueError(
            f"{name}: expected shape [num_nodes, channels] or [batch, num_nodes, channels], got {list(x.shape)}"
        )
    if not static and x.ndim != 2:
        raise ValueError(
            f"{name}: expected shape [num_nodes, channels], got {list(x.shape)} "
            f"(static graphs with a batch dimension are not supported by this layer)"
        )
    return x


def nodes_first(x: Tensor) -> Tensor:
    """Node features with the nodes in front: a static graph's ``[B, N, F]`` (one graph, ``B``
    feature matrices, as PyG's ``node_dim=-2`` reads them) as an ``[N, B, F]`` view, whose batch
    the IR reads as heads; an ``[N, F]`` matrix as it is."""
    return x.transpose(0, 1) if x.dim() == 3 else x


def batch_first(out: Tensor, static: bool) -> Tensor:
    """The inverse of :func:`nodes_first` for a static graph's ``[N, B, F]`` output."""
    return out.transpose(0, 1) if static else out


#: The layouts of a ``torch.sparse`` adjacency (PyG's ``is_torch_sparse_tensor``).
_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)


def is_sparse(edge_index: object) -> bool:
    """Whether ``edge_index`` is a ``torch.sparse`` adjacency (PyG's ``is_torch_sparse_tensor``,
    its layouts compared here: this runs several times per layer call)."""
    return isinstance(edge_index, Tensor) and edge_index.layout in _SPARSE_LAYOUTS


def eager_with_torch_sparse(forward: F) -> F:
    """A layer's ``forward``, run whole outside ``torch.compile`` (:func:`torch.compiler.disable`)
    when its graph argument is a ``torch.sparse`` adjacency: exactly as in eager mode, graph and
    normalisation cached on the adjacency, its values differentiable (see the module docstring).
    Any other graph argument calls ``forward`` itself, which ``torch.compile`` traces."""
    eager = torch.compiler.disable(forward)

    @wraps(forward)
    def dispatch(self: MessagePassing, x: Any, edge_index: Any, *args: Any, **kwargs: Any) -> Any:
        return (eager if is_sparse(edge_index) else forward)(self, x, edge_index, *args, **kwargs)

    return cast(F, dispatch)


def endpoints(flow: str) -> Tuple[int, int]:
    """Rows ``(j, i)`` of an edge index holding the sources and the destinations of messages."""
    return (0, 1) if flow == "source_to_target" else (1, 0)


def unequal_sides_under_target_to_source(
    flow: str, x: object, size: Optional[Tuple[Optional[int], Optional[int]]] = None
) -> bool:
    """Whether a call under ``flow="target_to_source"`` has sides of different sizes (a pair of node
    features, or ``size``). The ``propagate()`` PyG generates for the attention layers then reads
    ``x_j`` from ``x[0]`` and ``x_i`` from ``x[1]`` but sizes the output by ``x[0]``, so the
    receivers' features and the output have different rows: no graph of the layers' kernels has
    those sizes, and they run PyG's layer there (:func:`~pyg_ugrapher.nn.twins.pyg_twin`)."""
    if flow != "target_to_source":
        return False
    if size is not None and None not in size and size[0] != size[1]:
        return True
    return (
        isinstance(x, (tuple, list))
        and len(x) == 2
        and isinstance(x[0], Tensor)
        and isinstance(x[1], Tensor)
        and x[0].shape[0] != x[1].shape[0]
    )


def node_sizes(
    layer, edge_index: Tensor, size: Optional[Tuple[int, int]], x_src: Optional[Tensor], x_dst: Optional[Tensor]
) -> Tuple[int, int]:
    """``(num_src, num_dst)`` as PyG's ``propagate`` infers them: from ``size``, an ``EdgeIndex``'s
    or sparse tensor's own size, and the node features, which must agree."""
    sparse = check_graph(layer, edge_index)
    j, i = endpoints(layer.flow)
    sizes: List[Optional[int]]
    if sparse:
        sizes = [edge_index.shape[1], edge_index.shape[0]]
    elif isinstance(edge_index, EdgeIndex):
        sizes = list(edge_index.sparse_size())
    elif size is not None:
        if len(size) != 2:
            raise ValueError(f"size: expected (num_src_nodes, num_dst_nodes), got {size}")
        sizes = list(size)
    else:
        sizes = [None, None]
    for dim, x in ((j, x_src), (i, x_dst)):
        if x is None:
            continue
        if sizes[dim] is None:
            sizes[dim] = x.shape[0]
        elif sizes[dim] != x.shape[0]:
            raise ValueError(
                f"size: the graph has {sizes[dim]} {'source' if dim == j else 'destination'} "
                f"nodes but the node features have {x.shape[0]} rows"
            )
    num_src = sizes[j] if sizes[j] is not None else sizes[i]
    num_dst = sizes[i] if sizes[i] is not None else sizes[j]
    if num_src is None or num_dst is None:
        raise ValueError("size: cannot infer the number of nodes; pass size=(num_src, num_dst)")
    num_src, num_dst = int(num_src), int(num_dst)
    if _BOUND_LOGS:
        note_bounds(edge_index, layer.flow, num_src, num_dst)
    return num_src, num_dst


def check_graph(layer, edge_index: object) -> bool:
    """Check a layer's graph argument (a tensor: an edge index or a ``torch.sparse`` adjacency);
    whether it is the adjacency."""
    if not isinstance(edge_index, Tensor):
        raise TypeError(
            f"edge_index: expected a [2, E] tensor, an EdgeIndex, a torch.sparse adjacency or a "
            f"SparseTensor, got {type(edge_index).__name__}"
        )
    if is_sparse(edge_index):
        if edge_index.dim() != 2:
            raise ValueError(
                f"edge_index: a sparse adjacency must be two-dimensional, got {edge_index.dim()} dimensions"
            )
        if layer.flow != "source_to_target":
            raise ValueError(
                "edge_index: flow='target_to_source' needs an edge index; for a "
                "sparse adjacency pass its transpose instead"
            )
        return True
    dtype = edge_index.dtype
    if dtype.is_floating_point or dtype == torch.bool or dtype.is_complex:
        raise TypeError(f"edge_index: expected integer indices, got {dtype}")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index: expected shape [2, E], got {list(edge_index.shape)}")
    return False


#: How a layer reads a SparseTensor's values (see :func:`sparse_tensor_graph`).
SparseValues = Literal["weights", "features", "ignored"]


def sparse_tensor_graph(
    layer: MessagePassing,
    edge_index: Union[Tensor, SparseTensor],
    size: Optional[Tuple[int, int]],
    per_edge: Optional[Tensor] = None,
    values: SparseValues = "ignored",
    remove_loops: bool = False,
) -> Tuple[Tensor, Optional[Tuple[int, int]], Optional[Tensor]]:
    """``(edge_index, size, per_edge)``, where a ``torch_sparse.SparseTensor`` ``edge_index`` (``adj_t``,
    rows are destinations) becomes the ``[2, nnz]`` index of its stored entries (sources first, in
    its storage order, duplicates kept; cached on it), its sizes ``(num_src, num_dst)`` (PyG does not
    read ``size`` for one) and the per-edge tensor of the layer, from its values as the layer's PyG
    namesake reads them:

    * ``"weights"``: the edge weights are the values (``None`` without); ``per_edge`` must be
      ``None``, as with a ``torch.sparse`` adjacency;
    * ``"features"``: ``per_edge`` (edge features in its storage order), or else its values where
      they have more than one dimension (PyG's ``propagate`` collects those as ``edge_attr``);
    * ``"ignored"``: ``per_edge`` as it is.

    ``remove_loops`` leaves out the stored diagonal, values included. Any other graph argument
    passes through unchanged."""
    if not isinstance(edge_index, SparseTensor):
        return edge_index, size, per_edge
    return _read_sparse_tensor(layer.flow, edge_index, per_edge, values, remove_loops)


@torch.compiler.disable
def _read_sparse_tensor(
    flow: str, adj_t: SparseTensor, per_edge: Optional[Tensor], values: SparseValues, remove_loops: bool
) -> Tuple[Tensor, Tuple[int, int], Optional[Tensor]]:
    """:func:`sparse_tensor_graph` of a ``SparseTensor``: eager, as ``torch.compile`` cannot trace its
    cache or the duck-typed reads (a graph break, after which the layer compiles as for an edge
    index)."""
    if flow != "source_to_target":
        raise ValueError(
            "edge_index: flow='target_to_source' needs an edge index; for a SparseTensor adj_t "
            "pass its transpose instead"
        )
    row, col, value = adj_t.coo()
    for name, index in (("row", row), ("col", col)):
        if (
            not isinstance(index, Tensor)
            or index.is_floating_point()
            or index.is_complex()
            or index.dtype == torch.bool
        ):
            what = index.dtype if isinstance(index, Tensor) else type(index).__name__
            raise TypeError(f"edge_index: expected a SparseTensor with integer {name} indices, got {what}")
        if index.dim() != 1:
            raise ValueError(
                f"edge_index: expected a SparseTensor with one {name} index per stored entry, "
                f"got shape {list(index.shape)}"
            )
    num_entries = row.numel()
    if col.numel() != num_entries:
        raise ValueError(
            f"edge_index: a SparseTensor's row and col indices differ in length ({num_entries} and {col.numel()})"
        )
    if value is not None and (not isinstance(value, Tensor) or value.dim() == 0 or value.size(0) != num_entries):
        raise ValueError(
            f"edge_index: a SparseTensor's values must have one row per stored entry "
            f"({num_entries}), got {list(value.shape) if isinstance(value, Tensor) else value!r}"
        )
    index, kept = derived(adj_t, ("index", remove_loops), lambda: _sparse_tensor_index(row, col, remove_loops))
    if value is not None and kept is not None:
        value = value.index_select(0, kept)
    if values == "weights":
        if per_edge is not None:
            raise ValueError(
                "edge_weight: a SparseTensor carries its edge weights as its values; pass edge_weight=None"
            )
        if value is not None and not value.is_floating_point():
            raise TypeError(
                f"edge_index: a SparseTensor's values are this layer's edge weights: expected "
                f"floating-point values, got {value.dtype}"
            )
        if value is not None and value.dim() != 1:
            raise ValueError(
                f"edge_index: a SparseTensor's values are this layer's edge weights: expected "
                f"one per stored entry, shape [nnz], got {list(value.shape)}"
            )
        per_edge = value
    elif values == "features" and per_edge is None and value is not None and value.dim() > 1:
        per_edge = value
    return index, (int(adj_t.size(1)), int(adj_t.size(0))), per_edge


def _sparse_tensor_index(row: Tensor, col: Tensor, remove_loops: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """The ``[2, nnz]`` int64 index of a SparseTensor's entries, sources first, and the ids of the
    entries kept (``None``: all)."""
    index = torch.stack([col.detach(), row.detach()]).long()
    if not remove_loops:
        return index, None
    kept = (index[0] != index[1]).nonzero().view(-1)
    return index[:, kept], kept


def plain_index(edge_index: Tensor) -> Tensor:
    """A ``[2, E]`` int64 alias of an edge index that holds no reference to it (see :data:`_DERIVED`)."""
    if isinstance(edge_index, EdgeIndex):
        edge_index = edge_index.as_tensor()
    return edge_index.detach().long()


def sparse_edges(adj_t: Tensor) -> Tuple[Tensor, Tensor]:
    """``(edge_index, values)`` of a sparse adjacency, row 0 = sources, in its stored order.

    An uncoalesced COO tensor is coalesced first, as PyG's ``spmm`` does when it converts it to
    CSR: duplicate entries are one edge whose value is their sum.
    """
    if adj_t.layout != torch.sparse_coo:
        index, values = to_edge_index(adj_t)
        return index.flip(0), values
    # Not PyG's to_edge_index: it flags the adjacency coalesced in place (``_coalesced_``), which
    # changed the caller's tensor and has no derivative, so its values got no gradient.
    if not adj_t.is_coalesced():
        adj_t = adj_t.coalesce()
    return adj_t.indices().flip(0), adj_t.values()


def graph_of(edge_index: Tensor, flow: str, num_src: int, num_dst: int, validate: bool = True) -> GraphTensor:
    """A GraphTensor of a plain ``[2, E]`` int64 index (not cached: callers cache); ``validate=False``
    for an index whose range the caller checked."""
    j, i = endpoints(flow)
    return GraphTensor(edge_index[j], edge_index[i], num_src, num_dst, validate=validate)


class Graph(NamedTuple):
    """The graph of one layer call: a cached :class:`GraphTensor` in eager mode (so that
    :func:`pyg_ugrapher.compute` validates and ``ug.plan`` observes every op), or, under
    ``torch.compile``, the structure a custom op returned (see the module docstring), or a small
    graph's edges (:func:`traced_graph`)."""

    tensor: Optional[GraphTensor]
    structure: Optional[GraphStructure]
    num_edges: int
    #: One destination row more than the layer's nodes (:func:`spare_row_looped_graph`): the layer
    #: gives destination operands a spare row and drops the output's.
    spare_row: bool = False
    edges: Optional[EdgeList] = None


class Looped(NamedTuple):
    """A graph whose stored self loops were replaced by one loop per node below ``num_loops``:
    the input's other edges in order, then the loops (PyG's ``add_remaining_self_loops``)."""

    graph: Graph
    kept: Tensor  #: ``[E']`` ids of the input edges that are kept, in order
    index: Tensor  #: ``[2, E' + num_loops]`` the looped edge index, as PyG returns it


def _looped(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int
) -> Tuple[GraphTensor, Tensor, Tensor]:
    index = plain_index(edge_index)
    is_loop = index[0] == index[1]
    j, i = endpoints(flow)
    if num_loops > min(num_src, num_dst):
        raise ValueError(
            f"size: {num_loops} self loops need as many source and destination nodes, got {num_src} and {num_dst}"
        )
    facts = checked(edge_index, num_src, num_dst)
    if facts is not None:  # a sampler's batch: its bounds and stored loops are known
        stored = facts.self_loops
    else:
        # One device sync for the index's bounds and its count of stored loops: with two
        # nonzero() calls and the graph's own check, a new mini-batch graph waited three times.
        (stored,) = validate_endpoints(index[j], index[i], num_src, num_dst, [is_loop.sum()])
    kept = torch.nonzero_static(~is_loop, size=index.size(1) - stored).view(-1)
    added = torch.arange(num_loops, device=index.device).repeat(2, 1)
    looped = torch.cat([index[:, kept], added], dim=1)
    return graph_of(looped, flow, num_src, num_dst, validate=False), kept, looped


#: Compiled layer calls on an index of at most this many edges run their operators as traced
#: torch operations (:func:`traced_graph`): up to here a compiled training step is bound by the host.
TRACED_GRAPH_EDGES = 1 << 20


def traced_graph(num_edges: int) -> bool:
    """Whether a layer call on an index of ``num_edges`` edges (self loops the layer adds not
    counted, so that the layers of one model decide alike) runs its graph operators as torch
    operations that ``torch.compile`` traces and fuses, as it does PyG's gathers and scatters (the
    reference executor's, on the graph's :class:`~pyg_ugrapher.structure.EdgeList`): compiled, up
    to :data:`TRACED_GRAPH_EDGES` edges. There a compiled step's time is the host's; a custom op's
    dispatch, and the structure that its kernels read (a sort, a lookup of the index's cache), cost
    more host time than Inductor's fused kernels take GPU time, and a new mini-batch graph needs
    neither. Larger graphs keep the custom ops and their schedules. The index is not checked
    against the node counts here (a check waits for the device): an index out of range fails in the
    gather, on a GPU as a device-side assertion, as in PyG's compiled layers. Under
    ``dynamic=True`` the edge count is guarded: a larger graph recompiles once."""
    return torch.compiler.is_compiling() and num_edges <= TRACED_GRAPH_EDGES


def _edge_list(index: Tensor, flow: str, num_src: int, num_dst: int) -> EdgeList:
    j, i = endpoints(flow)
    return EdgeList(index[j], index[i], num_src, num_dst)


def _cached(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> GraphTensor:
    # An index whose bounds its sampler recorded is not checked again (a wait for the device);
    # the graph is rebuilt, and checked, if the index changes in place.
    return derived(
        edge_index,
        ("graph", flow, num_src, num_dst),
        lambda: graph_of(
            plain_index(edge_index), flow, num_src, num_dst, validate=checked(edge_index, num_src, num_dst) is None
        ),
    )


def _cached_looped(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int
) -> Tuple[GraphTensor, Tensor, Tensor]:
    return derived(
        edge_index,
        ("looped", flow, num_src, num_dst, num_loops),
        lambda: _looped(edge_index, flow, num_src, num_dst, num_loops),
    )


def _unaliased(tensors: Sequence[Tensor], edge_index: Tensor) -> List[Tensor]:
    """A custom op's outputs may not alias its input: copy the arrays that share its storage
    (int64 endpoints are views of the index)."""
    storage = edge_index.untyped_storage().data_ptr()
    return [t.clone() if t.numel() and t.untyped_storage().data_ptr() == storage else t for t in tensors]


@torch.library.custom_op("pyg_ugrapher::layer_graph", mutates_args=(), tags=OP_TAGS)
def _layer_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> List[Tensor]:
    """The structure arrays of the graph of ``edge_index``, from (or into) its cache."""
    graph = _cached(edge_index, flow, num_src, num_dst)
    return _unaliased(graph.structure(edge_index.device, sort=True).flat(), edge_index)


def _structure_like(edge_index: Tensor, num_src: int, num_dst: int, num_edges: int, bound: int) -> List[Tensor]:
    """Empty tensors shaped as :meth:`GraphTensor.structure` of ``num_edges`` edges, at most
    ``bound``, flattened (for fake implementations: the index dtype depends on the sizes)."""
    # index_dtype_for(max(num_src, num_dst), bound), without max(): on symbolic sizes that would
    # guard on which side is larger, and recompile when a batch has more nodes than edges.
    fits = all(size <= _INT32_MAX for size in (num_src, num_dst, bound))
    dtype = torch.int32 if fits else torch.int64
    new = lambda *shape: edge_index.new_empty(shape, dtype=dtype)  # noqa: E731
    csr = CSR(new(num_dst + 1), new(num_edges), new(num_edges), new(num_edges), num_src)
    csc = CSR(new(num_src + 1), new(num_edges), new(num_edges), new(num_edges), num_dst)
    return GraphStructure(csr, csc, new(num_edges), new(num_edges)).flat()


@_layer_graph.register_fake
def _(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> List[Tensor]:
    return _structure_like(edge_index, num_src, num_dst, edge_index.size(1), edge_index.size(1))


@torch.library.custom_op("pyg_ugrapher::looped_graph", mutates_args=(), tags=OP_TAGS)
def _looped_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> List[Tensor]:
    """The structure arrays of the looped graph (see :class:`Looped`), then its kept edge ids and
    edge index."""
    graph, *extra = _cached_looped(edge_index, flow, num_src, num_dst, num_loops)
    return _unaliased(graph.structure(edge_index.device, sort=True).flat() + extra, edge_index)


@_looped_graph.register_fake
def _(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> List[Tensor]:
    ctx = torch.library.get_ctx()
    num_kept = ctx.new_dynamic_size()
    structure = _structure_like(edge_index, num_src, num_dst, num_kept + num_loops, edge_index.size(1) + num_loops)
    ids = lambda size: edge_index.new_empty(size, dtype=torch.long)  # noqa: E731
    return structure + [ids(num_kept), ids((2, num_kept + num_loops))]


def _kernel_input(edge_index: Tensor) -> Optional[Tensor]:
    """``edge_index`` as a plain tensor where a kernel of :mod:`triton_kernels.self_loops` writes
    its looped index (kernels run, and not under ``torch.compile``, which traces the torch
    operations instead); ``None`` elsewhere."""
    if not uses_triton(edge_index.device) or torch.compiler.is_compiling():
        return None
    return edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index


def _spare_row_index(
    edge_index: Tensor, flow: str, num_dst: int, num_loops: int, spare_src_row_of: Optional[int] = None
) -> Tensor:
    """The ``[2, E + num_loops]`` index of :func:`spare_row_looped_graph`'s graph. With
    ``spare_src_row_of`` (the sources' count, for a caller that gives the sources a spare row as
    well), a source out of range moves one further too. Where kernels run, outside
    ``torch.compile`` (which traces the torch operations), one kernel writes it
    (:func:`triton_kernels.self_loops.spare_row_index`)."""
    j, i = endpoints(flow)
    written = _kernel_input(edge_index)
    if written is not None:
        return self_loops.spare_row_index(written, i, num_dst, num_loops, spare_src_row_of)
    index = plain_index(edge_index)
    routed = index.clone()
    dst = index[i]
    # A destination out of range moves one further, out of the graph's ``num_dst + 1`` rows too:
    # the spare row takes self loops only, and the graph's range check still fails on the index.
    routed[i] = torch.where(index[0] == index[1], num_dst, dst + (dst >= num_dst).to(dst.dtype))
    if spare_src_row_of is not None:
        src = index[j]
        routed[j] = src + (src >= spare_src_row_of).to(src.dtype)
    loops = torch.arange(num_loops, device=index.device).repeat(2, 1)
    return torch.cat([routed, loops], dim=1)


def spare_row_index(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int, spare_src_row: bool = False
) -> Tensor:
    """The ``[2, E + num_loops]`` edge index of :func:`spare_row_looped_graph`'s graph, cached on
    ``edge_index``: for a layer that runs PyG's ``message()`` on an index (GATv2), whose graph
    structure is then cached on this one. Checked as :func:`_checked_spare_row_index` says.
    ``spare_src_row``: the layer gives the sources a spare row too, so a source index out of range
    moves one further, past it (else that row, read as a source, would take it in). Under
    ``torch.compile``, the custom op ``pyg_ugrapher::spare_row_index`` returns the cached index, so
    that the structure of its graph, cached on it, is found at every call."""
    if torch.compiler.is_compiling():
        return _compiled_spare_row_index(edge_index, flow, num_src, num_dst, num_loops, spare_src_row)
    return _cached_spare_row_index(edge_index, flow, num_src, num_dst, num_loops, spare_src_row)


def _cached_spare_row_index(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int, spare_src_row: bool
) -> Tensor:
    return derived(
        edge_index,
        ("spare_row_index", flow, num_src, num_dst, num_loops, spare_src_row),
        lambda: _checked_spare_row_index(edge_index, flow, num_src, num_dst, num_loops, spare_src_row),
    )


@torch.library.custom_op("pyg_ugrapher::spare_row_index", mutates_args=(), tags=OP_TAGS)
def _compiled_spare_row_index(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int, spare_src_row: bool
) -> Tensor:
    """:func:`spare_row_index` from (or into) its cache."""
    (index,) = _unaliased(
        [_cached_spare_row_index(edge_index, flow, num_src, num_dst, num_loops, spare_src_row)], edge_index
    )
    return index


@_compiled_spare_row_index.register_fake
def _(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int, spare_src_row: bool) -> Tensor:
    return edge_index.new_empty((2, edge_index.size(1) + num_loops))


def _checked_spare_row_index(
    edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int, spare_src_row: bool = False
) -> Tensor:
    """:func:`_spare_row_index`, a host index checked first, at once and in the caller's numbers
    (the graph of the result has a destination row more); a GPU index is left to its graph's range
    check, which waits for nothing, and a sampler's batch was checked (see :func:`_cached`)."""
    if not edge_index.is_cuda and checked(edge_index, num_src, num_dst) is None:
        j, i = endpoints(flow)
        index = plain_index(edge_index)
        validate_endpoints(index[j], index[i], num_src, num_dst)
    return _spare_row_index(edge_index, flow, num_dst, num_loops, num_src if spare_src_row else None)


class SpareRowGraphTensor(GraphTensor):
    """The :class:`~pyg_ugrapher.graph.GraphTensor` of :func:`spare_row_looped_graph`: a destination
    row more than the index it is made of has, whose range errors name that index's numbers
    (:attr:`~pyg_ugrapher.graph.GraphTensor.added_dst_rows`), where :func:`_spare_row_index` moved
    each destination out of range one row further."""

    added_dst_rows = 1


def spare_row_graph(routed: Tensor, flow: str, num_src: int, num_dst: int, validate: bool = True) -> GraphTensor:
    """The graph of the index ``routed`` made by :func:`_spare_row_index` of an index of ``num_src``
    and ``num_dst`` nodes: ``num_dst + 1`` destination rows."""
    j, i = endpoints(flow)
    return SpareRowGraphTensor(routed[j], routed[i], num_src, num_dst + 1, validate=validate)


def _spare_row_looped(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> GraphTensor:
    return spare_row_graph(
        _checked_spare_row_index(edge_index, flow, num_src, num_dst, num_loops),
        flow,
        num_src,
        num_dst,
        validate=edge_index.is_cuda and checked(edge_index, num_src, num_dst) is None,
    )


def _cached_spare_row(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> GraphTensor:
    return derived(
        edge_index,
        ("spare_row", flow, num_src, num_dst, num_loops),
        lambda: _spare_row_looped(edge_index, flow, num_src, num_dst, num_loops),
    )


@torch.library.custom_op("pyg_ugrapher::spare_row_looped_graph", mutates_args=(), tags=OP_TAGS)
def _spare_row_looped_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> List[Tensor]:
    """The structure arrays of :func:`spare_row_looped_graph`, from (or into) its cache."""
    graph = _cached_spare_row(edge_index, flow, num_src, num_dst, num_loops)
    return _unaliased(graph.structure(edge_index.device, sort=True).flat(), edge_index)


@_spare_row_looped_graph.register_fake
def _(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> List[Tensor]:
    num_edges = edge_index.size(1) + num_loops
    return _structure_like(edge_index, num_src, num_dst + 1, num_edges, num_edges)


def spare_row_looped_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> Graph:
    """:func:`looped_graph`'s graph with fixed sizes: ``E + num_loops`` edges into ``num_dst + 1``
    destination rows. Each stored self loop keeps its place but points to the spare last row, the
    other edges keep theirs, then come the loops of the nodes below ``num_loops``. Every real row
    gathers exactly the edges it has in :func:`looped_graph`'s graph, in the same order, whatever
    the gather; the caller gives destination operands a spare row and drops the output's
    (:attr:`Graph.spare_row`).

    Nothing here waits for the device: :func:`looped_graph` counts the stored loops on the host,
    one synchronisation per new graph (a mini-batch's every step), and under ``torch.compile``
    without ``fullgraph`` a graph break at the op whose output size depends on that count. Compiled,
    the graph is the custom op's structure arrays, or on a small graph its edges
    (:func:`traced_graph`); eager, the cached :class:`~pyg_ugrapher.graph.GraphTensor`."""
    num_edges = edge_index.size(1) + num_loops
    if traced_graph(edge_index.size(1)):
        edges = _edge_list(_spare_row_index(edge_index, flow, num_dst, num_loops), flow, num_src, num_dst + 1)
        return Graph(None, None, num_edges, True, edges)
    if torch.compiler.is_compiling():
        arrays = _spare_row_looped_graph(edge_index, flow, num_src, num_dst, num_loops)
        return Graph(None, GraphStructure.from_flat(arrays, user_order=False), num_edges, True)
    return Graph(_cached_spare_row(edge_index, flow, num_src, num_dst, num_loops), None, num_edges, True)


def spare_row_loop_attr(edge_index: Tensor, edge_attr: Tensor, num_loops: int, fill_value: object) -> Tensor:
    """The edge features of :func:`spare_row_looped_graph`'s graph: ``edge_attr`` in place (a stored
    loop's row is read by the spare row alone), then each added loop's, from ``fill_value`` as
    PyG's ``add_self_loops`` computes them after ``remove_self_loops``: the stored loops scatter to
    a spare slot, which is dropped."""
    index = plain_index(edge_index)
    routed = torch.stack([index[0], torch.where(index[0] == index[1], num_loops, index[1])])
    loop_attr = compute_loop_attr(routed, edge_attr, num_loops + 1, False, fill_value)[:num_loops]
    return torch.cat([edge_attr, loop_attr], dim=0)


def graph_with_loops(edge_index: Tensor, flow: str, num_nodes: int) -> GraphTensor:
    """A GraphTensor of an index with a self loop added to each of its ``num_nodes`` nodes after
    its edges, stored loops kept (not cached: callers cache)."""
    unchecked = checked(edge_index, num_nodes, num_nodes) is None  # a sampler's batch is checked
    return graph_of(_looped_index(edge_index, num_nodes), flow, num_nodes, num_nodes, validate=unchecked)


def _looped_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """The ``[2, E + num_nodes]`` index of :func:`graph_with_loops`: a self loop per node after the
    edges; where kernels run, outside ``torch.compile``, written by one kernel
    (:func:`triton_kernels.self_loops.looped_index`)."""
    written = _kernel_input(edge_index)
    if written is not None:
        return self_loops.looped_index(written, num_nodes)
    loops = torch.arange(num_nodes, device=edge_index.device).repeat(2, 1)
    return torch.cat([plain_index(edge_index), loops], dim=1)


def _cached_padded(edge_index: Tensor, flow: str, num_nodes: int) -> GraphTensor:
    return derived(edge_index, ("padded", flow, num_nodes), lambda: graph_with_loops(edge_index, flow, num_nodes))


@torch.library.custom_op("pyg_ugrapher::padded_looped_graph", mutates_args=(), tags=OP_TAGS)
def _padded_looped_graph(edge_index: Tensor, flow: str, num_nodes: int) -> List[Tensor]:
    """The structure arrays of :func:`padded_looped_graph`, from (or into) its cache."""
    structure = _cached_padded(edge_index, flow, num_nodes).structure(edge_index.device, sort=True)
    return _unaliased(structure.flat(), edge_index)


@_padded_looped_graph.register_fake
def _(edge_index: Tensor, flow: str, num_nodes: int) -> List[Tensor]:
    num_edges = edge_index.size(1) + num_nodes
    return _structure_like(edge_index, num_nodes, num_nodes, num_edges, num_edges)


def padded_looped_graph(edge_index: Tensor, flow: str, num_nodes: int) -> Graph:
    """The graph of a ``[2, E]`` index with a self loop added to each of its ``num_nodes`` nodes
    after its edges, stored self loops kept (``E + num_nodes`` edges). A layer that sums weighted
    messages gives the stored loops weight 0 and gets :func:`looped_graph`'s result; unlike that
    graph's, this one's size depends on shapes alone, so a compiled layer keeps one graph
    (``torch.compile`` without ``fullgraph`` breaks the graph at an op whose output size depends on
    the data)."""
    num_edges = edge_index.size(1) + num_nodes
    if traced_graph(edge_index.size(1)):
        return Graph(
            None, None, num_edges, edges=_edge_list(_looped_index(edge_index, num_nodes), flow, num_nodes, num_nodes)
        )
    if torch.compiler.is_compiling():
        arrays = _padded_looped_graph(edge_index, flow, num_nodes)
        return Graph(None, GraphStructure.from_flat(arrays, user_order=False), num_edges)
    return Graph(_cached_padded(edge_index, flow, num_nodes), None, num_edges)


def layer_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> Graph:
    """The graph of a ``[2, E]`` index (or ``EdgeIndex``) for one layer call; compiled, a small
    graph's edges as they are (:func:`traced_graph`)."""
    if traced_graph(edge_index.size(1)):
        return Graph(None, None, edge_index.size(1), edges=_edge_list(plain_index(edge_index), flow, num_src, num_dst))
    if torch.compiler.is_compiling():
        return Graph(None, layer_structure(edge_index, flow, num_src, num_dst), edge_index.size(1))
    graph = _cached(edge_index, flow, num_src, num_dst)
    return Graph(graph, None, graph.src.shape[0])


def layer_structure(edge_index: Tensor, flow: str, num_src: int, num_dst: int) -> GraphStructure:
    """Under ``torch.compile``, the structure of a ``[2, E]`` index's graph that the custom op
    ``pyg_ugrapher::layer_graph`` returns, whatever the graph's size."""
    # The index itself, not an alias made in the graph: the op finds its cache by identity.
    arrays = _layer_graph(edge_index, flow, num_src, num_dst)
    return GraphStructure.from_flat(arrays, user_order=False)


def looped_graph(edge_index: Tensor, flow: str, num_src: int, num_dst: int, num_loops: int) -> Looped:
    """The graph of a ``[2, E]`` index with its self loops replaced (see :class:`Looped`)."""
    if torch.compiler.is_compiling():
        arrays = _looped_graph(edge_index, flow, num_src, num_dst, num_loops)
        structure = GraphStructure.from_flat(arrays[:STRUCTURE_ARRAYS], user_order=False)
        return Looped(Graph(None, structure, structure.num_edges), *arrays[STRUCTURE_ARRAYS:])
    graph, kept, index = _cached_looped(edge_index, flow, num_src, num_dst, num_loops)
    return Looped(Graph(graph, None, graph.num_edges), kept, index)


def looped_edge_attr(looped: Looped, edge_attr: Tensor, num_loops: int, fill_value: object) -> Tensor:
    """The edge features of :func:`looped_graph`'s graph, as PyG's ``remove_self_loops`` followed
    by ``add_self_loops(fill_value=...)`` gives them: the kept edges' features, then each loop's,
    computed by PyG's own helper."""
    kept = edge_attr.index_select(0, looped.kept)
    loop_attr = compute_loop_attr(looped.index[:, : kept.size(0)], kept, num_loops, False, fill_value)
    return torch.cat([kept, loop_attr], dim=0)


def adjacency(layer, edge_index: Tensor, num_src: int, num_dst: int) -> Tuple[Graph, Optional[Tensor]]:
    """The cached graph of a layer's graph argument, and a sparse adjacency's values (per call, so
    that they stay differentiable; ``None`` for an edge index)."""
    if is_sparse(edge_index):
        index, values = sparse_edges(edge_index)
        graph = derived(
            edge_index, ("graph", num_src, num_dst), lambda: graph_of(index, "source_to_target", num_src, num_dst)
        )
        return Graph(graph, None, graph.num_edges), values
    return layer_graph(edge_index, layer.flow, num_src, num_dst), None


# -- running operators --------------------------------------------------------------------------
@lru_cache(maxsize=1024)
def layer_op(build: Callable[..., OpInfo], *args: Hashable) -> OpInfo:
    """``build(*args)``, once per argument tuple."""
    return build(*args)


@lru_cache(maxsize=1024)
def _layer_op_and_text(build: Callable[..., OpInfo], args: Tuple[Hashable, ...]) -> Tuple[OpInfo, str]:
    """``build(*args)`` and its serialisation, once per argument tuple: what an eager call runs."""
    op = layer_op(build, *args)
    return op, op.serialize()


@torch.compiler.assume_constant_result
def op_text(build: Callable[..., OpInfo], *args: Hashable) -> str:
    """The serialised op ``build(*args)``: a constant of the compiled graph, decided at trace time."""
    return layer_op(build, *args).serialize()


@torch.compiler.assume_constant_result
def traced_plan(build: Callable[..., OpInfo], *args: Hashable) -> reference.Plan:
    """The reference executor's plan of the op ``build(*args)``: a constant of the compiled graph,
    decided at trace time (an op itself is not traceable)."""
    return reference.plan(layer_op(build, *args))


def named(name: str) -> OpInfo:
    """A built-in op by its DGL-style name (a builder for :func:`run`)."""
    return OpInfo.from_name(name)


def run(graph: Graph, build: Callable[..., OpInfo], args: Tuple[Hashable, ...], operands: Sequence[Tensor]) -> Tensor:
    """Run the op ``build(*args)`` on ``graph``: :func:`pyg_ugrapher.compute` in eager mode, the
    custom op it calls under ``torch.compile`` (``compute``'s Python-side checks and caches are
    not traceable; the layers pass it only shapes they checked), the reference executor's torch
    operations on a compiled small graph's edges (:func:`traced_graph`) and on an eager
    host-bound one's (:func:`host_bound`)."""
    if graph.edges is not None:
        return reference.execute_plan(graph.edges, traced_plan(build, *args), operands)
    if graph.structure is not None:
        return ops.call_graph_op(graph.structure, list(operands), op_text(build, *args), ops.AUTO)
    device_operand = operands[0]
    if host_bound(graph.num_edges, device_operand):
        edges = eager_edges(graph.tensor, device_operand.device)
        return reference.execute_plan(edges, traced_plan(build, *args), operands)
    op, text = _layer_op_and_text(build, args)
    return ops.compute_checked(graph.tensor, op, text, list(operands))


#: Eager layer calls on a graph of fewer than this many edges on a :data:`HOST_BOUND_DEVICES`
#: device run their operators as torch operations (:func:`host_bound`).
HOST_BOUND_EDGES = 1 << 18
HOST_BOUND_DEVICES = ("cuda",)


def host_bound(num_edges: int, operand: Tensor, limit: Optional[int] = None) -> bool:
    """Whether an eager call on a graph of ``num_edges`` edges whose operands lie where ``operand``
    does is bound by host time: fewer than ``limit`` (default :data:`HOST_BOUND_EDGES`) edges, on
    one of the :data:`HOST_BOUND_DEVICES`, outside ``torch.compile``, a recording of a whole step
    (:func:`~pyg_ugrapher.structure.records_steps`) and a CUDA graph capture, where kernel time is
    what a replay costs. There a graph operator's call and its backward in Python cost more host
    time than the reference executor's few torch operations (PyG's own gathers and scatters) and
    their backward in C++, and the kernels take microseconds either way."""
    return (
        not torch.compiler.is_compiling()
        and num_edges < (HOST_BOUND_EDGES if limit is None else limit)
        and operand.device.type in HOST_BOUND_DEVICES
        and not records_steps()
        and not (operand.is_cuda and torch.cuda.is_current_stream_capturing())
    )


def eager_edges(graph: GraphTensor, device: torch.device) -> EdgeList:
    """The edges of ``graph`` in the user's order on ``device``, as its eager structure holds them:
    a new graph's indices clamped into range until its range check finishes (no gather reads
    outside its tensors)."""
    structure = graph.eager_structure(device)
    return EdgeList(structure.src, structure.dst, graph.num_src, graph.num_dst)


def pair(x: object, static: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """``x`` or ``(x_src, x_dst)`` as a pair, checked (``static``: see :func:`check_features`);
    ``x_dst`` may be ``None``."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"x: expected a tensor or a pair (x_src, x_dst), got {len(x)} items")
        x_src = check_features("x[0]", x[0], static)
        x_dst = None if x[1] is None else check_features("x[1]", x[1], static)
        if x_dst is not None and x_dst.dim() != x_src.dim():
            raise ValueError(f"x: expected x[0] and x[1] of one rank, got {list(x_src.shape)} and {list(x_dst.shape)}")
        return x_src, x_dst
    x = check_features("x", x, static)
    return x, x


def edge_tensor(name: str, value: Optional[Tensor], num_edges: int) -> Optional[Tensor]:
    """An optional per-edge tensor with one row per edge of the graph argument."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name}: expected floating-point values, got {value.dtype}")
    if value.dim() == 0 or value.size(0) != num_edges:
        raise ValueError(f"{name}: expected {num_edges} rows (one per edge), got shape {list(value.shape)}")
    return value


def aggregate(
    layer: MessagePassing,
    gather: str,
    x_src: Tensor,
    x_dst: Optional[Tensor],
    edge_index: Tensor,
    size: Optional[Tuple[int, int]],
    edge_weight: Optional[Tensor] = None,
) -> Tensor:
    """``gather`` over the incoming edges of ``x_src[u]`` (times the edge weight, if any): one IR op.

    A sparse adjacency's values are edge weights, as in PyG's ``spmm``.
    """
    num_src, num_dst = node_sizes(layer, edge_index, size, x_src, x_dst)
    graph, values = adjacency(layer, edge_index, num_src, num_dst)
    if values is None:
        weight = edge_tensor("edge_weight", edge_weight, graph.num_edges)
    elif edge_weight is not None:
        raise ValueError(
            "edge_weight: a sparse adjacency carries its edge weights as its values; pass edge_weight=None"
        )
    else:
        weight = values
    if weight is None:
        return run(graph, named, (f"copy_u_{gather}",), [x_src])
    return run(graph, named, (f"u_mul_e_{gather}",), [x_src, weight.view(-1, 1)])


def kept_on_the_graph(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function(edge_index, ...)``, one of PyG's helpers that add self loops or normalise a graph
    (:data:`KEPT_ON_THE_GRAPH`), with its result kept on ``edge_index`` (:func:`derived`, so until
    it dies or changes in place). A routed PyG layer that adds self loops in every ``forward()``
    (``EGConv``, ``LEConv``...) then passes the same looped index on every call, and its structures
    are built once, as the drop-in layers keep their looped graphs, instead of on every step; PyG's
    own work on the graph is saved too.

    One result is kept per graph and plain arguments; it serves a call whose tensor arguments (edge
    weights, fill values) are the same objects, unchanged, as when it was made, and is made again
    otherwise, as it is after a change in place of the result itself. It is ``function`` itself
    where a kept result could differ from a new one or cannot be kept: a tensor argument that
    requires a gradient (a learnt edge weight), a graph that is not a plain index tensor or requires
    a gradient, inside a CUDA graph capture, and under ``torch.compile`` where PyG's helper compiles.
    Where it breaks the compiled graph anyway (self loops added to those that remain: a
    data-dependent number of edges, unless Dynamo captures such shapes), the kept form runs there
    instead, eagerly: the compiled layer then finds its graph's structures built, as the eager one
    does.
    """

    @wraps(function)
    def kept(edge_index: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            if _breaks_compiled_graphs(function, args, kwargs):
                return kept_eagerly(edge_index, *args, **kwargs)
            return function(edge_index, *args, **kwargs)
        if not _keepable(edge_index, args, kwargs):
            return function(edge_index, *args, **kwargs)
        names = tuple(sorted(kwargs))
        values = args + tuple(kwargs[name] for name in names)
        # tensors by position: a kept result remembers which ones it was made from
        key = ("kept", function, len(args), names, tuple(_TENSOR if isinstance(v, Tensor) else v for v in values))
        try:
            hash(key)
        except TypeError:
            return function(edge_index, *args, **kwargs)
        inputs = tuple((value, version(value)) for value in values if isinstance(value, Tensor))
        holder: List[Any] = derived(edge_index, key, lambda: [None, None, ()])
        result, versions, made_from = holder
        if result is None or _versions(result) != versions or not _same_inputs(made_from, inputs):
            with torch.inference_mode(False), torch.no_grad():
                result = function(edge_index, *args, **kwargs)
            holder[:] = [result, _versions(result), tuple((weakref.ref(t), v) for t, v in inputs)]
        return result

    kept_eagerly = torch.compiler.disable(kept)
    return kept


#: Where a tensor argument stands in the key of a kept result.
_TENSOR = object()


def _same_inputs(made_from: Tuple[Any, ...], inputs: Tuple[Tuple[Tensor, Hashable], ...]) -> bool:
    """Whether the tensors ``inputs`` (with their versions) are those a kept result was made from
    (weakly held, with theirs)."""
    return len(made_from) == len(inputs) and all(
        reference() is tensor and made == current for (reference, made), (tensor, current) in zip(made_from, inputs)
    )


def _breaks_compiled_graphs(function: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether Dynamo breaks the graph at PyG's ``function`` called with these arguments: it adds
    self loops to those that remain (``add_remaining_self_loops``, ``gcn_norm`` with
    ``add_self_loops``), whose count depends on the data, and Dynamo does not capture such shapes."""
    if torch._dynamo.config.capture_dynamic_output_shape_ops:
        return False
    if function is add_remaining_self_loops:
        return True
    if function is gcn_norm:
        return bool(args[3] if len(args) > 3 else kwargs.get("add_self_loops", True))
    return False


def _keepable(edge_index: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    return (
        type(edge_index) is Tensor
        and not edge_index.requires_grad
        and not (edge_index.is_cuda and torch.cuda.is_current_stream_capturing())
        and not any(isinstance(value, Tensor) and value.requires_grad for value in list(args) + list(kwargs.values()))
    )


def _versions(result: Any) -> Tuple[Any, ...]:
    values = result if isinstance(result, tuple) else (result,)
    return tuple(version(value) if isinstance(value, Tensor) else None for value in values)


#: PyG's graph helpers whose results a routed layer's ``forward()`` keeps on its graph
#: (:func:`kept_on_the_graph`), each mapped to its keeping form.
KEPT_ON_THE_GRAPH: Dict[Callable[..., Any], Callable[..., Any]] = {
    function: kept_on_the_graph(function) for function in (add_self_loops, add_remaining_self_loops, gcn_norm)
}
