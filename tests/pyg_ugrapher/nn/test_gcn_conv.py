import gc
import weakref

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

from autotune import selection
from pyg_ugrapher import ops
from pyg_ugrapher.nn import GCNConv
from pyg_ugrapher.nn.gcn_conv import unit_norm, unit_norm_torch
from pyg_ugrapher.ops import custom_ops
from triton_kernels import dispatch

CONFIGS = [
    {},
    {"improved": True},
    {"add_self_loops": False},
    {"normalize": False},
    {"cached": True},
    {"bias": False},
    {"flow": "target_to_source"},
    {"normalize": False, "aggr": "mean"},
    {"aggr": "max"},
]


def _forward(edge_index, weighted):
    def forward(layer, x, weight):
        return layer(x, edge_index, weight if weighted else None)

    return forward


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_matches_pyg(compare, small_graph, kwargs, weighted, train):
    x, edge_index = small_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    theirs = pyg_nn.GCNConv(6, 4, **kwargs)
    compare(GCNConv(6, 4, **kwargs), theirs, _forward(edge_index, weighted), [x, weight], train=train)


@pytest.mark.parametrize(
    "kwargs", [{}, {"improved": True}, {"aggr": "mean"}, {"aggr": "max"}], ids=["sum", "improved", "mean", "max"]
)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_repeated_self_loops(compare, compile_ours, small_graph, kwargs, weighted, compiled):
    """Several stored loops on one node, one on another, with their own weights: sums keep them at
    weight 0 in a graph of fixed size, other aggregations send them to a spare row (compiled, the
    layer stays one graph); all as PyG, gradients too."""
    x, edge_index = small_graph
    loops = torch.tensor([[3, 3, 3, 5], [3, 3, 3, 5]])
    edge_index = torch.cat([loops[:, :2], edge_index, loops[:, 2:]], dim=1)
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    theirs = pyg_nn.GCNConv(6, 4, **kwargs)
    ours = GCNConv(6, 4, **kwargs)
    forward, counter = (
        compile_ours(_forward(edge_index, weighted), ours) if compiled else (_forward(edge_index, weighted), None)
    )
    compare(ours, theirs, forward, [x, weight], train=True)
    assert counter is None or counter.frame_count == 1


@pytest.mark.parametrize("kwargs", [{}, {"aggr": "max"}, {"add_self_loops": False}], ids=["sum", "max", "no_loops"])
def test_compiled_reads_cached_normalisation(compare, compile_ours, small_graph, monkeypatch, kwargs, custom_op_graphs):
    """Compiled without edge weights, on a graph that runs the custom ops, the normalisation is read
    from the index's cache by one op:
    a call runs one graph operator (the aggregation), not three. Changed in place, the index gets
    its normalisation afresh, as PyG's."""
    x, edge_index = small_graph
    edge_index = edge_index.clone()
    torch.manual_seed(0)
    theirs, ours = pyg_nn.GCNConv(6, 4, **kwargs), GCNConv(6, 4, **kwargs)
    forward, counter = compile_ours(lambda layer, x: layer(x, edge_index), ours)
    compare(ours, theirs, forward, [x], train=True)

    run_graph_op, ops_run = [], custom_ops.run_graph_op
    monkeypatch.setattr(custom_ops, "run_graph_op", lambda *args: run_graph_op.append(args[2]) or ops_run(*args))
    forward(ours, x.clone().requires_grad_())
    assert len(run_graph_op) == 1 and run_graph_op[0].startswith("u_mul_e_")
    assert counter.frame_count == 1

    edge_index[0, :5] = edge_index[1, :5]  # five more self loops
    compare(ours, theirs, forward, [x], train=True)


