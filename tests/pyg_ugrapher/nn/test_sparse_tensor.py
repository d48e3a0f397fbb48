"""Every drop-in layer given a ``torch_sparse.SparseTensor`` ``adj_t`` (:class:`FakeSparseTensor`:
torch_sparse is not installed here) against its PyG namesake given the equivalent edge index. Each
PyG layer reads a SparseTensor's values its own way: ``GCNConv``'s ``gcn_norm`` weighs the entries
by them (or by ones) and replaces the stored diagonal by loops of the fill value (``fill_diag``);
``GATConv`` replaces the diagonal too (``set_diag``) and, without self loops, takes values of more
than one dimension as edge features, as ``GINEConv`` does; ``GraphConv`` weighs by them;
``SAGEConv`` and ``GINConv`` drop them. The graphs have an isolated vertex, self loops and
duplicate entries, which a SparseTensor keeps."""

import gc
import importlib.util
import weakref
from typing import Callable, Dict, Optional, Tuple

import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher import ops

from ...conftest import FakeSparseTensor


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


#: id -> (layer, its arguments, its keyword arguments, how PyG's layer reads a SparseTensor's values:
#: ``"fill_diag"`` (edge weights, stored diagonal replaced), ``"weights"``, ``"features"`` (those of
#: two dimensions) or ``"ignored"``).
CASES: Dict[str, Tuple[str, Callable[[], tuple], dict, str]] = {
    "gcn": ("GCNConv", lambda: (6, 4), {}, "fill_diag"),
    "gcn_improved": ("GCNConv", lambda: (6, 4), {"improved": True}, "fill_diag"),
    "gcn_max": ("GCNConv", lambda: (6, 4), {"aggr": "max"}, "fill_diag"),
    "gcn_no_loops": ("GCNConv", lambda: (6, 4), {"add_self_loops": False}, "weights"),
    "gcn_raw_mean": ("GCNConv", lambda: (6, 4), {"normalize": False, "aggr": "mean"}, "weights"),
    "gat": ("GATConv", lambda: (6, 4), {"heads": 2}, "ignored"),
    "gat_edge_dim_no_loops": (
        "GATConv",
        lambda: (6, 4),
        {"heads": 2, "edge_dim": 3, "add_self_loops": False},
        "features",
    ),
    "sage": ("SAGEConv", lambda: (6, 4), {}, "ignored"),
    "sage_max": ("SAGEConv", lambda: (6, 4), {"aggr": "max"}, "ignored"),
    "gin": ("GINConv", lambda: (_mlp(),), {}, "ignored"),
    "gin_eps": ("GINConv", lambda: (_mlp(),), {"eps": 0.3, "train_eps": True}, "ignored"),
    "gine": ("GINEConv", lambda: (_mlp(),), {"edge_dim": 3}, "features"),
    "graph_conv": ("GraphConv", lambda: (6, 4), {}, "weights"),
    "graph_conv_mean": ("GraphConv", lambda: (6, 4), {"aggr": "mean"}, "weights"),
}
BIPARTITE_CASES = ["gat", "gat_edge_dim_no_loops", "sage_max", "gin_eps", "gine", "graph_conv_mean"]


def twins(case: str) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """Our layer and PyG's of ``case``, PyG's initialised from seed 0 (``compare`` loads its weights)."""
    name, args, kwargs, _ = CASES[case]
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*args(), **kwargs)
    return getattr(ug_nn, name)(*args(), **kwargs), theirs


def storage_order(edge_index: torch.Tensor, num_src: int) -> torch.Tensor:
    """``edge_index`` in a SparseTensor's storage order (by destination, then source), so that edge
    features given in its order line up with the SparseTensor's entries."""
    return edge_index[:, torch.argsort(edge_index[1] * num_src + edge_index[0], stable=True)]


def adj_t(edge_index: torch.Tensor, value: Optional[torch.Tensor], num_src: int, num_dst: int) -> FakeSparseTensor:
    return FakeSparseTensor(edge_index[1], edge_index[0], value, (num_dst, num_src))


def call(layer: torch.nn.Module, x, graph, per_edge: Optional[torch.Tensor], size=None) -> torch.Tensor:
    """``layer(x, graph)``, with the per-edge tensor as its third argument where it takes one."""
    kwargs = {} if size is None else {"size": size}
    if type(layer).__name__ in ("SAGEConv", "GINConv"):
        assert per_edge is None
        return layer(x, graph, **kwargs)
    return layer(x, graph, per_edge, **kwargs)


