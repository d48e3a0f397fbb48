"""What every drop-in layer shares: it is a ``ug.MessagePassing`` (so a PyG ``MessagePassing``),
takes PyG's weights, runs only uGrapher operators (``ug.plan`` shows no PyG fallback), and gives
PyG's result for a ``torch.sparse`` adjacency under ``torch.compile`` too."""

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.utils import coalesce, to_torch_coo_tensor, to_torch_csr_tensor

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
        return layer(x, edge_index, torch.ones(edge_index.size(1), 6, device=edge_index.device))
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
    torch.testing.assert_close(
        _forward(name, ours, x, edge_index), _forward(name, theirs, x, edge_index), rtol=1e-5, atol=1e-6
    )
    plan = (
        ug.plan(ours, x, edge_index)
        if name != "GINEConv"
        else ug.plan(ours, x, edge_index, torch.ones(edge_index.size(1), 6))
    )
    assert plan and all(entry.op is not None and entry.fallback_reason is None for entry in plan)
    assert all(entry.module == "" and entry.module_type == name for entry in plan)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("name", LAYERS)
def test_compiled_torch_sparse_adjacency_matches_pyg(compare, compile_ours, small_graph, name, layout):
    """Compiled (without fullgraph), a layer given a ``torch.sparse`` ``adj_t`` with values gives PyG's
    eager result on it, gradients too, the values' included (a COO adjacency's were a constant while
    it was read through PyG's ``to_edge_index``, which flags it coalesced in place, an operation
    without derivative). The layer runs whole as in eager mode: Dynamo cannot trace a
    frame that holds a sparse tensor, and no helper of the layer is compiled on its own (GCN's and
    GINE's were, in up to ten graphs; SAGE's, GAT's, GIN's and GraphConv's crashed Dynamo)."""
    x, edge_index = small_graph
    # adj_t's entries (rows are destinations), coalesced: GINE's edge features line up with them.
    index = coalesce(edge_index.flip(0), num_nodes=12)
    assert (index[0] == index[1]).any()
    generator = torch.Generator().manual_seed(7)
    value = torch.rand(index.size(1), generator=generator) + 0.1
    edge_attr = torch.randn(index.size(1), 6, generator=generator)
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*LAYERS[name]())
    ours = getattr(ug_nn, name)(*LAYERS[name]())
    # Only the layer call is compiled, so that the counter sees the layer's graphs alone.
    call, counter = compile_ours(lambda layer, x, adj_t, *edge_attr: layer(x, adj_t, *edge_attr), ours)

    def forward(layer, x, value, edge_attr):
        convert = to_torch_coo_tensor if layout == "coo" else to_torch_csr_tensor
        # PyG's gcn_norm reads a COO adjacency through to_edge_index (see above): in PyG's GCN its
        # values cannot get a gradient, so they are a constant there.
        differentiable = layout == "csr" or name != "GCNConv"
        adj_t = convert(index, value if differentiable else value.detach(), (12, 12), is_coalesced=True)
        return call(layer, x, adj_t, *([edge_attr] if name == "GINEConv" else []))

    compare(ours, theirs, forward, [x, value, edge_attr], train=True)
    assert counter.frame_count == 0


@pytest.mark.parametrize("coalesced", [True, False], ids=["coalesced", "uncoalesced"])
@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GraphConv", "GINConv"])
def test_coo_adjacency_is_left_as_given(compare, small_graph, name, coalesced):
    """A COO ``adj_t`` (duplicate entries too) is read, not changed: its version stays, one graph
    serves every call, and its values get PyG's gradient. PyG's ``to_edge_index`` flagged it
    coalesced in place: every forward bumped its version (so the graph was built again, and a
    backward that saved its indices failed) and the values got no gradient."""
    x, edge_index = small_graph
    index = coalesce(edge_index.flip(0), num_nodes=12) if coalesced else edge_index.flip(0)
    value = torch.rand(index.size(1), generator=torch.Generator().manual_seed(3)) + 0.1
    kwargs = {"normalize": False} if name == "GCNConv" else {}
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*LAYERS[name](), **kwargs)
    ours = getattr(ug_nn, name)(*LAYERS[name](), **kwargs)

    def adjacency(values):
        return torch.sparse_coo_tensor(index, values, (12, 12), is_coalesced=coalesced)

    compare(ours, theirs, lambda layer, x, values: layer(x, adjacency(values)), [x, value], train=True)
    adj_t = adjacency(value.clone().requires_grad_())
    versions = (adj_t._version, adj_t._indices()._version)
    first = ours(x, adj_t)
    second = ours(x, adj_t)
    (first + second).sum().backward()
    assert (adj_t._version, adj_t._indices()._version) == versions


@pytest.mark.parametrize("name", LAYERS)
def test_graph_made_in_inference_mode(small_graph, name):
    """An ``edge_index`` made under ``torch.inference_mode`` (it counts no versions) serves a layer
    in inference mode and later under ``no_grad``, as PyG's."""
    x, edge_index = small_graph
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*LAYERS[name]())
    ours = getattr(ug_nn, name)(*LAYERS[name]())
    ours.load_state_dict(theirs.state_dict())
    with torch.inference_mode():
        index = edge_index.clone()
        inferred = _forward(name, ours, x, index)
        torch.testing.assert_close(inferred, _forward(name, theirs, x, index), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(_forward(name, ours, x, index), inferred, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("name", LAYERS)
def test_new_gpu_graphs_train_without_a_host_sync(name, user_order):
    """A sampler's new graph every step, self loops stored in it: a training call of each layer
    with its default arguments waits for the GPU nowhere (GAT's stored loops go to a spare row
    rather than being counted), and gives PyG's result."""
    gen = torch.Generator().manual_seed(0)
    ours = getattr(ug_nn, name)(*LAYERS[name]()).cuda()
    theirs = getattr(pyg_nn, name)(*LAYERS[name]()).cuda()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(200, 6, generator=gen).cuda()

    def new_graph() -> torch.Tensor:
        index = torch.randint(0, 200, (2, 1000), generator=gen)
        index[1, ::10] = index[0, ::10]  # stored self loops
        return index.cuda()

    for _ in range(3):  # compiles the kernels
        _forward(name, ours, x, new_graph()).sum().backward()
    graphs = [new_graph() for _ in range(4)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [_forward(name, ours, x, edge_index) for edge_index in graphs]
        for out in outs:
            out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for out, edge_index in zip(outs, graphs):
        torch.testing.assert_close(out, _forward(name, theirs, x, edge_index), rtol=1e-4, atol=1e-5)
