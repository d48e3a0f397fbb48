import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.utils import remove_self_loops

import pyg_ugrapher as ug
from pyg_ugrapher import MessagePassing, graph_argument, ops
from pyg_ugrapher.graph_argument import looped_graph
from pyg_ugrapher.message_passing import FUSED_MIN_EDGES, STAGED_MIN_EDGES
from pyg_ugrapher.nn import GATv2Conv
from pyg_ugrapher.structure import CheckedIndex

from .conftest import config_id, make_graph

CONFIGS = [
    {},
    {"heads": 3},
    {"heads": 3, "concat": False},
    {"heads": 2, "share_weights": True},
    {"heads": 2, "residual": True},
    {"heads": 2, "add_self_loops": False},
    {"heads": 2, "negative_slope": 0.05, "bias": False},
    {"heads": 2, "flow": "target_to_source"},
    {"heads": 2, "edge_dim": 3},
    {"heads": 2, "edge_dim": 3, "fill_value": "max"},
    {"heads": 2, "edge_dim": 3, "fill_value": 0.5},
    {"heads": 2, "edge_dim": 3, "add_self_loops": False},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=config_id)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_matches_pyg(compare, small_graph, kwargs, train):
    x, edge_index = small_graph
    assert (edge_index[0] == edge_index[1]).sum() >= 2  # stored self loops are replaced
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    theirs = pyg_nn.GATv2Conv(6, 4, **kwargs)
    compare(
        GATv2Conv(6, 4, **kwargs),
        theirs,
        lambda layer, x, edge_attr: layer(x, edge_index, edge_attr if "edge_dim" in kwargs else None),
        [x, edge_attr],
        train=train,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["lin_l_r", "share_weights"])