def test_compiled_reads_cached_normalisation_in_csr_order(
    interpret, compare, compile_ours, small_graph, monkeypatch, custom_op_graphs
):
    """Compiled on a graph whose operators run outside CUDA graphs (a large one's), the normalised
    weights, a new copy every call, are read in CSR order from the second call on, forward and
    backward, from rows permuted once: as an eager layer reads its cached weights, not through
    the edge ids every step."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", -1)
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs, ours = pyg_nn.GCNConv(6, 4), GCNConv(6, 4)
    forward, counter = compile_ours(lambda layer, x: layer(x, edge_index), ours)
    compare(ours, theirs, forward, [x], train=True)

    read, permute = [], dispatch.in_csr_order
    monkeypatch.setattr(dispatch, "in_csr_order", lambda t, eid: read.append((eid, permute(t, eid))) or read[-1][1])
    for _ in range(2):
        compare(ours, theirs, forward, [x], train=True)
    assert len(read) == 4  # two calls, each forward and backward
    (forward_eid, first), (backward_eid, first_back), (eid, again), (back_eid, again_back) = read
    assert forward_eid is eid and backward_eid is back_eid and forward_eid is not backward_eid
    assert again is first and again_back is first_back
    assert counter.frame_count == 1


def _static_ids(kwargs):
    return ",".join(f"{a}={b}" for a, b in kwargs.items()) or "default"


def test_state_dict_round_trip():
    theirs, ours = pyg_nn.GCNConv(5, 3), GCNConv(5, 3)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    back = pyg_nn.GCNConv(5, 3)
    back.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values()))
    assert repr(ours) == repr(theirs) == "GCNConv(5, 3)"


def test_edge_index_type(compare, small_graph):
    x, edge_index = small_graph
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    compare(GCNConv(6, 4), pyg_nn.GCNConv(6, 4), lambda layer, x: layer(x, index), [x])


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"improved": True}, {"normalize": False}, {"aggr": "max"}, {"aggr": "mean", "improved": True}],
    ids=["default", "improved", "raw", "max", "mean_improved"],
)
def test_sparse_adjacency(compare, small_graph, layout, kwargs):
    """With the graph's stored self loops: PyG's gcn_norm merges each with the loop it adds into one
    entry, which mean and max read as one message."""
    x, edge_index = small_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(6))
    convert = to_torch_coo_tensor if layout == "coo" else to_torch_csr_tensor
    adj_t = convert(edge_index.flip(0), weight, size=(12, 12))
    compare(GCNConv(6, 4, **kwargs), pyg_nn.GCNConv(6, 4, **kwargs), lambda layer, x: layer(x, adj_t), [x])


def test_one_propagation_op_per_forward(small_graph):
    """Without edge weights the normalisation is cached with the graph: one op per forward."""
    x, edge_index = small_graph
    conv = GCNConv(6, 4)
    conv(x, edge_index)
    calls = []
    with ops.observe(calls.append):
        conv(x, edge_index)
    assert [call.op.name for call in calls] == ["u_mul_e_sum"]
    with ops.observe(calls.append):
        conv(x, edge_index, torch.rand(edge_index.size(1)))
    assert [call.op.name for call in calls[1:]] == ["copy_e_sum", "((u0 * e1) * v2)", "u_mul_e_sum"]


def test_unit_weights_run_no_normalisation_op(small_graph):
    """On a graph it has not seen, an unweighted layer computes its normalisation from node-level
    factors: the propagation is its only graph operator."""
    x, edge_index = small_graph
    calls = []
    with ops.observe(calls.append):
        GCNConv(6, 4)(x, edge_index.clone())
    assert [call.op.name for call in calls] == ["u_mul_e_sum"]


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("add_self_loops", [True, False], ids=["loops", "no_loops"])
def test_unit_norm_matches_gcn_norm(interpret, small_graph, flow, add_self_loops):
    """The weights of PyG's gcn_norm on a graph with repeated stored loops and isolated nodes: with
    loops, in the padded graph's order (stored loops in place at weight 0, then one loop per node)."""
    _, edge_index = small_graph
    num_nodes = int(edge_index.max()) + 4  # the last three nodes have no edges
    loops = torch.tensor([[3, 3, 3, 5], [3, 3, 3, 5]])
    edge_index = torch.cat([loops[:, :2], edge_index, loops[:, 2:]], dim=1)
    _, theirs = gcn_norm(edge_index, None, num_nodes, add_self_loops=add_self_loops, flow=flow)
    src, dst = (edge_index[1], edge_index[0]) if flow == "target_to_source" else edge_index
    if not add_self_loops:
        torch.testing.assert_close(unit_norm(edge_index, flow, num_nodes, False, torch.float32), theirs)
        torch.testing.assert_close(unit_norm_torch(src, dst, num_nodes, False, torch.float32), theirs)
        return
    is_loop = edge_index[0] == edge_index[1]
    kept = (~is_loop).nonzero().view(-1)
    num_edges = edge_index.size(1)
    # The kernels (here through Triton's interpreter), and the torch operations.
    for padded in (
        unit_norm(edge_index, flow, num_nodes, True, torch.float32),
        unit_norm_torch(src, dst, num_nodes, True, torch.float32),
    ):
        assert padded.shape == (num_edges + num_nodes,)
        torch.testing.assert_close(padded[:num_edges][kept], theirs[: kept.numel()])
        assert padded[:num_edges][is_loop].eq(0).all()
        torch.testing.assert_close(padded[num_edges:], theirs[kept.numel() :])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_unit_norm_hub_degree(interpret, dtype):
    """Degrees are summed in float32 whatever the weights' dtype, by the kernels and by the torch
    operations: a hub's 70 000 edges overflow float16 (largest value 65504) and are not exact in
    bfloat16."""
    num_leaves = 70_000
    leaves = torch.arange(1, num_leaves + 1)
    edge_index = torch.stack([leaves, torch.zeros_like(leaves)])
    expected = unit_norm_torch(edge_index[0], edge_index[1], num_leaves + 1, True, torch.float64)
    assert expected[num_leaves] == pytest.approx(1 / (num_leaves + 1))  # the hub's own loop
    for ours in (
        unit_norm(edge_index, "source_to_target", num_leaves + 1, True, dtype),
        unit_norm_torch(edge_index[0], edge_index[1], num_leaves + 1, True, dtype),
    ):
        assert ours.dtype == dtype and ours.isfinite().all()
        torch.testing.assert_close(ours.double(), expected, rtol=1e-2 if dtype != torch.float64 else 1e-12, atol=0)


