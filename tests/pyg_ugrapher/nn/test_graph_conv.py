import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.utils import to_torch_csr_tensor

from pyg_ugrapher import ops
from pyg_ugrapher.nn import GraphConv

AGGRS = ["add", "sum", "mean", "max", "min"]


@pytest.mark.parametrize("aggr", AGGRS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_matches_pyg(compare, small_graph, aggr, weighted, train):
    x, edge_index = small_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    compare(
        GraphConv(6, 4, aggr=aggr),
        pyg_nn.GraphConv(6, 4, aggr=aggr),
        lambda layer, x, w: layer(x, edge_index, w if weighted else None),
        [x, weight],
        train=train,
    )


@pytest.mark.parametrize("kwargs", [{"bias": False}, {"flow": "target_to_source"}], ids=["no_bias", "t2s"])
def test_options(compare, small_graph, kwargs):
    x, edge_index = small_graph
    torch.manual_seed(0)
    compare(GraphConv(6, 4, **kwargs), pyg_nn.GraphConv(6, 4, **kwargs), lambda layer, x: layer(x, edge_index), [x])


def test_bipartite(compare, bipartite_graph):
    x_src, x_dst, edge_index = bipartite_graph
    weight = torch.rand(edge_index.size(1))
    torch.manual_seed(0)
    compare(
        GraphConv((6, 5), 4, aggr="mean"),
        pyg_nn.GraphConv((6, 5), 4, aggr="mean"),
        lambda layer, a, b, w: layer((a, b), edge_index, w),
        [x_src, x_dst, weight],
    )


@pytest.mark.parametrize("aggr", ["add", "mean"])
def test_sparse_and_edge_index_types(compare, small_graph, aggr):
    x, edge_index = small_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(5))
    adj_t = to_torch_csr_tensor(edge_index.flip(0), weight, size=(12, 12))
    torch.manual_seed(0)
    compare(GraphConv(6, 4, aggr=aggr), pyg_nn.GraphConv(6, 4, aggr=aggr), lambda layer, x: layer(x, adj_t), [x])
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    compare(
        GraphConv(6, 4, aggr=aggr),
        pyg_nn.GraphConv(6, 4, aggr=aggr),
        lambda layer, x, w: layer(x, index, w),
        [x, weight],
    )


def test_one_op_per_forward(small_graph):
    x, edge_index = small_graph
    conv = GraphConv(6, 4, aggr="max")
    calls = []
    with ops.observe(calls.append):
        conv(x, edge_index, torch.rand(edge_index.size(1)))
        conv(x, edge_index)
    assert [call.op.name for call in calls] == ["u_mul_e_max", "copy_u_max"]


def test_state_dict_round_trip():
    theirs, ours = pyg_nn.GraphConv((5, 4), 3), GraphConv((5, 4), 3)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    pyg_nn.GraphConv((5, 4), 3).load_state_dict(ours.state_dict())
    assert repr(ours) == repr(theirs)


def test_bad_input(small_graph):
    x, edge_index = small_graph
    conv = GraphConv(6, 4)
    with pytest.raises(ValueError, match="edge_weight:"):
        conv(x, edge_index, torch.rand(3))
    with pytest.raises(TypeError, match="edge_weight:"):
        conv(x, edge_index, torch.ones(edge_index.size(1), dtype=torch.long))
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(12, 12))
    with pytest.raises(ValueError, match="edge_weight:"):
        conv(x, adj_t, torch.rand(edge_index.size(1)))
    with pytest.raises(ValueError, match="edge_index:"):
        GraphConv(6, 4, flow="target_to_source")(x, adj_t)


@pytest.mark.parametrize("aggr", ["add", "max"])
def test_interpreter(compare, interpret, tiny_graph, aggr):
    x, edge_index = tiny_graph
    weight = torch.rand(edge_index.size(1))
    torch.manual_seed(0)
    compare(
        GraphConv(4, 3, aggr=aggr),
        pyg_nn.GraphConv(4, 3, aggr=aggr),
        lambda layer, x, w: layer(x, edge_index, w),
        [x, weight],
        train=True,
    )


def test_datasets(compare, dataset):
    torch.manual_seed(0)
    compare(
        GraphConv(dataset.num_features, 16, aggr="mean"),
        pyg_nn.GraphConv(dataset.num_features, 16, aggr="mean"),
        lambda layer, x: layer(x, dataset.edge_index),
        [dataset.x],
        train=True,
    )