def test_bipartite(compare, bipartite_graph, shared):
    x_src, x_dst, edge_index = bipartite_graph
    x_dst = torch.randn(7, 6, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    kwargs = dict(heads=2, residual=True, share_weights=shared)
    compare(
        GATv2Conv(6, 4, **kwargs),
        pyg_nn.GATv2Conv(6, 4, **kwargs),
        lambda layer, a, b: layer((a, b), edge_index),
        [x_src, x_dst],
    )


def test_return_attention_weights(compare, small_graph):
    x, edge_index = small_graph

    def forward(layer, x):
        out, (index, alpha) = layer(x, edge_index, return_attention_weights=True)
        return out, index, alpha

    torch.manual_seed(0)
    compare(GATv2Conv(6, 4, heads=2), pyg_nn.GATv2Conv(6, 4, heads=2), forward, [x])


def test_graphs_are_built_once_per_index(small_graph):
    """The self loops are handled once per edge index: every plain call runs on the cached graph
    whose stored loops go to a spare row (``E + N`` edges), every call returning the coefficients
    on the cached looped graph (stored loops replaced), whose index the caller gets a copy of."""
    x, edge_index = small_graph
    num_nodes, num_loops = x.size(0), int((edge_index[0] == edge_index[1]).sum())
    layer = GATv2Conv(6, 4, heads=2)
    looped = looped_graph(edge_index, layer.flow, num_nodes, num_nodes, num_nodes)
    plain, weighted = [], []
    for graphs, kwargs in ((plain, {}), (weighted, {"return_attention_weights": True})):
        with ops.observe(lambda call: graphs.append(call.graph)):
            for _ in range(2):
                result = layer(x, edge_index, **kwargs)
    assert plain and all(graph is plain[0] for graph in plain)
    assert plain[0].num_edges == edge_index.size(1) + num_nodes
    assert weighted and all(graph is weighted[0] for graph in weighted)
    assert weighted[0].num_edges == looped.index.size(1) == edge_index.size(1) - num_loops + num_nodes
    returned = result[1][0]
    assert returned is not looped.index
    assert torch.equal(returned, looped.index)


def test_runs_graph_operators_only(small_graph):
    x, edge_index = small_graph
    layer = GATv2Conv(6, 4, heads=2, edge_dim=3)
    calls = []
    with ops.observe(calls.append):
        layer(x, edge_index, torch.randn(edge_index.size(1), 3))
    assert calls
    assert layer.fallback_reason is None and layer.edge_fallback_reason is None


def test_an_eager_small_gpu_graph_runs_pygs_propagation(compare, small_graph, monkeypatch):
    """Eager on a small graph of a host-bound device (the CPU stands in for a GPU), the layer's
    propagation runs PyG's on the graph with its loops: PyG's results, the reason given, no graph
    operator called for it; the attention below ``staged_min_edges`` runs PyG's way too."""
    x, edge_index = small_graph
    monkeypatch.setattr(graph_argument, "HOST_BOUND_DEVICES", ("cpu",))
    monkeypatch.setattr(MessagePassing, "fused_min_edges", FUSED_MIN_EDGES)
    monkeypatch.setattr(MessagePassing, "staged_min_edges", STAGED_MIN_EDGES)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    ours = GATv2Conv(6, 4, heads=2, edge_dim=3)
    calls = []
    with ops.observe(calls.append):
        compare(
            ours,
            pyg_nn.GATv2Conv(6, 4, heads=2, edge_dim=3),
            lambda layer, x, edge_attr: layer(x, edge_index, edge_attr),
            [x, edge_attr],
            train=True,
        )
    assert not calls
    assert f"fewer than {FUSED_MIN_EDGES} edges runs PyG's propagation" in ours.fallback_reason
    assert f"fewer than {STAGED_MIN_EDGES} edges runs PyG's propagation" in ours.edge_fallback_reason


def test_accelerate_swaps_it():
    torch.manual_seed(0)
    model = torch.nn.ModuleList([pyg_nn.GATv2Conv(6, 4, heads=2, edge_dim=3, share_weights=True)])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    accelerated = ug.accelerate(model)
    assert type(accelerated[0]) is GATv2Conv
    assert accelerated.ugrapher_report.layers[0].conversion == "swapped"
    assert all(torch.equal(state[k], v) for k, v in accelerated.state_dict().items())


def test_edge_index_type(compare, small_graph):
    x, edge_index = small_graph
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    torch.manual_seed(0)
    compare(GATv2Conv(6, 4, heads=2), pyg_nn.GATv2Conv(6, 4, heads=2), lambda layer, x: layer(x, index), [x])


@pytest.mark.parametrize("loops", [True, False], ids=["loops", "no_loops"])
def test_graph_without_edges(compare, small_graph, loops):
    x, _ = small_graph
    empty = torch.empty(2, 0, dtype=torch.long)
    torch.manual_seed(0)
    compare(
        GATv2Conv(6, 4, heads=2, add_self_loops=loops),
        pyg_nn.GATv2Conv(6, 4, heads=2, add_self_loops=loops),
        lambda layer, x: layer(x, empty),
        [x],
    )


def test_hub(compare):
    """A destination with 100,000 in-edges, duplicate edges among them, and isolated vertices."""
    generator = torch.Generator().manual_seed(9)
    num_nodes, num_edges = 400, 100_000
    src = torch.randint(0, num_nodes - 10, (num_edges,), generator=generator)
    edge_index = torch.stack([src, torch.zeros_like(src)])
    x = torch.randn(num_nodes, 6, generator=generator)
    torch.manual_seed(0)
    compare(GATv2Conv(6, 4, heads=2), pyg_nn.GATv2Conv(6, 4, heads=2), lambda layer, x: layer(x, edge_index), [x])


@pytest.mark.parametrize("fill_value", ["mean", 0.5])
def test_repeated_stored_loops(compare, fill_value):
    """Stored self loops repeated on one node (all of them go to the spare row, their features
    left out of the loops' fill), duplicate edges and an isolated node, in training with edge
    features: PyG's results and gradients."""
    edge_index = torch.tensor([[0, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6], [0, 0, 0, 2, 2, 1, 3, 3, 0, 6, 5]])
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(8, 6, generator=generator)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=generator)
    torch.manual_seed(0)
    kwargs = dict(heads=2, edge_dim=3, fill_value=fill_value)
    compare(
        GATv2Conv(6, 4, **kwargs),
        pyg_nn.GATv2Conv(6, 4, **kwargs),
        lambda layer, x, e: layer(x, edge_index, e),
        [x, edge_attr],
        train=True,
    )


