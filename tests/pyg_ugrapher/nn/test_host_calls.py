"""Host cost of an eager training step: the Python calls of a repeated forward and backward pass of
a two-layer model of each drop-in layer, against PyG's own layer in the same test.

An eager step on a small graph is bound by its Python (docs/performance.md), and counting calls is
deterministic where timing is not. The step runs on the reference executor (the CPU path), on a
graph seen before: every cache (graphs, normalisations, validations, decisions) is warm, so what
is counted is the work that repeats on every call.
"""

import cProfile
import pstats

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn

import pyg_ugrapher.nn as ug_nn

NODES, EDGES, FEATURES, HIDDEN, CLASSES = 20, 60, 16, 16, 4

#: Our calls per step at most, as a multiple of PyG's. None is at PyG's count: each graph operator
#: still resolves its call and, in the backward pass, runs Python where PyG's backward is all ATen;
#: GCNConv runs two operators each way, GINConv walks its network to reach its Linear maps, and
#: GATConv's attention is three operators with a Python backward.
BOUNDS = {"gcn": 1.45, "sage": 1.15, "gin": 1.3, "gat": 3.15}


def _mlp(dim_in: int, dim_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, dim_out))


def _convs(layers, name: str):
    if name == "gcn":
        return layers.GCNConv(FEATURES, HIDDEN), layers.GCNConv(HIDDEN, CLASSES)
    if name == "sage":
        return layers.SAGEConv(FEATURES, HIDDEN), layers.SAGEConv(HIDDEN, CLASSES)
    if name == "gin":
        return (
            layers.GINConv(_mlp(FEATURES, HIDDEN), train_eps=True),
            layers.GINConv(_mlp(HIDDEN, CLASSES), train_eps=True),
        )
    return layers.GATConv(FEATURES, HIDDEN // 4, heads=4), layers.GATConv(HIDDEN, CLASSES, heads=1)


class _Net(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, edge_index):
        return self.second(F.relu(self.first(x, edge_index)), edge_index)


def _calls_per_step(layers, name: str) -> int:
    torch.manual_seed(0)
    model = _Net(*_convs(layers, name))
    x = torch.randn(NODES, FEATURES)
    edge_index = torch.randint(0, NODES, (2, EDGES))
    y = torch.randint(0, CLASSES, (NODES,))
    parameters = list(model.parameters())

    def step() -> None:
        for p in parameters:
            p.grad = None
        F.cross_entropy(model(x, edge_index), y).backward()

    for _ in range(3):  # caches, decisions, PyG's generated propagate
        step()
    profile = cProfile.Profile()
    profile.enable()
    step()
    profile.disable()
    return pstats.Stats(profile).total_calls - 1  # the profiler's own disable()


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_step_makes_few_python_calls(name):
    ours, pyg = _calls_per_step(ug_nn, name), _calls_per_step(pyg_nn, name)
    assert ours <= BOUNDS[name] * pyg, f"{name}: {ours} Python calls per step, PyG's layer {pyg}"