def test_graph_built_once_and_released(small_graph):
    x, edge_index = small_graph
    edge_index = edge_index.clone()
    conv = GCNConv(6, 4)
    graphs = []
    with ops.observe(lambda call: graphs.append(call.graph)):
        conv(x, edge_index)
        first = graphs[-1]
        conv(x, edge_index)
        assert graphs[-1] is first
        edge_index.add_(0)  # an in-place change invalidates the cached graph
        conv(x, edge_index)
        assert graphs[-1] is not first
    graphs.clear()
    reference = weakref.ref(edge_index)
    del edge_index, first
    gc.collect()
    assert reference() is None  # the cache does not keep the graph argument alive


def test_cached_keeps_first_graph(small_graph):
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = pyg_nn.GCNConv(6, 4, cached=True)
    ours = GCNConv(6, 4, cached=True)
    ours.load_state_dict(theirs.state_dict())
    ours(x, edge_index), theirs(x, edge_index)
    other = edge_index[:, :10]
    torch.testing.assert_close(ours(x, other), theirs(x, other), rtol=1e-5, atol=1e-6)
    ours.reset_parameters()
    assert ours._cached_edge_index is None


def test_bad_input(small_graph):
    x, edge_index = small_graph
    conv = GCNConv(6, 4)
    with pytest.raises(ValueError, match="x:"):
        conv((x, x), edge_index)
    with pytest.raises(TypeError, match="edge_index:"):
        conv(x, edge_index.float())
    with pytest.raises(ValueError, match="edge_index:"):
        conv(x, edge_index[0])
    with pytest.raises(ValueError, match="edge_index:"):
        conv(x[:5], edge_index)
    with pytest.raises(ValueError, match="edge_weight:"):
        conv(x, edge_index, torch.rand(3))
    with pytest.raises(TypeError, match="x:"):
        conv(x.long(), edge_index)
    with pytest.raises(ValueError, match=r"x: expected shape \[num_nodes, channels\] or \[batch"):
        conv(x.view(1, 2, 6, 6), edge_index)
    with pytest.raises(ValueError, match="add_self_loops:"):
        GCNConv(6, 4, normalize=False, add_self_loops=True)
    with pytest.raises(ValueError, match="aggr:"):
        GCNConv(6, 4, aggr="std")


@pytest.mark.parametrize("kwargs", [{}, {"normalize": False}, {"aggr": "max"}, {"cached": True}], ids=_static_ids)
def test_static_graph(compare, static_graph, kwargs):
    """A static graph's ``[B, N, F]`` features, as PyG's layer takes them: one graph for every
    matrix of the batch."""
    x, edge_index, _ = static_graph
    torch.manual_seed(0)
    out = compare(
        GCNConv(6, 4, **kwargs), pyg_nn.GCNConv(6, 4, **kwargs), lambda layer, x: layer(x, edge_index), [x], train=True
    )
    assert out[0].shape == (3, 12, 4)


def test_static_graph_interpreted(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    batch = torch.stack([x, x.flip(0), 2 * x])
    torch.manual_seed(0)
    compare(GCNConv(4, 3), pyg_nn.GCNConv(4, 3), lambda layer, x: layer(x, edge_index), [batch], train=True)


def test_interpreter(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(7))
    compare(GCNConv(4, 3), pyg_nn.GCNConv(4, 3), _forward(edge_index, True), [x, weight], train=True)


def test_datasets(compare, dataset):
    torch.manual_seed(0)
    compare(
        GCNConv(dataset.num_features, 16),
        pyg_nn.GCNConv(dataset.num_features, 16),
        lambda layer, x: layer(x, dataset.edge_index),
        [dataset.x],
        train=True,
    )


@pytest.mark.parametrize("kwargs", [{}, {"aggr": "mean"}], ids=["in_place", "looped"])
def test_last_duplicate_loop_lends_its_weight(small_graph, kwargs):
    """Of a node's duplicate stored loops the last one's weight counts, and only its: the rule
    holds on every device (PyG's indexed assignment leaves the winner unspecified on a GPU)."""
    x, edge_index = small_graph
    loops = torch.tensor([[3, 3, 3], [3, 3, 3]])
    edge_index = torch.cat([loops[:, :2], edge_index, loops[:, 2:]], dim=1)
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(8)) + 0.5
    layer = GCNConv(6, 4, **kwargs)
    out = layer(x, edge_index, weight)
    earlier = weight.clone()
    earlier[:2] = torch.tensor([7.0, 9.0])
    torch.testing.assert_close(layer(x, edge_index, earlier), out, rtol=0, atol=0)
    last = weight.clone()
    last[-1] = 7.0
    assert not torch.allclose(layer(x, edge_index, last), out)
