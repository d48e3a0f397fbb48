import pytest
import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.aggr as pyg_aggr
from torch_geometric import EdgeIndex
from torch_geometric.utils import to_torch_csr_tensor

from pyg_ugrapher import ops
from pyg_ugrapher.nn import SAGEConv

from .conftest import config_id

CONFIGS = [
    {},
    {"aggr": "max"},
    {"aggr": "min"},
    {"aggr": "sum"},
    {"aggr": "add"},
    {"root_weight": False},
    {"normalize": True},
    {"project": True},
    {"bias": False},
    {"flow": "target_to_source"},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=config_id)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_matches_pyg(compare, small_graph, kwargs, train):
    x, edge_index = small_graph
    torch.manual_seed(0)
    compare(
        SAGEConv(6, 4, **kwargs),
        pyg_nn.SAGEConv(6, 4, **kwargs),
        lambda layer, x: layer(x, edge_index),
        [x],
        train=train,
    )


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_bipartite(compare, bipartite_graph, aggr):
    x_src, x_dst, edge_index = bipartite_graph
    torch.manual_seed(0)
    compare(
        SAGEConv((6, 5), 4, aggr=aggr),
        pyg_nn.SAGEConv((6, 5), 4, aggr=aggr),
        lambda layer, a, b: layer((a, b), edge_index),
        [x_src, x_dst],
    )
    compare(
        SAGEConv((6, 5), 4, aggr=aggr),
        pyg_nn.SAGEConv((6, 5), 4, aggr=aggr),
        lambda layer, a: layer((a, None), edge_index, size=(10, 7)),
        [x_src],
    )


@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
def test_sparse_and_edge_index_types(compare, small_graph, aggr):
    x, edge_index = small_graph
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(12, 12))
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    for graph in (adj_t, adj_t.to_sparse_coo(), index):
        torch.manual_seed(0)
        compare(SAGEConv(6, 4, aggr=aggr), pyg_nn.SAGEConv(6, 4, aggr=aggr), lambda layer, x: layer(x, graph), [x])


def test_one_op_per_forward(small_graph):
    x, edge_index = small_graph
    calls = []
    with ops.observe(calls.append):
        SAGEConv(6, 4, aggr="max")(x, edge_index)
    assert [call.op.name for call in calls] == ["copy_u_max"]


def test_state_dict_round_trip():
    theirs, ours = pyg_nn.SAGEConv((5, 4), 3, project=True), SAGEConv((5, 4), 3, project=True)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    pyg_nn.SAGEConv((5, 4), 3, project=True).load_state_dict(ours.state_dict())
    assert repr(ours) == repr(theirs)


def test_bad_input(small_graph):
    x, edge_index = small_graph
    with pytest.raises(ValueError, match="x:"):
        SAGEConv(6, 4)((x, x, x), edge_index)
    with pytest.raises(ValueError, match="size:"):
        SAGEConv(6, 4)(x, edge_index, size=(12, 5))
    with pytest.raises(ValueError, match="edge_index:"):
        SAGEConv(6, 4)(x, edge_index + 20)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_interpreter(compare, interpret, tiny_graph, aggr):
    x, edge_index = tiny_graph
    torch.manual_seed(0)
    compare(
        SAGEConv(4, 3, aggr=aggr),
        pyg_nn.SAGEConv(4, 3, aggr=aggr),
        lambda layer, x: layer(x, edge_index),
        [x],
        train=True,
    )


def test_datasets(compare, dataset):
    torch.manual_seed(0)
    compare(
        SAGEConv(dataset.num_features, 16),
        pyg_nn.SAGEConv(dataset.num_features, 16),
        lambda layer, x: layer(x, dataset.edge_index),
        [dataset.x],
        train=True,
    )


AGGREGATIONS = {
    "lstm": lambda: "lstm",
    "softmax": lambda: "softmax",
    "list": lambda: ["mean", "max", "sum", "std"],
    "module": lambda: pyg_aggr.MLPAggregation(6, 6, max_num_elements=3, num_layers=1),
    "multi_module": lambda: pyg_aggr.MultiAggregation(
        ["mean", "max"], mode="proj", mode_kwargs={"in_channels": 6, "out_channels": 6}
    ),
}


@pytest.mark.parametrize("aggr", list(AGGREGATIONS))
def test_aggregations_beyond_the_gather_ops(compare, aggr):
    """Aggregations that are not a gather op of the IR are built as PyG builds them (same
    parameters and state_dict keys) and run through PyG's propagation, with the reason recorded;
    the softmax aggregation is captured (three gathers), and so are lists of aggregations, each
    part a gather of the captured message."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 6, generator=gen)
    # Sorted by destination, as PyG's sequence aggregations (LSTM, MLP) require.
    edge_index = torch.tensor([[1, 2, 0, 3, 0, 4, 6, 5, 1], [0, 0, 1, 1, 2, 2, 3, 4, 4]])
    torch.manual_seed(0)
    ours = SAGEConv(6, 4, aggr=AGGREGATIONS[aggr]())
    torch.manual_seed(0)
    theirs = pyg_nn.SAGEConv(6, 4, aggr=AGGREGATIONS[aggr]())
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x], train=True)
    if aggr in ("softmax", "list", "multi_module"):
        assert ours.fallback_reason is None and ours.staged_reason is None and ours.capture is not None
    else:
        assert ours.fallback_reason is not None and "aggregation" in ours.fallback_reason


@pytest.mark.parametrize("aggr,error,match", [(3, TypeError, "^aggr: expected a name"), ("foo", ValueError, "^aggr: ")])
def test_bad_aggregations_are_refused_by_name(aggr, error, match):
    with pytest.raises(error, match=match):
        SAGEConv(8, 16, aggr=aggr)
