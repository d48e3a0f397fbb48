import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.utils import remove_self_loops, to_torch_csr_tensor

from pyg_ugrapher import ops
from pyg_ugrapher.nn import GATConv

from .conftest import config_id

CONFIGS = [
    {},
    {"heads": 3},
    {"heads": 3, "concat": False},
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
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, **kwargs)
    compare(
        GATConv(6, 4, **kwargs),
        theirs,
        lambda layer, x, edge_attr: layer(x, edge_index, edge_attr if "edge_dim" in kwargs else None),
        [x, edge_attr],
        train=train,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["lin_src_dst", "shared_lin"])
def test_bipartite(compare, bipartite_graph, shared):
    x_src, x_dst, edge_index = bipartite_graph
    if shared:
        x_dst = torch.randn(7, 6)
    in_channels = 6 if shared else (6, 5)
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(in_channels, 4, heads=2, residual=True)
    compare(
        GATConv(in_channels, 4, heads=2, residual=True),
        theirs,
        lambda layer, a, b: layer((a, b), edge_index),
        [x_src, x_dst],
    )


LAZY = [(-1, None, 6, None), ((-1, -1), None, (6, 6), None), (6, -1, 6, 3)]  # ours', then PyG's sizes


@pytest.mark.parametrize(
    "in_channels,edge_dim,their_in,their_edge_dim", LAZY, ids=["lazy", "lazy_bipartite", "lazy_edge_dim"]
)
def test_lazy_sizes(compare, small_graph, in_channels, edge_dim, their_in, their_edge_dim):
    """PyG's lazy sizes (-1): the first call gives the projections their shape (the edge
    projection, never applied to the edge features, in the attention), and the attention vectors
    fold into them from that call on."""
    x, edge_index = small_graph
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    forward = (lambda layer, x, e: layer(x, edge_index, e)) if edge_dim else (lambda layer, x: layer(x, edge_index))
    inputs = [x, edge_attr] if edge_dim else [x]
    torch.manual_seed(0)
    ours = GATConv(in_channels, 4, heads=2, edge_dim=edge_dim)
    assert forward(ours, *inputs).shape == (x.size(0), 8)
    theirs = pyg_nn.GATConv(their_in, 4, heads=2, edge_dim=their_edge_dim)
    theirs.load_state_dict(ours.state_dict())
    compare(ours, theirs, forward, inputs, train=True)


def test_bipartite_without_target_features(compare, bipartite_graph):
    x_src, _, edge_index = bipartite_graph
    torch.manual_seed(0)
    compare(
        GATConv((6, 5), 4, heads=2),
        pyg_nn.GATConv((6, 5), 4, heads=2),
        lambda layer, a: layer((a, None), edge_index, size=(10, 7)),
        [x_src],
    )


#: Configurations that add self loops, and the aggregations and loop features they may read.
COMPILED_CONFIGS = [kwargs for kwargs in CONFIGS if kwargs.get("add_self_loops", True)] + [
    {"heads": 2, "aggr": "mean"},
    {"heads": 2, "aggr": "max", "flow": "target_to_source"},
    {"heads": 2, "edge_dim": 3, "fill_value": "add"},
    {"heads": 2, "edge_dim": 3, "fill_value": "mul"},
    {"heads": 2, "edge_dim": 3, "fill_value": torch.tensor([0.5, -1.0, 2.0])},
]


@pytest.mark.parametrize("kwargs", COMPILED_CONFIGS, ids=config_id)
def test_compiled_matches_pyg(compare, compile_ours, small_graph, kwargs):
    """Compiled, stored self loops are replaced as PyG replaces them, and the layer is one graph:
    the looped graph's sizes do not depend on the data."""
    x, edge_index = small_graph
    edge_attr = torch.randn(edge_index.size(1), 3, generator=torch.Generator().manual_seed(4))
    assert (edge_index[0] == edge_index[1]).sum() >= 2
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, **kwargs)
    ours = GATConv(6, 4, **kwargs)
    forward, counter = compile_ours(
        lambda layer, x, edge_attr: layer(x, edge_index, edge_attr if "edge_dim" in kwargs else None), ours
    )
    compare(ours, theirs, forward, [x, edge_attr], train=True)
    assert counter.frame_count == 1


def test_compiled_bipartite_with_loops(compare, compile_ours):
    """A bipartite graph whose sources and destinations share low ids: its ``u == v`` edges are
    replaced by loops on the first ``min(num_src, num_dst)`` nodes, as in PyG."""
    edge_index = torch.tensor([[0, 3, 3, 9, 5, 5, 1, 8, 1, 2, 7], [0, 3, 2, 6, 5, 5, 4, 1, 0, 3, 5]])
    generator = torch.Generator().manual_seed(6)
    x_src, x_dst = torch.randn(10, 6, generator=generator), torch.randn(7, 5, generator=generator)
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv((6, 5), 4, heads=2)
    ours = GATConv((6, 5), 4, heads=2)
    forward, counter = compile_ours(lambda layer, a, b: layer((a, b), edge_index), ours)
    compare(ours, theirs, forward, [x_src, x_dst], train=True)
    assert counter.frame_count == 1