def forwards(
    case: str, ours: torch.nn.Module, edge_index: torch.Tensor, num_src: int, num_dst: int, valued: bool
) -> Callable:
    """``forward(layer, x, value, edge_attr)``: ours given the SparseTensor of ``edge_index`` (with
    values if ``valued``: ``value``, or ``edge_attr`` where two-dimensional values are features),
    PyG's given the edge index and the per-edge tensor that PyG's layer reads from it."""
    reads = CASES[case][3]

    def forward(layer, x, value, edge_attr):
        if layer is ours:
            if reads == "features":
                return call(
                    layer,
                    x,
                    adj_t(edge_index, edge_attr if valued else None, num_src, num_dst),
                    None if valued else edge_attr,
                )
            return call(layer, x, adj_t(edge_index, value if valued else None, num_src, num_dst), None)
        size = (num_src, num_dst) if isinstance(x, tuple) else None
        if reads == "features":
            return call(layer, x, edge_index, edge_attr, size)
        if reads == "weights":
            return call(layer, x, edge_index, value if valued else None, size)
        if reads == "fill_diag":
            kept = edge_index[0] != edge_index[1]
            weight = value if valued else torch.ones_like(value)
            return call(layer, x, edge_index[:, kept], weight[kept], size)
        return call(layer, x, edge_index, None, size)

    return forward


def per_edge_inputs(num_edges: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(value, edge_attr)``: positive edge weights, and edge features of width 3."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(num_edges, generator=generator) + 0.1, torch.randn(num_edges, 3, generator=generator)


@pytest.mark.parametrize("valued", [True, False], ids=["values", "no_values"])
@pytest.mark.parametrize("case", CASES)
def test_matches_pyg(compare, small_graph, case, valued):
    x, edge_index = small_graph
    edge_index = storage_order(edge_index, 12)
    assert (edge_index[0] == edge_index[1]).any() and edge_index.unique(dim=1).size(1) < edge_index.size(1)
    ours, theirs = twins(case)
    compare(
        ours,
        theirs,
        forwards(case, ours, edge_index, 12, 12, valued),
        [x, *per_edge_inputs(edge_index.size(1), seed=5)],
        train=True,
    )


@pytest.mark.parametrize("with_dst", [True, False], ids=["x_dst", "no_x_dst"])
@pytest.mark.parametrize("case", BIPARTITE_CASES)
def test_bipartite_matches_pyg(compare, bipartite_graph, case, with_dst):
    """Sizes come from the SparseTensor, without target features too; ``GATConv``'s loops are on the
    first ``min(num_src, num_dst)`` nodes."""
    x_src, _, edge_index = bipartite_graph
    edge_index = storage_order(edge_index, 10)
    x_dst = torch.randn(7, 6, generator=torch.Generator().manual_seed(6))
    ours, theirs = twins(case)
    forward = forwards(case, ours, edge_index, 10, 7, valued=True)
    value, edge_attr = per_edge_inputs(edge_index.size(1), seed=7)
    if with_dst:
        compare(
            ours,
            theirs,
            lambda layer, a, b, w, e: forward(layer, (a, b), w, e),
            [x_src, x_dst, value, edge_attr],
            train=True,
        )
    else:
        compare(
            ours, theirs, lambda layer, a, w, e: forward(layer, (a, None), w, e), [x_src, value, edge_attr], train=True
        )


def test_gcn_cached(small_graph):
    """``cached=True`` keeps the first SparseTensor's normalisation, apart from an edge index's, as
    PyG keeps its ``_cached_adj_t`` apart from its ``_cached_edge_index``."""
    x, edge_index = small_graph
    edge_index = storage_order(edge_index, 12)
    value, _ = per_edge_inputs(edge_index.size(1), seed=8)
    kept = edge_index[0] != edge_index[1]
    ours, theirs = twins("gcn_improved")
    ours.cached = theirs.cached = True
    ours.load_state_dict(theirs.state_dict())
    first = ours(x, adj_t(edge_index, value, 12, 12))
    expected = theirs(x, edge_index[:, kept], value[kept])
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-6)
    other = edge_index[:, :20]
    torch.testing.assert_close(ours(x, adj_t(other, None, 12, 12)), expected, rtol=1e-5, atol=1e-6)
    # An edge index has a cache of its own: this one is normalised now.
    _, fresh = twins("gcn_improved")
    fresh.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x, other), fresh(x, other), rtol=1e-5, atol=1e-6)
    ours.reset_parameters()
    assert ours._cached_adj_t is None and ours._cached_edge_index is None


def test_graph_cached_on_the_sparse_tensor_and_released(small_graph):
    """The SparseTensor's index, and the graph built from it, are built once per SparseTensor, again
    after an in-place change of its indices, and do not keep it alive."""
    x, edge_index = small_graph
    graph = adj_t(edge_index, None, 12, 12)
    conv = ug_nn.SAGEConv(6, 4)
    graphs = []
    with ops.observe(lambda call: graphs.append(call.graph)):
        conv(x, graph)
        first = graphs[-1]
        conv(x, graph)
        assert graphs[-1] is first
        graph.col.add_(0)
        conv(x, graph)
        assert graphs[-1] is not first
    graphs.clear()
    reference = weakref.ref(graph)
    del graph, first
    gc.collect()
    assert reference() is None


