"""Partitions, one rank's share of a graph, seed shards and bad inputs, in one process.

Several processes are tested in ``test_multiprocess.py``; here a partition of one part (no
process group) must reproduce the layers on the whole graph, and the records must say what they
hold.
"""

import socket

import pytest
import torch
import torch.distributed as dist

from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher.distributed import (
    DistributedGraph,
    HaloPlan,
    Worker,
    aggregate_first,
    halo_exchange,
    init_from_env,
    layer_forward,
    metis_available,
    partition_graph,
    seed_batches,
)

NUM_NODES = 120


@pytest.fixture(scope="module")
def edge_index() -> torch.Tensor:
    """Random edges with self loops and duplicates; vertex 7 has no edge."""
    generator = torch.Generator().manual_seed(0)
    edges = torch.randint(0, NUM_NODES, (2, 700), generator=generator)
    edges[:, ::9] = edges[0, ::9]
    edges = torch.cat([edges, edges[:, :40]], dim=1)
    return edges[:, (edges != 7).all(0)]


@pytest.mark.parametrize("method", ["contiguous", "random"])
@pytest.mark.parametrize("num_parts", [1, 3])
def test_partition_records(edge_index, method, num_parts):
    partition = partition_graph(edge_index, NUM_NODES, num_parts, method, seed=1)
    assert partition.method == method and partition.num_parts == num_parts and partition.num_nodes == NUM_NODES
    assert sum(partition.sizes) == NUM_NODES and max(partition.sizes) - min(partition.sizes) <= 1
    for part in range(num_parts):
        nodes = partition.nodes(part)
        assert nodes.numel() == partition.sizes[part]
        assert torch.equal(partition.assignment[nodes], torch.full_like(nodes, part))
        assert torch.equal(partition.local_index[nodes], torch.arange(nodes.numel()))
    cut = (partition.assignment[edge_index[0]] != partition.assignment[edge_index[1]]).sum()
    assert partition.cut_edges == int(cut)
    assert (partition.cut_edges == 0) == (num_parts == 1)


def test_contiguous_and_random_splits(edge_index):
    contiguous = partition_graph(edge_index, NUM_NODES, 4, "contiguous")
    assert torch.equal(contiguous.nodes(1), torch.arange(30, 60))
    first, again = (partition_graph(edge_index, NUM_NODES, 4, "random", seed=5) for _ in range(2))
    other = partition_graph(edge_index, NUM_NODES, 4, "random", seed=6)
    assert torch.equal(first.assignment, again.assignment)
    assert not torch.equal(first.assignment, other.assignment)


@pytest.mark.skipif(not metis_available(), reason="needs pymetis")
def test_metis_cuts_fewer_edges_than_a_random_split():
    # Two dense clusters joined by three edges: METIS finds them.
    generator = torch.Generator().manual_seed(0)
    left = torch.randint(0, 50, (2, 400), generator=generator)
    edges = torch.cat([left, left + 50, torch.tensor([[0, 60, 10], [70, 3, 99]])], dim=1)
    metis = partition_graph(edges, 100, 2, "metis")
    assert metis.method == "metis" and metis.cut_edges <= 3
    assert metis.cut_edges < partition_graph(edges, 100, 2, "random").cut_edges


def test_auto_method(edge_index):
    expected = "metis" if metis_available() else "contiguous"
    assert partition_graph(edge_index, NUM_NODES, 2).method == expected


def test_bad_partition_arguments(edge_index):
    with pytest.raises(ValueError, match="num_parts"):
        partition_graph(edge_index, NUM_NODES, NUM_NODES + 1)
    with pytest.raises(TypeError, match="num_parts"):
        partition_graph(edge_index, NUM_NODES, 2.0)
    with pytest.raises(ValueError, match="method"):
        partition_graph(edge_index, NUM_NODES, 2, "spectral")
    with pytest.raises(ValueError, match="edge_index"):
        partition_graph(edge_index, 50, 2)
    with pytest.raises(ValueError, match="edge_index"):
        partition_graph(edge_index[0], NUM_NODES, 2)
    with pytest.raises(TypeError, match="edge_index"):
        partition_graph(edge_index.float(), NUM_NODES, 2)
    if not metis_available():
        with pytest.raises(ValueError, match="pymetis"):
            partition_graph(edge_index, NUM_NODES, 2, "metis")
    with pytest.raises(ValueError, match="part"):
        partition_graph(edge_index, NUM_NODES, 2).nodes(2)