def test_compiled_matches_pyg(compare, compile_ours, small_graph, monkeypatch):
    """Under ``torch.compile``, on a graph below ``staged_min_edges`` edges, the layer is one
    compiled graph, which reads the spare-row index cached on the index (through the custom op
    ``pyg_ugrapher::spare_row_index``), so every call finds the structure cached on that: PyG's
    results and gradients at every call."""
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = pyg_nn.GATv2Conv(6, 4, heads=2, edge_dim=3)
    ours = GATv2Conv(6, 4, heads=2, edge_dim=3)
    ours.staged_min_edges = STAGED_MIN_EDGES  # the default; the tests set 0
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    forward, counter = compile_ours(lambda layer, x, e: layer(x, edge_index, e), ours)
    indices = []
    cached = graph_argument._cached_spare_row_index
    monkeypatch.setattr(
        graph_argument, "_cached_spare_row_index", lambda *args: indices.append(cached(*args)) or indices[-1]
    )
    for _ in range(3):
        compare(ours, theirs, forward, [x, edge_attr], train=True)
    assert counter.frame_count == 1
    assert len(indices) == 3 and all(index is indices[0] for index in indices)


def test_compiled_on_a_large_graph_runs_the_attention_staged(compare, compile_ours, small_graph, monkeypatch):
    """On a graph of at least ``staged_min_edges`` edges with its loops, a compiled call runs the
    layer as an eager call does, outside the compiled graph, ``edge_update()`` staged on graph
    operators, not PyG's softmax traced over every edge: PyG's results and gradients at every
    call, and no recompilation. One edge fewer, the layer is compiled."""
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = pyg_nn.GATv2Conv(6, 4, heads=2, edge_dim=3)
    ours = GATv2Conv(6, 4, heads=2, edge_dim=3)
    ours.staged_min_edges = edge_index.size(1) + x.size(0)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    forward, counter = compile_ours(lambda layer, x, e: layer(x, edge_index, e), ours)
    staged, stage = [], MessagePassing._staged_edge_update
    monkeypatch.setattr(MessagePassing, "_staged_edge_update", lambda *args: staged.append(1) or stage(*args))
    for call in range(3):
        compare(ours, theirs, forward, [x, edge_attr], train=True)
        assert len(staged) == call + 1 and ours.edge_fallback_reason is None
    frames = counter.frame_count
    compare(ours, theirs, forward, [x, edge_attr], train=True)
    assert counter.frame_count == frames

    ours.staged_min_edges += 1
    staged.clear()
    compare(ours, theirs, forward, [x, edge_attr], train=True)
    assert not staged and counter.frame_count > frames


def test_compiled_with_dynamic_shapes_matches_pyg(compare):
    """``dynamic=True`` (a mini-batch loader's new graph every call): PyG's results and gradients
    on graphs of several sizes."""
    torch.manual_seed(0)
    theirs = pyg_nn.GATv2Conv(6, 4, heads=2)
    ours = GATv2Conv(6, 4, heads=2)
    torch._dynamo.reset()
    compiled = torch.compile(lambda layer, x, e: layer(x, e), backend="aot_eager", dynamic=True)
    try:
        for seed, (num_nodes, num_edges) in enumerate([(12, 40), (15, 52), (9, 25)]):
            x = torch.randn(num_nodes, 6, generator=torch.Generator().manual_seed(seed))
            edge_index = make_graph(num_nodes, num_edges, seed=seed)
            forward = lambda layer, x: compiled(layer, x, edge_index) if layer is ours else layer(x, edge_index)  # noqa: E731
            compare(ours, theirs, forward, [x], train=True)
    finally:
        torch._dynamo.reset()