def test_compiled_interpreter(compare, compile_ours, interpret, tiny_graph):
    x, edge_index = tiny_graph
    edge_attr = torch.randn(edge_index.size(1), 2, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(4, 3, heads=2, edge_dim=2)
    ours = GATConv(4, 3, heads=2, edge_dim=2)
    forward, counter = compile_ours(lambda layer, x, e: layer(x, edge_index, e), ours)
    compare(ours, theirs, forward, [x, edge_attr], train=True)
    assert counter.frame_count == 1


def test_return_attention_weights(compare, small_graph):
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, heads=2)

    def forward(layer, x):
        out, (index, alpha) = layer(x, edge_index, return_attention_weights=True)
        return out, index, alpha

    compare(GATConv(6, 4, heads=2), theirs, forward, [x])


@pytest.mark.parametrize("executor", ["reference", "interpreter"])
def test_returned_weights_leave_the_output_as_it_is(request, small_graph, tiny_graph, executor):
    """The output of a call that returns the coefficients is the plain call's, bit for bit (PyG's
    own test compares them with ``torch.allclose``'s default tolerance)."""
    if executor == "interpreter":
        request.getfixturevalue("interpret")
    x, edge_index = tiny_graph if executor == "interpreter" else small_graph
    torch.manual_seed(0)
    layer = GATConv(x.size(1), 3, heads=2).eval()
    out, (index, alpha) = layer(x, edge_index, return_attention_weights=True)
    assert torch.equal(out, layer(x, edge_index))
    assert alpha.shape == (index.size(1), 2) and torch.allclose(
        torch.zeros(x.size(0), 2).index_add_(0, index[1], alpha), torch.ones(x.size(0), 2)
    )


def test_returned_index_is_the_callers_own(small_graph):
    """The looped edge index returned with the coefficients is a new tensor every call, as PyG's:
    the layer caches its looped graph, and a caller that changed the returned index in place
    changed what the next call returned."""
    x, edge_index = small_graph
    layer = GATConv(6, 4, heads=2)
    _, (first, _) = layer(x, edge_index, return_attention_weights=True)
    expected = first.clone()
    first += 1
    out, (second, _) = layer(x, edge_index, return_attention_weights=True)
    assert second is not first
    torch.testing.assert_close(second, expected, rtol=0, atol=0)
    torch.testing.assert_close(out, layer(x, edge_index), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("aggr", ["add", "mean"], ids=["fused", "separate_ops"])
def test_gradient_penalty_matches_pyg(small_graph, aggr):
    """A double backward (a gradient penalty on the input, the upstream gradient a constant) gives
    PyG's parameter and input gradients on both attention paths: the fused softmax and the
    projection's attention halves dropped their second-order terms without an error."""
    x0, edge_index = small_graph
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, heads=2, aggr=aggr).double()
    ours = GATConv(6, 4, heads=2, aggr=aggr).double()
    ours.load_state_dict(theirs.state_dict())
    weights = torch.randn(x0.size(0), 8, dtype=torch.float64)
    found = []
    for layer in (ours, theirs):
        x = x0.double().clone().requires_grad_()
        out = layer(x, edge_index, return_attention_weights=True)[0] if aggr == "mean" else layer(x, edge_index)
        (grad,) = torch.autograd.grad((out * weights).sum(), x, create_graph=True)
        grad.square().sum().backward()
        found.append([x.grad] + [p.grad for p in layer.parameters()])
    assert found[0][0] is not None and ours.att_src.grad is not None
    for a, b in zip(*found):
        assert (a is None) == (b is None)  # the bias has no second-order term in either
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_edge_index_type(compare, small_graph):
    x, edge_index = small_graph
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    compare(GATConv(6, 4, heads=2), pyg_nn.GATConv(6, 4, heads=2), lambda layer, x: layer(x, index), [x])


@pytest.mark.parametrize("loops", [True, False], ids=["loops", "no_loops"])
def test_sparse_adjacency(compare, small_graph, loops):
    x, edge_index = small_graph
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(12, 12))

    def forward(layer, x):
        out, (adj, alpha) = layer(x, adj_t, return_attention_weights=True)
        return out, adj.to_dense(), alpha

    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, heads=2, add_self_loops=loops)
    compare(GATConv(6, 4, heads=2, add_self_loops=loops), theirs, forward, [x])