def test_one_part_is_the_whole_graph(edge_index):
    graph = DistributedGraph.from_partition(edge_index, partition_graph(edge_index, NUM_NODES, 1))
    assert (graph.rank, graph.world_size, graph.num_local, graph.num_halo) == (0, 1, NUM_NODES, 0)
    assert torch.equal(graph.edge_index, edge_index) and torch.equal(graph.nodes, torch.arange(NUM_NODES))
    assert graph.plan.num_send == graph.plan.num_recv == 0
    assert halo_exchange(torch.ones(NUM_NODES, 3), graph.plan).shape == (0, 3)
    assert (graph.graph.num_src, graph.graph.num_dst, graph.graph.num_edges) == (
        NUM_NODES,
        NUM_NODES,
        edge_index.size(1),
    )


@pytest.mark.parametrize("input_grad", [False, True], ids=["features", "hidden"])
@pytest.mark.parametrize(
    "layer",
    [
        "gcn",
        "gcn_plain",
        "gcn_no_loops",
        "sage",
        "sage_sum_normalized",
        "sage_max",
        "sage_hooked",
        "graph",
        "gin",
        "gat",
        "gatv2",
        "lazy",
    ],
)
def test_one_part_layers_equal_the_whole_graph_layers(edge_index, layer, input_grad, check_close):
    """Outputs and gradients; an input that needs no gradient is aggregated before the product
    (6 input features against 5 outputs), one that does after it."""
    conv = {
        "gcn": lambda: ug_nn.GCNConv(6, 5),
        "gcn_plain": lambda: ug_nn.GCNConv(6, 5, normalize=False),
        "gcn_no_loops": lambda: ug_nn.GCNConv(6, 5, add_self_loops=False),
        "sage": lambda: ug_nn.SAGEConv(6, 5),
        "sage_sum_normalized": lambda: ug_nn.SAGEConv(6, 5, aggr="sum", normalize=True, root_weight=False),
        "sage_max": lambda: ug_nn.SAGEConv(6, 5, aggr="max"),
        "sage_hooked": lambda: hooked(ug_nn.SAGEConv(6, 5)),  # PyG's propagation, as a bipartite call
        "graph": lambda: ug_nn.GraphConv(6, 5),
        "gin": lambda: ug_nn.GINConv(torch.nn.Linear(6, 5), train_eps=True),
        "gat": lambda: ug_nn.GATConv(6, 5, heads=2, concat=False),
        "gatv2": lambda: ug_nn.GATv2Conv(6, 5, heads=2, concat=False, share_weights=True),
        "lazy": lambda: ug_nn.GCNConv(-1, 5),
    }[layer]
    graph = DistributedGraph.from_partition(edge_index, partition_graph(edge_index, NUM_NODES, 1))
    x, weights = torch.randn(NUM_NODES, 6), torch.randn(NUM_NODES, 5)
    results = []
    for run in ("partitioned", "whole"):
        torch.manual_seed(0)
        module = conv()
        features = x.clone().requires_grad_(input_grad)
        out = layer_forward(module, features, graph) if run == "partitioned" else module(features, edge_index)
        (out * weights).sum().backward()  # not pow(2): normalised rows have a constant norm
        grads = [p.grad for p in module.parameters()] + ([features.grad] if input_grad else [])
        results.append((out.detach(), grads))
    (ours, our_grads), (expected, expected_grads) = results
    check_close(ours, expected, context=layer)
    assert len(our_grads) == len(expected_grads)
    for index, (grad, reference) in enumerate(zip(our_grads, expected_grads)):
        check_close(grad, reference, context=f"{layer} gradient {index}")