@pytest.mark.parametrize("case", ["gcn_improved", "gat", "gine", "sage"])
def test_compiled(compare, compile_ours, small_graph, case):
    """Under ``torch.compile`` the SparseTensor is read eagerly (a graph break); the result is PyG's."""
    x, edge_index = small_graph
    edge_index = storage_order(edge_index, 12)
    ours, theirs = twins(case)
    forward, counter = compile_ours(forwards(case, ours, edge_index, 12, 12, valued=True), ours)
    compare(ours, theirs, forward, [x, *per_edge_inputs(edge_index.size(1), seed=9)], train=True)
    assert counter.frame_count >= 2  # the graph before the break, then the layer's own


@pytest.mark.parametrize("case", ["gcn", "gat"])
def test_interpreter(compare, interpret, tiny_graph, case):
    x, edge_index = tiny_graph
    edge_index = storage_order(edge_index, 6)
    name, _, kwargs, _ = CASES[case]
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(4, 3, **kwargs)
    ours = getattr(ug_nn, name)(4, 3, **kwargs)
    compare(
        ours,
        theirs,
        forwards(case, ours, edge_index, 6, 6, valued=True),
        [x, *per_edge_inputs(edge_index.size(1), seed=10)],
        train=True,
    )


def test_bad_input(small_graph):
    x, edge_index = small_graph
    value = torch.rand(edge_index.size(1))
    graph = adj_t(edge_index, value, 12, 12)
    with pytest.raises(ValueError, match="edge_index: flow='target_to_source'"):
        ug_nn.SAGEConv(6, 4, flow="target_to_source")(x, graph)
    with pytest.raises(ValueError, match="edge_weight:"):
        ug_nn.GraphConv(6, 4)(x, graph, value)
    with pytest.raises(ValueError, match="size:"):
        ug_nn.GCNConv(6, 4)(x, adj_t(edge_index, value, 12, 13))
    with pytest.raises(ValueError, match="size:"):
        ug_nn.SAGEConv(6, 4)(x[:10], graph)
    with pytest.raises(ValueError, match=r"edge_index: .*shape \[nnz\]"):
        ug_nn.GCNConv(6, 4)(x, adj_t(edge_index, torch.rand(edge_index.size(1), 2), 12, 12))
    with pytest.raises(TypeError, match="edge_index: .*floating-point"):
        ug_nn.GraphConv(6, 4)(x, adj_t(edge_index, torch.ones(edge_index.size(1), dtype=torch.long), 12, 12))
    broken = adj_t(edge_index, None, 12, 12)
    broken.value = value[:5]
    with pytest.raises(ValueError, match="edge_index: .*one row per stored entry"):
        ug_nn.GraphConv(6, 4)(x, broken)
    broken.value = None
    broken.row = broken.row.float()
    with pytest.raises(TypeError, match="edge_index: .*integer row"):
        ug_nn.SAGEConv(6, 4)(x, broken)
    broken.row = torch.stack([broken.col, broken.col])
    with pytest.raises(ValueError, match="edge_index: .*one row index per stored entry"):
        ug_nn.SAGEConv(6, 4)(x, broken)
    with pytest.raises(ValueError, match="edge_index:"):
        ug_nn.SAGEConv(6, 4)(x[:6], adj_t(edge_index, None, 6, 6))  # indices past the sizes
    with pytest.raises(NotImplementedError, match="edge_dim:"):
        ug_nn.GATConv(6, 4, edge_dim=3)(x, graph)
    with pytest.raises(NotImplementedError, match="return_attention_weights:"):
        ug_nn.GATConv(6, 4)(x, graph, return_attention_weights=True)
    with pytest.raises(TypeError, match="edge_index: .*SparseTensor"):
        ug_nn.GINConv(_mlp())(x, edge_index.tolist())


def _torch_sparse_missing() -> str:
    return "" if importlib.util.find_spec("torch_sparse") else "torch_sparse is not installed"


@pytest.mark.skipif(bool(_torch_sparse_missing()), reason=_torch_sparse_missing() or "installed")
@pytest.mark.parametrize("case", CASES)
def test_real_sparse_tensor(compare, small_graph, case):
    """Where torch_sparse is installed: ours and PyG's layer given the same SparseTensor."""
    from torch_sparse import SparseTensor

    x, edge_index = small_graph
    value, edge_attr = per_edge_inputs(edge_index.size(1), seed=11)
    features = CASES[case][3] == "features"
    ours, theirs = twins(case)

    def forward(layer, x, value, edge_attr):
        graph = SparseTensor(
            row=edge_index[1], col=edge_index[0], value=edge_attr if features else value, sparse_sizes=(12, 12)
        )
        return call(layer, x, graph, None)

    compare(ours, theirs, forward, [x, value, edge_attr], train=True)
