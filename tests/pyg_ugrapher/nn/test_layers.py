"""What every drop-in layer shares: it is a ``ug.MessagePassing`` (so a PyG ``MessagePassing``),
takes PyG's weights, and runs only uGrapher operators (``ug.plan`` shows no PyG fallback)."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_ugrapher as ug
from pyg_ugrapher import nn as ug_nn

#: name -> constructor arguments (shared by ours and PyG's).
LAYERS = {
    "GCNConv": lambda: (6, 4),
    "GATConv": lambda: (6, 4),
    "SAGEConv": lambda: (6, 4),
    "GraphConv": lambda: (6, 4),
    "GINConv": lambda: (torch.nn.Linear(6, 4),),
    "GINEConv": lambda: (torch.nn.Linear(6, 4),),
}


def _forward(name, layer, x, edge_index):
    if name == "GINEConv":
        return layer(x, edge_index, torch.ones(edge_index.size(1), 6))
    return layer(x, edge_index)


@pytest.mark.parametrize("name", LAYERS)
def test_is_a_message_passing_with_pyg_state(name, small_graph):
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*LAYERS[name]())
    ours = getattr(ug_nn, name)(*LAYERS[name]())
    assert isinstance(ours, ug.MessagePassing) and isinstance(ours, pyg_nn.MessagePassing)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(_forward(name, ours, x, edge_index), _forward(name, theirs, x, edge_index),
                               rtol=1e-5, atol=1e-6)
    plan = ug.plan(ours, x, edge_index) if name != "GINEConv" else \
        ug.plan(ours, x, edge_index, torch.ones(edge_index.size(1), 6))
    assert plan and all(entry.op is not None and entry.fallback_reason is None for entry in plan)
    assert all(entry.module == "" and entry.module_type == name for entry in plan)