@pytest.mark.parametrize("input_grad", [False, True], ids=["features", "hidden"])
@pytest.mark.parametrize(
    "layer",
    [
        "gine",
        "gat",
        "gatv2",
        "gcn_weighted",
        "gcn_weighted_improved",
        "gcn_weighted_no_loops",
        "gcn_weighted_plain",
        "graph_weighted",
        "graph_weighted_max",
    ],
)
def test_one_part_layers_with_edge_features_equal_the_whole_graph_layers(edge_index, layer, input_grad, check_close):
    """The local edges' features and weights (``edge_attr[graph.edge_ids]``) reach the layers that
    take them, gradients included; GAT's self loops take the mean of each vertex's incoming edge
    features, GCN's the weight of a stored loop (the graph has some, and duplicates)."""
    conv, keyword, dim = {
        "gine": (lambda: ug_nn.GINEConv(torch.nn.Linear(6, 5), train_eps=True, edge_dim=3), "edge_attr", 3),
        "gat": (lambda: ug_nn.GATConv(6, 5, heads=2, concat=False, edge_dim=3), "edge_attr", 3),
        "gatv2": (lambda: ug_nn.GATv2Conv(6, 5, heads=2, concat=False, edge_dim=3), "edge_attr", 3),
        "gcn_weighted": (lambda: ug_nn.GCNConv(6, 5), "edge_weight", None),
        "gcn_weighted_improved": (lambda: ug_nn.GCNConv(6, 5, improved=True), "edge_weight", None),
        "gcn_weighted_no_loops": (lambda: ug_nn.GCNConv(6, 5, add_self_loops=False), "edge_weight", None),
        "gcn_weighted_plain": (lambda: ug_nn.GCNConv(6, 5, normalize=False), "edge_weight", None),
        "graph_weighted": (lambda: ug_nn.GraphConv(6, 5, aggr="mean"), "edge_weight", None),
        "graph_weighted_max": (lambda: ug_nn.GraphConv(6, 5, aggr="max"), "edge_weight", None),
    }[layer]
    # Edges listed out of order, so that a local edge's position differs from its id.
    edges = edge_index[:, torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(1))]
    graph = DistributedGraph.from_partition(edges, partition_graph(edges, NUM_NODES, 1))
    x, weights = torch.randn(NUM_NODES, 6), torch.randn(NUM_NODES, 5)
    edge_values = torch.randn(edges.size(1), dim) if dim else torch.rand(edges.size(1)) + 0.5
    results = []
    for run in ("partitioned", "whole"):
        torch.manual_seed(0)
        module = conv()
        features = x.clone().requires_grad_(input_grad)
        values = edge_values.clone().requires_grad_()
        if run == "partitioned":
            out = layer_forward(module, features, graph, **{keyword: values[graph.edge_ids]})
        else:
            out = module(features, edges, **{keyword: values})
        (out * weights).sum().backward()
        grads = [p.grad for p in module.parameters()] + [values.grad] + ([features.grad] if input_grad else [])
        results.append((out.detach(), grads))
    (ours, our_grads), (expected, expected_grads) = results
    check_close(ours, expected, context=layer)
    for index, (grad, reference) in enumerate(zip(our_grads, expected_grads)):
        check_close(grad, reference, context=f"{layer} gradient {index}")


def hooked(conv):
    """``conv`` with a message hook that halves the messages: its calls run PyG's propagation."""
    conv.register_message_forward_hook(lambda module, inputs, messages: messages * 0.5)
    return conv


def test_aggregate_first_carries_the_narrower_width():
    weight = torch.nn.Parameter(torch.randn(8, 12))  # 12 features in, 8 out
    features, hidden = torch.randn(5, 12), torch.randn(5, 12, requires_grad=True)
    # Training: aggregated first, the edges are passed once at 12 for features (no backward
    # pass), twice for hidden rows; multiplied first, twice at 8.
    assert aggregate_first(features, weight)
    assert not aggregate_first(hidden, weight)
    assert aggregate_first(torch.randn(5, 6, requires_grad=True), torch.nn.Parameter(torch.randn(8, 6)))
    assert not aggregate_first(torch.randn(5, 16), torch.nn.Parameter(torch.randn(8, 16)))  # a tie: PyG's order
    with torch.no_grad():
        assert not aggregate_first(hidden, weight)
        assert aggregate_first(hidden, torch.randn(16, 12))


