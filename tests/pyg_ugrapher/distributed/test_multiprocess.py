"""Several processes: a partitioned graph trains as the whole graph does in one process, and
data-parallel mini-batch training under DDP keeps the replicas equal and steps on the mean
gradient.

Each group of spawned processes runs its scenarios and saves what it computed; the tests compare
that with the same computation in this process, on the CPU's reference executor. On the CPU the
processes use gloo and the reference executor too; the ``cuda`` tests run two GPUs (NCCL, Triton
kernels), also with ``torch.compile`` and recorded steps (CUDA graphs) under DDP. Small random
graphs with self loops, duplicate edges and an isolated vertex.
"""

import math
import os
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from torch_geometric.data import Data
from torch_geometric.loader import RandomNodeLoader
from torch_geometric.utils import k_hop_subgraph

from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher import pad_to_bucket
from pyg_ugrapher.datasets import load_cora
from pyg_ugrapher.distributed import (
    DistributedGraph,
    Worker,
    all_reduce_gradients,
    cpu_start_method,
    example,
    layer_forward,
    partition_graph,
    sample_batches,
    seed_batches,
    spawn,
    with_halo,
)

NUM_NODES, NUM_FEATURES, HIDDEN, NUM_CLASSES = 240, 12, 8, 4
STEPS, LR, MOMENTUM = 3, 0.1, 0.9
#: DDP: seeds per batch and rank, sampled edges per vertex and hop, epochs.
BATCH_SIZE, FANOUTS, EPOCHS = 20, (4, 3), 2
#: RandomNodeLoader's parts of the whole graph (each rank takes every other one's nodes).
LOADER_PARTS = 6
EXAMPLE_EPOCHS = 3
EDGE_DIM = 3
LAYERS = {
    "gcn": ug_nn.GCNConv,
    "sage": ug_nn.SAGEConv,
    "graph": ug_nn.GraphConv,
    "gat": ug_nn.GATConv,
    "gine": lambda channels, out: ug_nn.GINEConv(torch.nn.Linear(channels, out), train_eps=True, edge_dim=EDGE_DIM),
    "gat-edges": lambda channels, out: ug_nn.GATConv(channels, out, heads=2, concat=False, edge_dim=EDGE_DIM),
    "graph-weighted": ug_nn.GraphConv,
    "gcn-weighted": ug_nn.GCNConv,
}
#: The models whose layers read the edges' features or weights, by the argument that takes them.
EDGE_INPUTS = {
    "gine": "edge_attr",
    "gat-edges": "edge_attr",
    "graph-weighted": "edge_weight",
    "gcn-weighted": "edge_weight",
}


def problem():
    """Edges (self loops, duplicates, vertex 5 without any edge), features, labels, training mask."""
    generator = torch.Generator().manual_seed(0)
    edges = torch.randint(0, NUM_NODES, (2, 1400), generator=generator)
    edges[1, ::11] = edges[0, ::11]
    edges = torch.cat([edges, edges[:, :60]], dim=1)
    edges = edges[:, (edges != 5).all(0)]
    x = torch.randn(NUM_NODES, NUM_FEATURES, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (NUM_NODES,), generator=generator)
    train = torch.rand(NUM_NODES, generator=generator) < 0.5
    return edges, x, y, train


def edge_features(num_edges: int) -> torch.Tensor:
    """``[num_edges, EDGE_DIM]`` features of :func:`problem`'s edges."""
    return torch.randn(num_edges, EDGE_DIM, generator=torch.Generator().manual_seed(7))


