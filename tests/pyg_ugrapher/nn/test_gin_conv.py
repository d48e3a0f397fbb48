import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.utils import to_torch_csr_tensor

from pyg_ugrapher import ops
from pyg_ugrapher.nn import GINConv, GINEConv


def _mlp(in_channels, out_channels=4):
    return torch.nn.Sequential(torch.nn.Linear(in_channels, 8), torch.nn.ReLU(), torch.nn.Linear(8, out_channels))


def _pair(cls_ours, cls_theirs, in_channels, **kwargs):
    torch.manual_seed(0)
    theirs = cls_theirs(_mlp(in_channels), **kwargs)
    return cls_ours(_mlp(in_channels), **kwargs), theirs


GIN_CONFIGS = [{}, {"eps": 0.3}, {"eps": 0.3, "train_eps": True}, {"aggr": "mean"}, {"aggr": "max"}]


@pytest.mark.parametrize("kwargs", GIN_CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_gin_matches_pyg(compare, small_graph, kwargs, train):
    x, edge_index = small_graph
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6, **kwargs)
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x], train=train)


def test_gin_bipartite_and_graph_types(compare, small_graph, bipartite_graph):
    x_src, _, edge_index = bipartite_graph
    x_dst = torch.randn(7, 6)
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6, train_eps=True)
    compare(ours, theirs, lambda layer, a, b: layer((a, b), edge_index), [x_src, x_dst])
    x, edge_index = small_graph
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(12, 12))
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    for graph in (adj_t, index):
        ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6)
        compare(ours, theirs, lambda layer, x: layer(x, graph), [x])


GINE_CONFIGS = [{}, {"edge_dim": 3}, {"edge_dim": 3, "train_eps": True, "eps": 0.1}]


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_gin_default_is_one_sum_over_the_graph_with_self_loops(compare, small_graph, flow):
    """With a fixed epsilon of 0 the sum and x's own term are one ``copy_u_sum`` over E + N edges
    (stored self loops and duplicates included, as PyG's sum counts them)."""
    x, edge_index = small_graph
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6, flow=flow)
    calls = []
    with ops.observe(calls.append):
        ours(x, edge_index)
    assert [(call.op.name, call.graph.num_edges) for call in calls] == [("copy_u_sum", edge_index.size(1) + 12)]
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x], train=True)


def test_gin_epsilon_loaded_or_changed_later_is_read_again(compare, small_graph):
    """The looped sum is chosen by the value of the ``eps`` buffer, re-read when it changes: a
    state dict with another epsilon, or an in-place write, goes back to the separate term."""
    x, edge_index = small_graph
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6)
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x])
    theirs.eps.fill_(0.25)
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x])  # loads eps = 0.25
    calls = []
    with ops.observe(calls.append):
        ours(x, edge_index)
    assert [call.graph.num_edges for call in calls] == [edge_index.size(1)]
    ours.eps.zero_()
    theirs.eps.zero_()
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x])
    with ops.observe(calls.append):
        ours(x, edge_index)
    assert calls[-1].graph.num_edges == edge_index.size(1) + 12


def test_gin_epsilon_reset_after_a_forward_is_read_again(small_graph):
    """``reset_parameters`` after a forward at eps = 0 (the looped sum) sets ``initial_eps``: the
    next forward uses it, as PyG's layer with the same state does."""
    x, edge_index = small_graph
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, 6)
    ours(x, edge_index)
    ours.initial_eps = 0.5
    ours.reset_parameters()
    assert ours.eps.item() == 0.5
    theirs.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", GINE_CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_gine_matches_pyg(compare, small_graph, kwargs, train):
    x, edge_index = small_graph
    edge_attr = torch.randn(edge_index.size(1), kwargs.get("edge_dim", 6), generator=torch.Generator().manual_seed(9))
    ours, theirs = _pair(GINEConv, pyg_nn.GINEConv, 6, **kwargs)
    compare(ours, theirs, lambda layer, x, e: layer(x, edge_index, e), [x, edge_attr], train=train)


def test_gine_one_fused_op(small_graph):
    x, edge_index = small_graph
    conv = GINEConv(_mlp(6))
    calls = []
    with ops.observe(calls.append):
        conv(x, edge_index, torch.randn(edge_index.size(1), 6))
    assert [call.op.name for call in calls] == ["relu((u0 + e1))_sum"]


