"""Mini-batches on Cora: a new graph every batch, as a sampling loader produces them.

Batches are k-hop neighbourhoods (``k_hop_subgraph``) and induced subgraphs (``subgraph``) of
Cora, relabelled. On each, a two-layer model of our layers must give PyG's outputs and gradients
(same weights), eagerly and under ``torch.compile(dynamic=True)`` without a recompilation per
batch, and the schedule of every operator must come from the selection cache once a batch graph
was seen (never from timing).
"""
import copy
import importlib.util
from typing import Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch_geometric.utils import k_hop_subgraph, subgraph

import pyg_ugrapher as ug
from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher.datasets import load_planetoid

HIDDEN = 8


@pytest.fixture(scope="module")
def cora():
    return load_planetoid("Cora")


@pytest.fixture(scope="module")
def batches(cora) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``(x, edge_index)`` of six batches: four 2-hop neighbourhoods of 4 seed nodes, two induced
    subgraphs of 150 random nodes; every one a different graph."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(4):
        seeds = torch.randint(0, cora.num_nodes, (4,), generator=generator)
        subset, edge_index, _, _ = k_hop_subgraph(seeds, 2, cora.edge_index, relabel_nodes=True,
                                                  num_nodes=cora.num_nodes)
        out.append((cora.x[subset], edge_index))
    for _ in range(2):
        subset = torch.randperm(cora.num_nodes, generator=generator)[:150].sort().values
        edge_index, _ = subgraph(subset, cora.edge_index, relabel_nodes=True, num_nodes=cora.num_nodes)
        out.append((cora.x[subset], edge_index))
    assert len({tuple(ei.shape) + (x.size(0),) for x, ei in out}) == len(out)
    return out


class Net(torch.nn.Module):
    """conv -> ReLU -> conv, the layers taken from ``ns`` (PyG's ``nn`` or ours)."""

    def __init__(self, ns, kind: str, in_channels: int, out_channels: int):
        super().__init__()
        self.conv1, self.conv2 = (LAYERS[kind](ns, in_channels, HIDDEN), LAYERS[kind](ns, HIDDEN, out_channels))

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


LAYERS: Dict[str, Callable] = {
    "gcn": lambda ns, i, o: ns.GCNConv(i, o),
    "gat": lambda ns, i, o: ns.GATConv(i, o // 2, heads=2),
    "sage": lambda ns, i, o: ns.SAGEConv(i, o),
    "gin": lambda ns, i, o: ns.GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(),
                                                           torch.nn.Linear(o, o))),
}


def twins(kind: str, cora) -> Tuple[Net, Net]:
    torch.manual_seed(0)
    theirs = Net(pyg_nn, kind, cora.num_features, 4)
    ours = Net(ug_nn, kind, cora.num_features, 4)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def outputs_and_grads(model: torch.nn.Module, forward: Callable, x: torch.Tensor, edge_index: torch.Tensor
                      ) -> List[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = forward(x, edge_index)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * probe).sum(), [x] + list(model.parameters()))
    return [out.detach()] + [g.detach() for g in grads]


@pytest.mark.parametrize("kind", list(LAYERS))
def test_each_batch_matches_pyg(kind, cora, batches, check_refereed):
    ours, theirs = twins(kind, cora)
    exact_model = copy.deepcopy(theirs).double()
    for step, (x, edge_index) in enumerate(batches):
        mine = outputs_and_grads(ours, ours, x, edge_index)
        ref = outputs_and_grads(theirs, theirs, x, edge_index)
        exact: List[torch.Tensor] = []

        def exact_result(index: int) -> torch.Tensor:
            if not exact:
                exact.extend(outputs_and_grads(exact_model, exact_model, x.double(), edge_index))
            return exact[index]

        for index, (a, b) in enumerate(zip(mine, ref)):
            check_refereed(a, b, lambda: exact_result(index), f"batch {step}, tensor {index}")


@pytest.mark.parametrize("kind", ["sage", "gcn"])
def test_compiled_model_serves_every_batch(kind, cora, batches, check_close):
    """One compiled graph (dynamic=True) for every batch, equal to PyG on each."""
    torch._dynamo.reset()
    ours, theirs = twins(kind, cora)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ours, fullgraph=True, dynamic=True, backend=counter)
    for step, (x, edge_index) in enumerate(batches):
        mine = outputs_and_grads(ours, compiled, x, edge_index)
        ref = outputs_and_grads(theirs, theirs, x, edge_index)
        for index, (a, b) in enumerate(zip(mine, ref)):
            check_close(a, b, context=f"batch {step}, tensor {index}")
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_schedules_come_from_the_selection_cache(cora, batches, monkeypatch):
    """Selecting a schedule per batch is a cache lookup once the batch graph was seen: a second
    epoch over the same batches gets the very objects the first one got. No timing ever runs."""
    import triton.testing

    def no_timing(*args, **kwargs):
        raise AssertionError("schedule selection timed a kernel")

    monkeypatch.setattr(triton.testing, "do_bench", no_timing)
    ours, _ = twins("gat", cora)
    epochs = [[entry.parallel_info for x, edge_index in batches for entry in ug.plan(ours, x, edge_index)]
              for _ in range(2)]
    # Two GAT layers of three operators each (softmax_aggregate's).
    assert len(epochs[0]) == len(batches) * 6 and all(info is not None for info in epochs[0])
    assert all(first is again for first, again in zip(*epochs))


def _sampler_backend() -> str:
    """Why PyG's NeighborLoader cannot sample here, or ``""`` when it can."""
    if importlib.util.find_spec("pyg_lib") or importlib.util.find_spec("torch_sparse"):
        return ""
    return "NeighborLoader needs pyg-lib or torch-sparse to sample neighbours; neither is installed"


@pytest.mark.skipif(bool(_sampler_backend()), reason=_sampler_backend() or "sampler available")
def test_neighbor_loader_batches(cora, check_close):
    from torch_geometric.loader import NeighborLoader

    ours, theirs = twins("sage", cora)
    loader = NeighborLoader(cora, num_neighbors=[5, 5], batch_size=32, shuffle=False,
                            input_nodes=torch.arange(128))
    for step, batch in enumerate(loader):
        mine = outputs_and_grads(ours, ours, batch.x, batch.edge_index)
        ref = outputs_and_grads(theirs, theirs, batch.x, batch.edge_index)
        for index, (a, b) in enumerate(zip(mine, ref)):
            check_close(a, b, context=f"batch {step}, tensor {index}")