def test_attention_dropout(small_graph):
    x, looped_index = small_graph
    assert (looped_index[0] == looped_index[1]).any()
    # The returned coefficients are in PyG's edge order, with stored self loops removed; the fused
    # path's drop mask is in the order of the graph that keeps them in a spare row: the same seed
    # drops the same coefficients on a graph without stored loops.
    edge_index, _ = remove_self_loops(looped_index)
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(6, 4, heads=2, dropout=0.5)
    ours = GATConv(6, 4, heads=2, dropout=0.5)
    ours.load_state_dict(theirs.state_dict())

    def run(layer, seed):
        torch.manual_seed(seed)
        return layer(x, edge_index, return_attention_weights=True)

    ours.train()
    theirs.train()
    first, (_, alpha) = run(ours, 1)
    again, (_, alpha_again) = run(ours, 1)
    other, _ = run(ours, 2)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.testing.assert_close(alpha, alpha_again, rtol=0, atol=0)
    assert not torch.allclose(first, other)
    assert (alpha == 0).any()
    ours.eval()
    assert not torch.allclose(first, ours(x, edge_index))
    # The coefficients have PyG's shape and edge order, so the same seed drops the same ones.
    pyg_out, (_, pyg_alpha) = run(theirs, 1)
    torch.testing.assert_close(first, pyg_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha, pyg_alpha, rtol=1e-5, atol=1e-6)
    # Without return_attention_weights the fused path (softmax_aggregate) drops the same
    # coefficients: the same seed gives the same output, up to rounding.
    ours.train()
    torch.manual_seed(1)
    torch.testing.assert_close(ours(x, edge_index), first, rtol=1e-5, atol=1e-6)
    # With stored loops the fused path drops by its seed too.
    torch.manual_seed(1)
    looped = ours(x, looped_index)
    torch.manual_seed(1)
    torch.testing.assert_close(ours(x, looped_index), looped, rtol=0, atol=0)
    assert not torch.allclose(looped, ours.eval()(x, looped_index))


def test_ops_per_forward(small_graph):
    """Three IR ops (:func:`~pyg_ugrapher.attention.softmax_aggregate`'s, each computing the
    logits from the node halves itself), and no [E, H] or [E, H, C] tensor goes into or comes
    out of any of them."""
    x, edge_index = small_graph
    heads, channels = 2, 4
    conv = GATConv(6, channels, heads=heads)
    calls = []
    with ops.observe(calls.append):
        conv(x, edge_index)
    names = [call.op.name for call in calls]
    assert names == [
        "leaky_relu((u0 + v1), 0.2)_max",
        "exp((leaky_relu((u0 + v1), 0.2) - v2))_sum",
        "(u0 * exp((leaky_relu((u1 + v2), 0.2) - v3)))_sum",
    ]
    num_edges = calls[0].graph.num_edges
    assert num_edges > max(call.graph.num_src for call in calls)
    for call in calls:
        assert all(operand.shape[0] != num_edges for operand in call.operands)


def test_state_dict_round_trip():
    kwargs = dict(heads=2, edge_dim=3, residual=True)
    theirs, ours = pyg_nn.GATConv((5, 4), 3, **kwargs), GATConv((5, 4), 3, **kwargs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    pyg_nn.GATConv((5, 4), 3, **kwargs).load_state_dict(ours.state_dict())
    assert repr(ours) == repr(theirs)


def test_bad_input(small_graph):
    x, edge_index = small_graph
    conv = GATConv(6, 4, edge_dim=3)
    with pytest.raises(ValueError, match="edge_attr:"):
        conv(x, edge_index, torch.randn(5, 3))
    with pytest.raises(ValueError, match="size:"):
        conv((x, x[:5]), edge_index, size=(12, 12))
    with pytest.raises(TypeError, match="x:"):
        conv(x.long(), edge_index)
    with pytest.raises(ValueError, match="dropout:"):
        GATConv(6, 4, dropout=1.5)


def test_interpreter(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    edge_attr = torch.randn(edge_index.size(1), 2, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(4, 3, heads=2, edge_dim=2)
    compare(
        GATConv(4, 3, heads=2, edge_dim=2),
        theirs,
        lambda layer, x, e: layer(x, edge_index, e),
        [x, edge_attr],
        train=True,
    )


def test_interpreter_attention(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph

    def forward(layer, x):
        out, (index, alpha) = layer(x, edge_index, return_attention_weights=True)
        return out, index, alpha

    torch.manual_seed(0)
    compare(GATConv(4, 3, heads=2), pyg_nn.GATConv(4, 3, heads=2), forward, [x])


def test_datasets(compare, dataset):
    torch.manual_seed(0)
    compare(
        GATConv(dataset.num_features, 8, heads=2),
        pyg_nn.GATConv(dataset.num_features, 8, heads=2),
        lambda layer, x: layer(x, dataset.edge_index),
        [dataset.x],
        train=True,
    )


@pytest.mark.parametrize("loops", [True, False], ids=["loops", "no_loops"])
def test_graph_without_edges(compare, small_graph, loops):
    x, _ = small_graph
    empty = torch.empty(2, 0, dtype=torch.long)
    torch.manual_seed(0)
    compare(
        GATConv(6, 4, heads=2, add_self_loops=loops),
        pyg_nn.GATConv(6, 4, heads=2, add_self_loops=loops),
        lambda layer, x: layer(x, empty),
        [x],
    )