def test_gine_bipartite(compare, bipartite_graph):
    x_src, _, edge_index = bipartite_graph
    edge_attr = torch.randn(edge_index.size(1), 2)
    ours, theirs = _pair(GINEConv, pyg_nn.GINEConv, 6, edge_dim=2)
    compare(ours, theirs, lambda layer, a, b, e: layer((a, b), edge_index, e), [x_src, torch.randn(7, 6), edge_attr])


def test_state_dict_round_trip():
    for ours, theirs in (
        _pair(GINConv, pyg_nn.GINConv, 5, train_eps=True),
        _pair(GINEConv, pyg_nn.GINEConv, 5, edge_dim=2),
    ):
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        ours.load_state_dict(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        assert repr(ours) == repr(theirs)


def test_bad_input(small_graph):
    x, edge_index = small_graph
    conv = GINEConv(_mlp(6))
    with pytest.raises(ValueError, match="edge_attr:"):
        conv(x, edge_index)
    with pytest.raises(ValueError, match="edge_attr:"):
        conv(x, edge_index, torch.randn(edge_index.size(1), 3))
    with pytest.raises(ValueError, match="edge_attr:"):
        conv(x, edge_index, torch.randn(4, 6))
    with pytest.raises(ValueError, match="nn:"):
        GINEConv(torch.nn.ReLU(), edge_dim=3)


@pytest.mark.parametrize("train_eps", [False, True], ids=["eps0", "train_eps"])
def test_gin_static_graph(compare, static_graph, train_eps):
    """A static graph's ``[B, N, F]`` features (PyG's ``node_dim=-2``): the default path (a sum over
    the graph with self loops) and the one that adds ``(1 + eps) x``."""
    x, edge_index, _ = static_graph
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    out = compare(
        GINConv(copy.deepcopy(mlp), train_eps=train_eps),
        pyg_nn.GINConv(mlp, train_eps=train_eps),
        lambda layer, x: layer(x, edge_index),
        [x],
        train=True,
    )
    assert out[0].shape == (3, 12, 4)


@pytest.mark.parametrize("edge_dim", [None, 3], ids=["same_width", "edge_dim"])
def test_gine_static_graph(compare, static_graph, edge_dim):
    """Edge features ``[E, F]`` are shared by the feature matrices of a static graph's batch."""
    x, edge_index, edge_attr = static_graph
    edge_attr = edge_attr[:, :3] if edge_dim else edge_attr
    torch.manual_seed(0)
    mlp = torch.nn.Linear(6, 4)
    compare(
        GINEConv(copy.deepcopy(mlp), edge_dim=edge_dim),
        pyg_nn.GINEConv(mlp, edge_dim=edge_dim),
        lambda layer, x, e: layer(x, edge_index, e),
        [x, edge_attr],
        train=True,
    )


def test_static_graph_interpreted(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    batch = torch.stack([x, x.flip(0)])
    edge_attr = torch.randn(edge_index.size(1), 4, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    mlp = torch.nn.Linear(4, 3)
    compare(GINConv(copy.deepcopy(mlp)), pyg_nn.GINConv(mlp), lambda layer, x: layer(x, edge_index), [batch])
    compare(
        GINEConv(copy.deepcopy(mlp)),
        pyg_nn.GINEConv(mlp),
        lambda layer, x, e: layer(x, edge_index, e),
        [batch, edge_attr],
    )


def test_interpreter(compare, interpret, tiny_graph):
    x, edge_index = tiny_graph
    for kwargs in ({"train_eps": True}, {}):  # a separate term, and the sum over self loops
        ours, theirs = _pair(GINConv, pyg_nn.GINConv, 4, **kwargs)
        compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x], train=True)
    edge_attr = torch.randn(edge_index.size(1), 2)
    ours, theirs = _pair(GINEConv, pyg_nn.GINEConv, 4, edge_dim=2)
    compare(ours, theirs, lambda layer, x, e: layer(x, edge_index, e), [x, edge_attr], train=True)


def test_datasets(compare, dataset):
    ours, theirs = _pair(GINConv, pyg_nn.GINConv, dataset.num_features, train_eps=True)
    compare(ours, theirs, lambda layer, x: layer(x, dataset.edge_index), [dataset.x], train=True)