class Net(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv1, self.conv2 = LAYERS[kind](NUM_FEATURES, HIDDEN), LAYERS[kind](HIDDEN, NUM_CLASSES)
        self.edge_input = EDGE_INPUTS.get(kind)

    def _edges(self, edge_attr) -> Dict[str, torch.Tensor]:
        """The layers' edge argument: the features, or positive weights made of their first column
        (GCN's weighted degrees then stay positive)."""
        if self.edge_input is None:
            return {}
        return {self.edge_input: edge_attr if self.edge_input == "edge_attr" else edge_attr[:, 0].abs() + 0.5}

    def forward(self, x, edge_index, edge_attr=None):
        edges = self._edges(edge_attr)
        return self.conv2(self.conv1(x, edge_index, **edges).relu(), edge_index, **edges)

    def forward_partitioned(self, x, graph: DistributedGraph, edge_attr=None):
        edges = self._edges(edge_attr)
        return layer_forward(self.conv2, layer_forward(self.conv1, x, graph, **edges).relu(), graph, **edges)


def train_steps(model: Net, forward, x, y, train, num_train: int, sync=None, input_grad=True) -> Dict[str, object]:
    """``STEPS`` SGD steps on the loss summed over ``train`` divided by ``num_train``: the first
    step's output, input gradient (with ``input_grad``) and parameter gradients, and the
    parameters after the last."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x = x.clone().requires_grad_(input_grad)
    record: Dict[str, object] = {}
    for step in range(STEPS):
        optimizer.zero_grad()
        out = forward(x)
        loss = F.cross_entropy(out[train], y[train], reduction="sum") / num_train
        loss.backward()
        if sync is not None:
            sync()
        if step == 0:
            record.update(out=out.detach(), grads={k: p.grad.clone() for k, p in model.named_parameters()})
            if input_grad:
                record["x_grad"] = x.grad.clone()
        optimizer.step()
    record["params"] = {k: p.detach().clone() for k, p in model.named_parameters()}
    return record


def partitioned_run(worker: Worker, method: str, own_edges: bool, fetched: bool = False) -> Dict[str, object]:
    """Training on this rank's share; built from the whole edge list, or (``own_edges``) from the
    edges into this rank's vertices alone. With ``fetched``, the features need no gradient and
    their halo is fetched once, before the steps (the first layer aggregates before its product)."""
    edges, x, y, train = problem()
    edge_attr = edge_features(edges.size(1))
    device = worker.device
    partition = partition_graph(edges, NUM_NODES, worker.world_size, method, seed=3)
    if own_edges:
        own = partition.assignment[edges[1]] == worker.rank
        edges, edge_attr = edges[:, own], edge_attr[own]
    graph = DistributedGraph.from_partition(edges, partition, device=device)
    nodes = graph.nodes.cpu()
    # The whole graph's ids of the local edges' endpoints, by the rows of the local graph.
    row_ids = torch.cat([nodes, graph.halo_nodes.cpu()])
    local_edges = torch.stack([row_ids[graph.edge_index[0].cpu()], nodes[graph.edge_index[1].cpu()]])
    result: Dict[str, object] = {
        "nodes": nodes,
        "num_halo": graph.num_halo,
        "edge_ids": graph.edge_ids.cpu(),
        "edges_located": torch.equal(edges[:, graph.edge_ids.cpu()], local_edges),
    }
    x_local = x[nodes].to(device)
    x_sources = with_halo(x_local, graph.plan)
    local_attr = edge_attr[graph.edge_ids.cpu()].to(device)
    for kind in LAYERS:
        model = Net(kind).to(device)
        result[kind] = train_steps(
            model,
            lambda x_rows: model.forward_partitioned(x_sources if fetched else x_rows, graph, local_attr),
            x_local,
            y[nodes].to(device),
            train[nodes].to(device),
            int(train.sum()),
            lambda: all_reduce_gradients(model),
            input_grad=not fetched,
        )
    return result


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def every_ranks_parameters(model: torch.nn.Module, world_size: int) -> List[torch.Tensor]:
    """Every rank's parameters of ``model``, flattened, as ``all_gather`` sees them."""
    flat = flat_parameters(model)
    every = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(every, flat)
    return every


def ddp_run(worker: Worker, compile_mode: Optional[str]) -> Dict[str, object]:
    """DDP on sampled mini-batches (eager, or under ``torch.compile(mode=compile_mode)``, recorded
    ones padded to bucket sizes as the guide does); after every step, every rank's parameters as
    all_gather saw them."""
    edges, x, y, train = problem()
    device = worker.device
    model = Net("gcn").to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    forward = ddp if compile_mode is None else torch.compile(ddp, mode=compile_mode, dynamic=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = x.to(device), y.to(device)
    gathered: List[List[torch.Tensor]] = []
    for epoch in range(EPOCHS):
        for batch in sample_batches(edges, NUM_NODES, train.nonzero().flatten(), BATCH_SIZE, FANOUTS, epoch):
            node_ids, edge_index = batch.node_ids.to(device), batch.edge_index.to(device)
            optimizer.zero_grad()
            batch_x = x[node_ids]
            if compile_mode == "reduce-overhead":
                batch_x, edge_index = pad_to_bucket(batch_x, edge_index)
            out = forward(batch_x, edge_index)[: batch.num_seeds]
            F.cross_entropy(out, y[node_ids[: batch.num_seeds]]).backward()
            optimizer.step()
            gathered.append(every_ranks_parameters(model, worker.world_size))
    return {"gathered": gathered}


def pyg_loader_batches(kind: str, rank: int, world_size: int, epoch: int):
    """One rank's batches of one epoch from PyG's own samplers, without pyg-lib: ``(x, edge_index,
    picked rows, targets)`` each, and the rank's vertices (``random_nodes``: the nodes of its
    parts; ``k_hop``: its seeds).

    * ``random_nodes``: ``RandomNodeLoader``, its nodes sharded by PyTorch's ``DistributedSampler``;
    * ``k_hop``: the rank's seed shard (:func:`seed_batches`), each batch the 2-hop subgraph around
      its seeds (``k_hop_subgraph``), the loss on the seeds.
    """
    edges, x, y, train = problem()
    if kind == "random_nodes":
        sampler = DistributedSampler(range(NUM_NODES), num_replicas=world_size, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(epoch)
        loader = RandomNodeLoader(Data(x=x, y=y, edge_index=edges), num_parts=LOADER_PARTS, sampler=sampler)
        return [(b.x, b.edge_index, slice(None), b.y) for b in loader], torch.tensor(list(sampler))
    batches, seeds = [], seed_batches(train.nonzero().flatten(), BATCH_SIZE, epoch, rank=rank, world_size=world_size)
    for batch_seeds in seeds:
        subset, edge_index, mapping, _ = k_hop_subgraph(batch_seeds, 2, edges, relabel_nodes=True, num_nodes=NUM_NODES)
        batches.append((x[subset], edge_index, mapping, y[batch_seeds]))
    return batches, torch.cat(seeds)


def ddp_loader_run(worker: Worker, kind: str) -> Dict[str, object]:
    """DDP on the batches of :func:`pyg_loader_batches`; after every step, every rank's parameters
    as all_gather saw them, and the rank's vertices of every epoch."""
    device = worker.device
    model = Net("gcn").to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    gathered, vertices = [], []
    for epoch in range(EPOCHS):
        batches, epoch_vertices = pyg_loader_batches(kind, worker.rank, worker.world_size, epoch)
        vertices.append(epoch_vertices)
        for x, edge_index, picked, target in batches:
            optimizer.zero_grad()
            out = ddp(x.to(device), edge_index.to(device))[picked]
            F.cross_entropy(out, target.to(device)).backward()
            optimizer.step()
            gathered.append(every_ranks_parameters(model, worker.world_size))
    return {"gathered": gathered, "vertices": vertices}


def run_scenarios(worker: Worker, out_dir: str, scenarios: List[str]) -> None:
    """Run ``scenarios`` (``partitioned:<method>``, ``partitioned-own:<method>``,
    ``partitioned-fetched:<method>``, ``ddp``, ``ddp:<compile mode>``, ``ddp-pyg:<loader>``,
    ``example``)."""
    os.environ["TRITON_INTERPRET"] = "0"  # CPU tensors on the reference executor
    torch.set_num_threads(1)  # the ranks share the cores
    results = {}
    for scenario in scenarios:
        kind, _, option = scenario.partition(":")
        if kind == "ddp":
            results[scenario] = ddp_run(worker, option or None)
        elif kind == "ddp-pyg":
            results[scenario] = ddp_loader_run(worker, option)
        elif kind == "example":
            cora = load_cora()
            results[scenario] = {
                "ddp": example.train_ddp(worker, cora, EXAMPLE_EPOCHS),
                "partitioned": example.train_partitioned(worker, cora, EXAMPLE_EPOCHS),
            }
        else:
            results[scenario] = partitioned_run(
                worker, option, own_edges=kind == "partitioned-own", fetched=kind == "partitioned-fetched"
            )
    torch.save(results, Path(out_dir) / f"rank{worker.rank}.pt")


def launch(tmp_path_factory, world_size: int, scenarios: List[str], backend: str = "gloo") -> List[Dict[str, object]]:
    out_dir = tmp_path_factory.mktemp(f"{backend}{world_size}")
    # NCCL's processes use CUDA, which processes forked from a server that imported PyG cannot.
    start_method = cpu_start_method() if backend == "gloo" else "spawn"
    spawn(
        run_scenarios,
        world_size,
        (str(out_dir), scenarios),
        backend=backend,
        start_method=start_method,
        preload=["pyg_ugrapher.distributed", __name__],
    )
    return [torch.load(out_dir / f"rank{rank}.pt", map_location="cpu") for rank in range(world_size)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return launch(
        tmp_path_factory,
        2,
        [
            "partitioned:random",
            "partitioned-fetched:random",
            "ddp",
            "ddp-pyg:random_nodes",
            "ddp-pyg:k_hop",
            "example",
        ],
    )


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return launch(tmp_path_factory, 3, ["partitioned-own:contiguous"])


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    return launch(
        tmp_path_factory,
        2,
        ["partitioned:random", "partitioned-fetched:random", "ddp:default", "ddp:reduce-overhead"],
        backend="nccl",
    )


@pytest.fixture(scope="module")
def reference():
    """The training of every model on the whole graph in this process."""
    edges, x, y, train = problem()
    edge_attr = edge_features(edges.size(1))
    out = {}
    for kind in LAYERS:
        model = Net(kind)
        out[kind] = train_steps(
            model, lambda features: model(features, edges, edge_attr), x, y, train, int(train.sum())
        )
    return out


def check_partitioned(ranks, scenario, reference, check_close):
    nodes = torch.cat([r[scenario]["nodes"] for r in ranks])
    assert torch.equal(nodes.sort().values, torch.arange(NUM_NODES)), "every vertex on exactly one rank"
    assert all(r[scenario]["num_halo"] > 0 for r in ranks), "the split must cut edges for the test to mean anything"
    assert all(r[scenario]["edges_located"] for r in ranks), "edge_ids point at the local edges"
    for kind, expected in reference.items():
        for name in ("out", "x_grad") if "x_grad" in ranks[0][scenario][kind] else ("out",):
            rows = torch.cat([r[scenario][kind][name] for r in ranks])
            check_close(rows, expected[name][nodes], context=f"{scenario} {kind} {name}")
        for rank, r in enumerate(ranks):
            for record in ("grads", "params"):
                for key, value in r[scenario][kind][record].items():
                    check_close(value, expected[record][key], context=f"{scenario} {kind} rank {rank} {record} {key}")


def test_two_ranks_train_as_one_process(two_ranks, reference, check_close):
    check_partitioned(two_ranks, "partitioned:random", reference, check_close)
    # Built from the whole edge list, the ranks' local edges are every edge once.
    edge_ids = torch.cat([r["partitioned:random"]["edge_ids"] for r in two_ranks])
    assert torch.equal(edge_ids.sort().values, torch.arange(problem()[0].size(1)))


def test_three_ranks_built_from_their_own_edges_train_as_one_process(three_ranks, reference, check_close):
    check_partitioned(three_ranks, "partitioned-own:contiguous", reference, check_close)


def test_features_fetched_once_train_as_one_process(two_ranks, reference, check_close):
    check_partitioned(two_ranks, "partitioned-fetched:random", reference, check_close)


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", ["partitioned:random", "partitioned-fetched:random"])
def test_two_gpus_train_as_one_process(two_gpus, scenario, reference, check_close):
    check_partitioned(two_gpus, scenario, reference, check_close)


def test_ddp_replicas_stay_equal_and_step_on_the_mean_gradient(two_ranks, check_close):
    check_ddp(two_ranks, "ddp", check_close)


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", ["ddp:default", "ddp:reduce-overhead"])
def test_compiled_and_recorded_ddp_on_two_gpus(two_gpus, scenario, check_close):
    check_ddp(two_gpus, scenario, check_close)


def check_mean_gradient_steps(gathered, epoch_batches, loss, context: str, check_close) -> None:
    """Two ranks' parameters after every DDP step (``gathered``, from :func:`every_ranks_parameters`
    on each rank) are identical, and equal those of one process that steps, batch by batch, on the
    mean of both ranks' losses (``loss(model, batch)``) over ``epoch_batches(epoch, rank)``."""
    for step, every in enumerate(gathered[0]):
        assert all(torch.equal(every[0], other) for other in every[1:]), f"{context} step {step}: replicas differ"
        assert all(torch.equal(a, b) for a, b in zip(every, gathered[1][step]))
    model = Net("gcn")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step = 0
    for epoch in range(EPOCHS):
        per_rank = [epoch_batches(epoch, rank) for rank in range(2)]
        assert len(per_rank[0]) == len(per_rank[1]), f"{context} epoch {epoch}: the ranks run different step counts"
        for batches in zip(*per_rank):
            optimizer.zero_grad()
            losses = [loss(model, batch) for batch in batches]
            (sum(losses) / len(losses)).backward()
            optimizer.step()
            check_close(gathered[0][step][0], flat_parameters(model), context=f"{context} step {step}")
            step += 1
    assert step == len(gathered[0])


def check_ddp(ranks, scenario, check_close):
    edges, x, y, train = problem()
    gathered = [r[scenario]["gathered"] for r in ranks]
    assert len(gathered[0]) == len(gathered[1]) == EPOCHS * 3  # 60 seeds per rank, batches of 20
    train_nodes = train.nonzero().flatten()

    def epoch_batches(epoch: int, rank: int):
        return list(sample_batches(edges, NUM_NODES, train_nodes, BATCH_SIZE, FANOUTS, epoch, rank=rank, world_size=2))

    def loss(model: Net, b) -> torch.Tensor:
        return F.cross_entropy(model(x[b.node_ids], b.edge_index)[: b.num_seeds], y[b.node_ids[: b.num_seeds]])

    check_mean_gradient_steps(gathered, epoch_batches, loss, scenario, check_close)
    first_seeds = [epoch_batches(0, rank)[0].node_ids[:BATCH_SIZE] for rank in range(2)]
    assert not set(first_seeds[0].tolist()) & set(first_seeds[1].tolist()), "each rank draws its own seeds"


@pytest.mark.parametrize("kind", ["random_nodes", "k_hop"])
def test_ddp_on_pyg_samplers_steps_on_the_mean_gradient(two_ranks, kind, check_close):
    """PyG's own samplers under DDP: the ranks' vertices are disjoint (up to the one vertex that
    pads the shards to equal sizes), the replicas stay equal, and one process stepping on the
    mean of both ranks' batch losses takes the same steps."""
    ranks = [r[f"ddp-pyg:{kind}"] for r in two_ranks]
    for epoch in range(EPOCHS):
        first, second = (set(r["vertices"][epoch].tolist()) for r in ranks)
        assert len(first & second) <= 1, f"{kind} epoch {epoch}: both ranks drew {sorted(first & second)}"
        if kind == "random_nodes":
            assert first | second == set(range(NUM_NODES))
    gathered = [r["gathered"] for r in ranks]
    assert len(gathered[0]) == len(gathered[1]) > EPOCHS

    def loss(model: Net, batch) -> torch.Tensor:
        x, edge_index, picked, target = batch
        return F.cross_entropy(model(x, edge_index)[picked], target)

    def epoch_batches(epoch: int, rank: int):
        return pyg_loader_batches(kind, rank, 2, epoch)[0]

    check_mean_gradient_steps(gathered, epoch_batches, loss, kind, check_close)


def test_the_documented_example_trains_on_two_ranks(two_ranks):
    """``python -m pyg_ugrapher.distributed.example`` on Cora: both ways the loss falls, and both
    ranks saw the same partitioned losses (they are all-reduced)."""
    for mode in ("ddp", "partitioned"):
        losses = two_ranks[0]["example"][mode]
        assert len(losses) == EXAMPLE_EPOCHS and all(math.isfinite(v) for v in losses)
        assert losses[-1] < losses[0], f"{mode}: {losses}"
    assert two_ranks[0]["example"]["partitioned"] == two_ranks[1]["example"]["partitioned"]
