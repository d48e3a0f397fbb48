"""The graphs the drop-in layers build from their graph argument (``pyg_ugrapher/graph_argument.py``)."""

from typing import List, Tuple

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from pyg_ugrapher import graph_argument
from pyg_ugrapher.nn import GATConv, GATv2Conv
from pyg_ugrapher.structure import GraphStructure

from .conftest import make_graph


def rows(structure: GraphStructure, num_rows: int) -> List[List[Tuple[int, int]]]:
    """Each destination row's ``(source, edge id)`` pairs in CSR order."""
    rowptr, col, eid = (t.tolist() for t in (structure.csr.rowptr, structure.csr.col, structure.csr.eid))
    return [list(zip(col[rowptr[v] : rowptr[v + 1]], eid[rowptr[v] : rowptr[v + 1]])) for v in range(num_rows)]


def loop_heavy_graph() -> torch.Tensor:
    """A random graph with stored loops, several on one node, at the start and the end."""
    loops = torch.tensor([[3, 3, 3, 5], [3, 3, 3, 5]])
    return torch.cat([loops[:, :2], make_graph(12, 40, seed=7), loops[:, 2:]], dim=1)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("case", ["loops", "bipartite", "empty"])
def test_spare_row_graph_rows_are_the_looped_graphs(flow, case):
    """Every real row of the spare-row graph gathers the edges it has in the looped graph (stored
    loops removed, one loop per node added), in the same order; the stored loops, and nothing
    else, go to the spare row. Edge ids differ only by the removed loops' places."""
    sizes = {"loops": (12, 12), "bipartite": (10, 7), "empty": (6, 6)}[case]
    if case == "loops":
        edge_index = loop_heavy_graph()
    elif case == "bipartite":
        edge_index = torch.tensor([[0, 3, 3, 9, 5, 5, 1, 8, 1, 2, 7], [0, 3, 2, 6, 5, 5, 4, 1, 0, 3, 5]])
    else:
        edge_index = torch.empty(2, 0, dtype=torch.long)
    if flow == "target_to_source":  # the same edges, stored the other way around
        edge_index = edge_index.flip(0)
    num_src, num_dst = sizes
    num_loops = min(sizes)
    spare = graph_argument.spare_row_looped_graph(edge_index, flow, num_src, num_dst, num_loops)
    looped = graph_argument.looped_graph(edge_index, flow, num_src, num_dst, num_loops)
    assert spare.spare_row and not looped.graph.spare_row
    assert spare.num_edges == edge_index.size(1) + num_loops
    spare_structure = spare.tensor.structure()
    assert spare_structure.num_dst == num_dst + 1

    # Edge ids of the looped graph, as places in the spare-row graph: kept edges keep theirs,
    # added loops follow the stored edges.
    kept = looped.kept.tolist()
    place = kept + [edge_index.size(1) + k for k in range(num_loops)]
    expected = [[(u, place[e]) for u, e in row] for row in rows(looped.graph.tensor.structure(), num_dst)]
    got = rows(spare_structure, num_dst + 1)
    assert got[:num_dst] == expected
    is_loop = (edge_index[0] == edge_index[1]).tolist()
    assert sorted(e for _, e in got[num_dst]) == [e for e, loop in enumerate(is_loop) if loop]


@pytest.mark.parametrize("fill_value", ["mean", "add", "max", "min", "mul", 0.5, torch.tensor([1.0, -2.0])])
def test_spare_row_loop_attr_is_pygs(fill_value):
    """The loop features are PyG's ``add_self_loops`` after ``remove_self_loops``; the stored
    edges' features stay in place."""
    from torch_geometric.utils import add_self_loops, remove_self_loops

    edge_index = loop_heavy_graph()
    edge_attr = torch.randn(edge_index.size(1), 2, generator=torch.Generator().manual_seed(3))
    got = graph_argument.spare_row_loop_attr(edge_index, edge_attr, 12, fill_value)
    index, attr = remove_self_loops(edge_index, edge_attr)
    _, expected = add_self_loops(index, attr, fill_value=fill_value, num_nodes=12)
    assert torch.equal(got[: edge_index.size(1)], edge_attr)
    torch.testing.assert_close(got[edge_index.size(1) :], expected[attr.size(0) :], rtol=0, atol=0)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_looped_graph_is_pygs_remove_then_add_self_loops(flow):
    """The looped index is PyG's ``remove_self_loops`` then ``add_self_loops``; ``kept`` names the
    kept edges; the graph's edges are the looped index's."""
    from torch_geometric.utils import add_self_loops, remove_self_loops

    edge_index = loop_heavy_graph()
    looped = graph_argument.looped_graph(edge_index, flow, 12, 12, 12)
    expected, _ = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=12)
    assert torch.equal(looped.index, expected)
    is_loop = edge_index[0] == edge_index[1]
    assert is_loop.sum() > 4 and looped.kept.tolist() == (~is_loop).nonzero().view(-1).tolist()
    src, dst = looped.graph.tensor.coo()
    j, i = graph_argument.endpoints(flow)
    assert torch.equal(src.long(), expected[j]) and torch.equal(dst.long(), expected[i])


@pytest.mark.parametrize(
    "bad,message",
    [
        (torch.tensor([[0, 12], [1, 2]]), "source index 12 out of range"),
        (torch.tensor([[0, 1], [-1, 2]]), "negative vertex index -1"),
    ],
)
def test_looped_graph_checks_the_index_range(bad, message):
    with pytest.raises(ValueError, match=message):
        graph_argument.looped_graph(bad, "source_to_target", 12, 12, 12)
    with pytest.raises(ValueError, match=message):
        graph_argument.spare_row_looped_graph(bad, "source_to_target", 12, 12, 12)
    with pytest.raises(ValueError, match="^size: 13 self loops"):
        graph_argument.looped_graph(torch.tensor([[0], [1]]), "source_to_target", 12, 13, 13)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("destination", [12, 13, 2**31 + 5])