def test_state_dict_and_repr():
    kwargs = dict(heads=2, edge_dim=3, residual=True)
    theirs, ours = pyg_nn.GATv2Conv((5, 4), 3, **kwargs), GATv2Conv((5, 4), 3, **kwargs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    pyg_nn.GATv2Conv((5, 4), 3, **kwargs).load_state_dict(ours.state_dict())
    assert repr(ours) == repr(theirs)


def test_bad_input(small_graph):
    x, edge_index = small_graph
    conv = GATv2Conv(6, 4)
    with pytest.raises(TypeError, match="x:"):
        conv(x.long(), edge_index)
    with pytest.raises(TypeError, match="x:"):
        conv((x, None), edge_index)
    with pytest.raises(ValueError, match="edge_index: source index 1[01][0-9] out of range for num_src=12"):
        conv(x, edge_index + 100)
    # One past the last node is where the spare row lies: refused in the caller's numbers.
    with pytest.raises(ValueError, match="edge_index: destination index 12 out of range for num_dst=12"):
        conv(x, torch.tensor([[0, 1], [1, 12]]))


def test_attention_dropout(small_graph):
    """Dropout draws one mask over the graph's edges: on a graph without stored self loops the
    edges are PyG's, in PyG's order, so the same seed drops the same coefficients as PyG's layer;
    with stored loops (kept in place for a spare row) the mask is over more edges, in that order,
    and the same seed still gives the same output."""
    x, looped_index = small_graph
    assert (looped_index[0] == looped_index[1]).any()
    edge_index, _ = remove_self_loops(looped_index)
    torch.manual_seed(0)
    theirs = pyg_nn.GATv2Conv(6, 4, heads=2, dropout=0.5).train()
    ours = GATv2Conv(6, 4, heads=2, dropout=0.5).train()
    ours.load_state_dict(theirs.state_dict())

    def run(layer, index, seed):
        torch.manual_seed(seed)
        return layer(x, index)

    first = run(ours, edge_index, 1)
    torch.testing.assert_close(first, run(theirs, edge_index, 1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(first, run(ours, edge_index, 2))
    looped = run(ours, looped_index, 1)
    torch.testing.assert_close(run(ours, looped_index, 1), looped, rtol=0, atol=0)
    assert not torch.allclose(looped, ours.eval()(x, looped_index))


def test_interpreter(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    edge_attr = torch.randn(edge_index.size(1), 2, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    compare(
        GATv2Conv(4, 3, heads=2, edge_dim=2),
        pyg_nn.GATv2Conv(4, 3, heads=2, edge_dim=2),
        lambda layer, x, e: layer(x, edge_index, e),
        [x, edge_attr],
        train=True,
    )


@pytest.mark.cuda
@pytest.mark.parametrize("fused_min_edges", [0, FUSED_MIN_EDGES], ids=["fused", "pygs_propagation"])
def test_new_graph_steps_make_no_host_sync(monkeypatch, user_order, fused_min_edges):
    """A sampler's new graph every step, self loops stored in it: training calls wait for the GPU
    nowhere (PyG's layer counts and removes the stored loops), and give PyG's result, also where
    the small graph's propagation runs PyG's (``fused_min_edges``)."""
    monkeypatch.setattr(MessagePassing, "fused_min_edges", fused_min_edges)
    gen = torch.Generator().manual_seed(0)
    ours = GATv2Conv(6, 4, heads=2, edge_dim=3).cuda()
    theirs = pyg_nn.GATv2Conv(6, 4, heads=2, edge_dim=3).cuda()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(200, 6, generator=gen).cuda()

    def new_graph():
        index = torch.randint(0, 200, (2, 1000), generator=gen)
        index[1, ::10] = index[0, ::10]  # stored self loops
        return index.cuda(), torch.randn(1000, 3, generator=gen).cuda()

    for _ in range(3):  # compiles the kernels
        ours(x, *new_graph()).sum().backward()
    graphs = [new_graph() for _ in range(4)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [ours(x, *graph) for graph in graphs]
        for out in outs:
            out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for out, graph in zip(outs, graphs):
        torch.testing.assert_close(out, theirs(x, *graph), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("fused_min_edges", [0, FUSED_MIN_EDGES], ids=["fused", "pygs_propagation"])
def test_seen_graph_step_makes_no_host_sync(monkeypatch, small_graph, fused_min_edges):
    """On an index already seen, a training step of the layer does not synchronise with the host
    (PyG's own GATv2Conv does, removing and adding the self loops), also where the small graph's
    propagation runs PyG's (``fused_min_edges``)."""
    monkeypatch.setattr(MessagePassing, "fused_min_edges", fused_min_edges)
    x, edge_index = (t.cuda() for t in small_graph)
    layer = GATv2Conv(6, 4, heads=2).cuda()
    layer(x, edge_index).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x, edge_index).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("row", ["sources", "destinations"])
def test_an_index_out_of_range_is_refused_without_the_host_check(monkeypatch, flow, row):
    """A GPU index skips the host's check of its range (its graph's check waits for nothing), as
    here an index whose sampler vouched for it: an index equal to the node count is refused all the
    same, also where the layer gives the sources a spare row (target_to_source), which a source
    index there must not reach."""
    monkeypatch.setattr(graph_argument, "checked", lambda edge_index, num_src, num_dst: CheckedIndex(0, 4, 0))
    sources, destinations = [0, 1, 2, 3], [1, 2, 3, 0]
    (sources if row == "sources" else destinations)[3] = 4
    index = torch.tensor([sources, destinations] if flow == "source_to_target" else [destinations, sources])
    layer = GATv2Conv(8, 4, heads=2, flow=flow)
    with pytest.raises((IndexError, ValueError), match="(out of range|larger than)"):
        layer(torch.randn(4, 8), index)
