"""``torch.jit.script`` of the drop-ins compiles PyG's namesake holding the drop-in's own
parameters (``pyg_ugrapher.nn.twins``): the scripted module computes what the drop-in does, and
follows later changes of its weights."""

import pytest
import torch
import torch_geometric.nn as pyg_nn

from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher.nn.twins import pyg_twin

#: name -> (layer builder, forward given the layer, x, edge_index, edge features)
LAYERS = {
    "GCNConv": (lambda: ug_nn.GCNConv(6, 4, improved=True), lambda m, x, ei, e: m(x, ei)),
    "SAGEConv": (lambda: ug_nn.SAGEConv(6, 4, aggr="max", project=True), lambda m, x, ei, e: m(x, ei)),
    "SAGEConv_lstm": (lambda: ug_nn.SAGEConv(6, 4, aggr="lstm"), lambda m, x, ei, e: m(x, ei)),
    "GINConv": (lambda: ug_nn.GINConv(torch.nn.Linear(6, 4), train_eps=True), lambda m, x, ei, e: m(x, ei)),
    "GINEConv": (lambda: ug_nn.GINEConv(torch.nn.Linear(6, 4), edge_dim=3), lambda m, x, ei, e: m(x, ei, e)),
    "GraphConv": (lambda: ug_nn.GraphConv(6, 4, aggr="mean"), lambda m, x, ei, e: m(x, ei)),
}


def _inputs():
    gen = torch.Generator().manual_seed(0)
    # Sorted by destination, as the LSTM aggregation requires.
    edge_index = torch.tensor([[1, 2, 0, 3, 0, 4, 4, 5, 1, 2], [0, 0, 1, 1, 2, 2, 3, 4, 4, 5]])
    return torch.randn(6, 6, generator=gen), edge_index, torch.randn(10, 3, generator=gen)


@pytest.mark.parametrize("name", list(LAYERS))
def test_scripted_drop_in_computes_the_same(check_close, name):
    build, forward = LAYERS[name]
    torch.manual_seed(0)
    layer = build().eval()
    x, edge_index, edge_attr = _inputs()
    scripted = torch.jit.script(layer)
    assert isinstance(scripted, torch.jit.ScriptModule)
    check_close(forward(scripted, x, edge_index, edge_attr), forward(layer, x, edge_index, edge_attr))
    # The scripted module holds the layer's own parameters: a change of them shows in both.
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.mul_(0.5)
    check_close(forward(scripted, x, edge_index, edge_attr), forward(layer, x, edge_index, edge_attr))


def test_twin_is_pyg_layer_with_the_same_objects():
    layer = ug_nn.GCNConv(6, 4, cached=True, add_self_loops=False, flow="target_to_source").train(False)
    layer.decomposed_layers = 2
    twin = pyg_twin(layer)
    assert type(twin) is pyg_nn.GCNConv and twin.lin is layer.lin and twin.bias is layer.bias
    assert (twin.cached, twin.add_self_loops, twin.flow, twin.decomposed_layers, twin.training) == (
        True,
        False,
        "target_to_source",
        2,
        False,
    )


def test_a_model_of_drop_ins_scripts(check_close):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = ug_nn.GCNConv(6, 8)
            self.conv2 = ug_nn.SAGEConv(8, 3)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    model = Model()
    x, edge_index, _ = _inputs()
    check_close(torch.jit.script(model)(x, edge_index), model(x, edge_index))
