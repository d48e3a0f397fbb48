r"""Both ways of training on several processes, on Cora (which ships with the package).

::

    python -m pyg_ugrapher.distributed.example --world-size 2            # 2 CPU processes, gloo
    torchrun --nproc_per_node=2 -m pyg_ugrapher.distributed.example      # one GPU per process, NCCL

:func:`train_ddp` trains a two-layer GCN of our layers on sampled mini-batches under
``DistributedDataParallel``, every rank around its own shard of the training vertices;
:func:`train_partitioned` trains the same model full-graph on a graph partitioned across the
ranks. Rank 0 prints the loss of every epoch and the test accuracy.
"""

from __future__ import annotations

import argparse
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.data import Data

from ..datasets import load_cora
from ..nn import GCNConv
from .graph import DistributedGraph
from .halo import with_halo
from .launch import Worker, init_from_env, spawn
from .layers import all_reduce_gradients, layer_forward
from .minibatch import sample_batches
from .partition import partition_graph


class GCN(nn.Module):
    """Two GCN layers: on an edge index (``forward``) or on a rank's share of a partitioned graph
    (``forward_partitioned``), with the same parameters."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(in_channels, hidden), GCNConv(hidden, out_channels)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def forward_partitioned(self, x: Tensor, graph: DistributedGraph) -> Tensor:
        return layer_forward(self.conv2, layer_forward(self.conv1, x, graph).relu(), graph)


def _log(worker: Worker, text: str) -> None:
    if worker.rank == 0:
        print(text, flush=True)


def train_ddp(worker: Worker, data: Data, epochs: int, batch_size: int = 32) -> List[float]:
    """Mini-batches under DDP; returns the mean loss of every epoch (of rank 0's batches) and logs
    the test accuracy."""
    data = data.to(worker.device)
    torch.manual_seed(0)  # DDP also copies rank 0's weights to every rank when it wraps the model
    model = GCN(data.num_features, 16, int(data.y.max()) + 1).to(worker.device)
    ddp = DistributedDataParallel(model, device_ids=[worker.device] if worker.device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01, weight_decay=5e-4)
    train_nodes = data.train_mask.nonzero().flatten()
    losses = []
    for epoch in range(epochs):
        total, steps = 0.0, 0
        for batch in sample_batches(data.edge_index, data.num_nodes, train_nodes, batch_size, [10, 10], epoch):
            optimizer.zero_grad()
            out = ddp(data.x[batch.node_ids], batch.edge_index)[: batch.num_seeds]
            loss = F.cross_entropy(out, data.y[batch.node_ids[: batch.num_seeds]])
            loss.backward()  # DDP averages the gradients over the ranks
            optimizer.step()
            total, steps = total + float(loss.detach()), steps + 1
        losses.append(total / steps)
        _log(worker, f"ddp epoch {epoch}: loss {losses[-1]:.4f}")
    with torch.no_grad():
        correct = (model(data.x, data.edge_index).argmax(-1) == data.y)[data.test_mask].float().mean()
    _log(worker, f"ddp test accuracy {float(correct):.3f}")
    return losses


def train_partitioned(worker: Worker, data: Data, epochs: int) -> List[float]:
    """Full-graph training on a partitioned graph; returns the loss of every epoch and logs the
    test accuracy. Every rank keeps only its own vertices' features and labels."""
    partition = partition_graph(data.edge_index, data.num_nodes, worker.world_size)
    graph = DistributedGraph.from_partition(data.edge_index, partition, device=worker.device)
    nodes = graph.nodes.cpu()
    # The features need no gradient: their halo is fetched once, not in every epoch's first layer.
    x, y = with_halo(data.x[nodes].to(worker.device), graph.plan), data.y[nodes].to(worker.device)
    train, test = data.train_mask[nodes].to(worker.device), data.test_mask[nodes].to(worker.device)
    num_train = int(data.train_mask.sum())
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GCN(data.num_features, 16, int(data.y.max()) + 1).to(worker.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    losses = []
    for epoch in range(epochs):
        optimizer.zero_grad()
        out = model.forward_partitioned(x, graph)
        # This rank's share of the whole graph's mean loss: the gradients' sum is the whole one.
        loss = F.cross_entropy(out[train], y[train], reduction="sum") / num_train
        loss.backward()
        all_reduce_gradients(model)
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total))
        _log(worker, f"partitioned epoch {epoch}: loss {losses[-1]:.4f}")
    with torch.no_grad():
        hits = (model.forward_partitioned(x, graph).argmax(-1) == y)[test].sum()
    counts = torch.stack([hits, test.sum()]).to(torch.float64)
    dist.all_reduce(counts)
    _log(worker, f"partitioned test accuracy {float(counts[0] / counts[1]):.3f}")
    return losses


def run(worker: Worker, epochs: int) -> None:
    data = load_cora()
    train_ddp(worker, data, epochs)
    train_partitioned(worker, data, epochs)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pyg_ugrapher.distributed.example", description=__doc__)
    parser.add_argument("--world-size", type=int, default=2, help="CPU processes to spawn (without torchrun)")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    if dist.is_torchelastic_launched():
        worker = init_from_env()
        try:
            run(worker, args.epochs)
        finally:
            dist.destroy_process_group()
    else:
        spawn(run, args.world_size, (args.epochs,))


if __name__ == "__main__":
    main()
