"""What PyG's explainers and hooks rely on, on the drop-ins: under explain mode (an edge mask set
by ``set_masks``, as GNNExplainer sets it), with hooks on ``message()`` or ``aggregate()`` and with
``decomposed_layers`` the drop-ins run PyG's propagation, so the mask weighs every message (and
gets its gradient) and the hooks run, with PyG's results; without them they run fused again."""

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

from pyg_ugrapher import nn as ug_nn

#: name -> (builder given a namespace of layer classes, forward given the layer and inputs)
LAYERS = {
    "GCNConv": (lambda ns: ns.GCNConv(6, 4), lambda layer, x, ei, w, e: layer(x, ei, w)),
    "GCNConv_max": (lambda ns: ns.GCNConv(6, 4, aggr="max"), lambda layer, x, ei, w, e: layer(x, ei)),
    "SAGEConv": (lambda ns: ns.SAGEConv(6, 4), lambda layer, x, ei, w, e: layer(x, ei)),
    "GINConv": (lambda ns: ns.GINConv(torch.nn.Linear(6, 4), train_eps=True), lambda layer, x, ei, w, e: layer(x, ei)),
    "GINEConv": (lambda ns: ns.GINEConv(torch.nn.Linear(6, 4), edge_dim=3), lambda layer, x, ei, w, e: layer(x, ei, e)),
    "GraphConv": (lambda ns: ns.GraphConv(6, 4, aggr="max"), lambda layer, x, ei, w, e: layer(x, ei, w)),
    "GATConv": (lambda ns: ns.GATConv(6, 4, heads=2), lambda layer, x, ei, w, e: layer(x, ei)),
    "GATConv_edge_dim": (lambda ns: ns.GATConv(6, 4, heads=2, edge_dim=3), lambda layer, x, ei, w, e: layer(x, ei, e)),
}


def _pair(name):
    build, forward = LAYERS[name]
    torch.manual_seed(0)
    theirs = build(pyg_nn)
    ours = build(ug_nn)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs, forward


def _inputs(small_graph):
    x, edge_index = small_graph
    gen = torch.Generator().manual_seed(7)
    num_edges = edge_index.size(1)
    return x, edge_index, torch.rand(num_edges, generator=gen) + 0.5, torch.randn(num_edges, 3, generator=gen)


@pytest.mark.parametrize("name", list(LAYERS))
def test_edge_masks_weigh_messages_as_in_pyg(small_graph, check_close, name):
    ours, theirs, forward = _pair(name)
    x, edge_index, weight, edge_attr = _inputs(small_graph)
    plain = forward(ours, x, edge_index, weight, edge_attr)
    results = []
    for layer in (ours, theirs):
        mask = torch.randn(edge_index.size(1), generator=torch.Generator().manual_seed(3)).requires_grad_()
        set_masks(layer, mask, edge_index, apply_sigmoid=True)
        out = forward(layer, x, edge_index, weight, edge_attr)
        (grad,) = torch.autograd.grad(out.square().sum(), [mask])
        results.append((out, grad))
        clear_masks(layer)
    (out, grad), (expected, expected_grad) = results
    check_close(out, expected, context="output")
    check_close(grad, expected_grad, context="mask gradient")
    assert grad.abs().sum() > 0 and not torch.allclose(out, plain)
    assert ours.unfused_reason() is None
    check_close(forward(ours, x, edge_index, weight, edge_attr), plain, context="after clear_masks")


@pytest.mark.parametrize("name", list(LAYERS))
def test_message_and_aggregate_hooks_run(small_graph, check_close, name):
    ours, theirs, forward = _pair(name)
    x, edge_index, weight, edge_attr = _inputs(small_graph)
    calls = []

    def double_messages(module, inputs, output):
        calls.append(module)
        return 2 * output

    for layer in (ours, theirs):
        layer.register_message_forward_hook(double_messages)
    check_close(forward(ours, x, edge_index, weight, edge_attr), forward(theirs, x, edge_index, weight, edge_attr))
    assert calls == [ours, theirs]
    assert "hooks" in ours.unfused_reason()


@pytest.mark.parametrize("name", ["GCNConv", "GCNConv_max"])
def test_decomposed_layers(small_graph, check_close, name):
    """PyG splits the features of ``x`` into several propagations (GCN's test of it; layers that
    pass ``x`` as a pair cannot be decomposed in PyG either)."""
    build, forward = LAYERS[name]
    torch.manual_seed(0)
    theirs = build(pyg_nn)
    ours = build(ug_nn)
    ours.load_state_dict(theirs.state_dict())
    for layer in (ours, theirs):
        layer.decomposed_layers = 2
    x, edge_index, weight, edge_attr = _inputs(small_graph)
    check_close(forward(ours, x, edge_index, weight, edge_attr), forward(theirs, x, edge_index, weight, edge_attr))
    assert "decomposed_layers" in ours.unfused_reason()


def test_gat_hooks_see_the_attention_coefficients(small_graph, check_close):
    """PyG's AttentionExplainer reads ``alpha`` from a message hook: GAT's PyG path passes it, with
    PyG's coefficients, and the layer runs fused again once the hook is gone."""
    ours, theirs, forward = _pair("GATConv")
    x, edge_index, weight, edge_attr = _inputs(small_graph)
    plain = forward(ours, x, edge_index, weight, edge_attr)
    seen = []
    handles = [
        layer.register_message_forward_hook(lambda module, inputs, output: seen.append(inputs[0]["alpha"]))
        for layer in (ours, theirs)
    ]
    for layer in (ours, theirs):
        forward(layer, x, edge_index, weight, edge_attr)
    check_close(seen[0], seen[1], context="alpha")
    for handle in handles:
        handle.remove()
    assert ours.unfused_reason() is None
    check_close(forward(ours, x, edge_index, weight, edge_attr), plain, context="fused again")