@pytest.mark.parametrize("checked_by", ["construction", "build"])
def test_spare_row_graph_refuses_a_destination_out_of_range(request, flow, destination, checked_by):
    """The spare row takes stored self loops only: an edge into the row just past the last node
    (where the spare row lies) is out of range, as is any beyond. A host index is refused in the
    caller's numbers; so is the spare-row graph of an index that skipped that check (a GPU one,
    whose graph's range check waits for nothing), though its index moved the destination a row
    further, whether its check is the whole one at construction or the build's of a small GPU graph
    (an index beyond int32 read again exactly)."""
    if checked_by == "build":
        request.getfixturevalue("interpret")
        request.getfixturevalue("user_order")
    bad = torch.tensor([[0, 5, 4], [1, destination, 4]])
    if flow == "target_to_source":
        bad = bad.flip(0)
    message = f"^edge_index: destination index {destination} out of range for num_dst=12$"
    with pytest.raises(ValueError, match=message):
        graph_argument.spare_row_looped_graph(bad, flow, 12, 12, 12)
    routed = graph_argument._spare_row_index(bad, flow, 12, 12)
    with pytest.raises(ValueError, match=message):
        graph_argument.spare_row_graph(routed, flow, 12, 12)
    with pytest.raises(ValueError, match=f"destination index {destination + 1} out of range for num_dst=13"):
        graph_argument.graph_of(routed, flow, 12, 13)  # a plain graph of the moved index names its numbers
    good = bad.clone()
    good[1 if flow == "source_to_target" else 0, 1] = 11
    graph = graph_argument.spare_row_graph(graph_argument._spare_row_index(good, flow, 12, 12), flow, 12, 12)
    assert graph.num_dst == 13 and graph.validate() is graph


@pytest.mark.parametrize("name", ["add_self_loops", "add_remaining_self_loops", "gcn_norm"])
def test_kept_graph_helpers_return_pygs_results_once_per_graph(name):
    """The keeping form returns what PyG's helper returns, the same objects for the same graph and
    arguments, new ones for other arguments, an in-place change of the graph or of a kept result."""
    pyg, kept = next((f, k) for f, k in graph_argument.KEPT_ON_THE_GRAPH.items() if f.__name__ == name)
    edge_index = make_graph(12, 40, seed=3)
    first = kept(edge_index, num_nodes=12)
    expected = pyg(edge_index, num_nodes=12)
    for a, b in zip(first, expected):
        assert (a is None and b is None) or torch.equal(a, b)
    assert all(a is b for a, b in zip(kept(edge_index, num_nodes=12), first))
    assert kept(edge_index, num_nodes=13)[0] is not first[0]
    first[0][0, 0] = 11  # a kept result changed in place is made again
    again = kept(edge_index, num_nodes=12)
    assert again[0] is not first[0] and torch.equal(again[0], expected[0])
    edge_index[0, 0] = 11
    changed = kept(edge_index, num_nodes=12)
    assert torch.equal(changed[0], pyg(edge_index, num_nodes=12)[0])


def test_kept_graph_helpers_keep_results_of_the_same_weights():
    """A result made with edge weights serves the same weights, unchanged; other weights, or the
    same changed in place, make it again; weights that require a gradient are passed through."""
    kept = graph_argument.KEPT_ON_THE_GRAPH[gcn_norm]
    edge_index = make_graph(12, 40, seed=4)
    weight = torch.rand(edge_index.size(1))
    first = kept(edge_index, weight, num_nodes=12)
    assert all(a is b for a, b in zip(kept(edge_index, weight, num_nodes=12), first))
    other = weight.clone()
    assert kept(edge_index, other, num_nodes=12)[1] is not first[1]
    weight.mul_(2)
    again = kept(edge_index, weight, num_nodes=12)
    assert torch.equal(again[1], gcn_norm(edge_index, weight, num_nodes=12)[1])
    learnt = torch.rand(edge_index.size(1), requires_grad=True)
    looped, looped_weight = kept(edge_index, learnt, num_nodes=12)
    assert looped_weight.requires_grad and kept(edge_index, learnt, num_nodes=12)[0] is not looped


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("sides", ["x_src first", "x_dst first"])
@pytest.mark.parametrize("layer_class", [GATConv, GATv2Conv])
def test_bipartite_target_to_source_of_unequal_sides(compare, bipartite_graph, layer_class, sides, train):
    """Under ``flow="target_to_source"`` the ``propagate()`` PyG generates for the attention layers
    reads ``x_j`` from ``x[0]`` and ``x_i`` from ``x[1]`` but sizes the output by ``x[0]``: sides of
    different sizes, in either order, give PyG's outputs and gradients (PyG's layer runs)."""
    x_src, _, edge_index = bipartite_graph
    x_dst = torch.randn(7, 6, generator=torch.Generator().manual_seed(5))
    pair = [x_src, x_dst] if sides == "x_src first" else [x_dst, x_src]
    index = edge_index.flip(0) % 7  # row 1 indexes x[0] and row 0 x[1], the receivers of PyG's output
    pyg_class = getattr(pyg_nn, layer_class.__name__)
    torch.manual_seed(0)
    theirs = pyg_class(6, 4, heads=2, flow="target_to_source")
    out = compare(
        layer_class(6, 4, heads=2, flow="target_to_source"),
        theirs,
        lambda layer, a, b: layer((a, b), index),
        pair,
        train=train,
    )
    assert out[0].shape == (pair[0].shape[0], 8)