def test_bad_layer_arguments(edge_index):
    graph = DistributedGraph.from_partition(edge_index, partition_graph(edge_index, NUM_NODES, 1))
    x = torch.randn(NUM_NODES, 6)
    with pytest.raises(TypeError, match="conv"):
        layer_forward(torch.nn.Linear(6, 5), x, graph)
    with pytest.raises(ValueError, match="edge_attr"):
        layer_forward(ug_nn.SAGEConv(6, 5), x, graph, torch.randn(graph.num_edges, 3))
    with pytest.raises(ValueError, match="edge_attr"):
        layer_forward(ug_nn.GATConv(6, 5, edge_dim=3), x, graph, torch.randn(graph.num_edges - 1, 3))
    with pytest.raises(ValueError, match="edge_weight"):
        layer_forward(ug_nn.SAGEConv(6, 5), x, graph, edge_weight=torch.rand(graph.num_edges))
    with pytest.raises(ValueError, match="edge_weight"):
        layer_forward(ug_nn.GraphConv(6, 5), x, graph, edge_weight=torch.rand(graph.num_edges, 2))
    with pytest.raises(ValueError, match="edge_weight: on meta"):
        layer_forward(ug_nn.GraphConv(6, 5), x, graph, edge_weight=torch.rand(graph.num_edges, device="meta"))
    with pytest.raises(ValueError, match="aggr"):
        layer_forward(ug_nn.GCNConv(6, 5, aggr="max"), x, graph)
    with pytest.raises(ValueError, match="flow"):
        layer_forward(ug_nn.SAGEConv(6, 5, flow="target_to_source"), x, graph)
    with pytest.raises(ValueError, match="x"):
        layer_forward(ug_nn.SAGEConv(6, 5), x[:-1], graph)
    with pytest.raises(TypeError, match="graph"):
        layer_forward(ug_nn.SAGEConv(6, 5), x, edge_index)
    plan = HaloPlan(torch.zeros(1, dtype=torch.int64), (0, 1), (0, 1), NUM_NODES)
    two_parts = DistributedGraph(0, 2, NUM_NODES + 1, graph.nodes, torch.tensor([NUM_NODES]), edge_index, plan)
    with pytest.raises(ValueError, match="halo"):
        layer_forward(ug_nn.SAGEConv(6, 5), torch.randn(NUM_NODES + 1, 6, requires_grad=True), two_parts)
    with pytest.raises(ValueError, match="rows"):
        layer_forward(ug_nn.SAGEConv(6, 5), torch.randn(NUM_NODES + 2, 6), two_parts)
    with pytest.raises(TypeError, match="plan"):
        halo_exchange(x, "plan")
    with pytest.raises(ValueError, match="x"):
        halo_exchange(x[:-1], graph.plan)
    with pytest.raises(ValueError, match="partition"):
        DistributedGraph.from_partition(edge_index, partition_graph(edge_index, NUM_NODES, 2))
    with pytest.raises(TypeError, match="partition"):
        DistributedGraph.from_partition(edge_index, graph.plan)
    assert isinstance(graph.plan, HaloPlan)


def test_seed_shards_are_disjoint_and_equal_in_size():
    train = torch.arange(0, 200, 2)  # 100 vertices
    for epoch in range(2):
        shards = [seed_batches(train, 16, epoch, rank=r, world_size=3, seed=4) for r in range(3)]
        assert [len(batches) for batches in shards] == [3, 3, 3]  # 34 seeds per rank (two pad the last)
        assert [[b.numel() for b in batches] for batches in shards] == [[16, 16, 2]] * 3
        seeds = torch.cat([torch.cat(batches) for batches in shards])
        assert set(seeds.tolist()) == set(train.tolist())
        assert seeds.numel() - seeds.unique().numel() == 2
    first = seed_batches(train, 16, 0, rank=0, world_size=3, seed=4)[0]
    assert not torch.equal(first, seed_batches(train, 16, 1, rank=0, world_size=3, seed=4)[0])
    with pytest.raises(ValueError, match="rank"):
        seed_batches(train, 16, 0, rank=3, world_size=3)
    with pytest.raises(ValueError, match="batch_size"):
        seed_batches(train, 0, 0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="train_nodes"):
        seed_batches(train[:2], 4, 0, rank=0, world_size=3)


def test_init_from_env_joins_the_group_torchrun_describes(monkeypatch, edge_index):
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    worker = init_from_env("gloo")
    try:
        assert worker == Worker(0, 1, 0, torch.device("cpu")) and dist.get_world_size() == 1
        graph = DistributedGraph.from_partition(edge_index, partition_graph(edge_index, NUM_NODES, 1))
        assert graph.world_size == 1 and graph.num_halo == 0
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="backend"):
        init_from_env("mpi")
