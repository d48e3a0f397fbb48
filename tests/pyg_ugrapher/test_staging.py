"""Staged ``message()`` and ``edge_update()`` runs (:mod:`pyg_ugrapher.staging`) against PyG's own
propagation: outputs and gradients of every input and parameter, on the reference executor and on
the Triton kernels through the interpreter, on graphs with an isolated vertex, self loops and
duplicate edges; and what ran where."""

import copy
import types

import pytest
import torch
from torch import nn
from torch_geometric.nn import MessagePassing as PyGMessagePassing
from torch_geometric.nn.aggr import SoftmaxAggregation
from torch_geometric.nn.conv import (
    AGNNConv,
    CGConv,
    EdgeConv,
    EGConv,
    FAConv,
    GATv2Conv,
    GENConv,
    GeneralConv,
    GMMConv,
    HEATConv,
    NNConv,
    PNAConv,
    PointTransformerConv,
    SAGEConv,
    SuperGATConv,
    TransformerConv,
)
from torch_geometric.utils import softmax

import pyg_ugrapher as ug
from pyg_ugrapher.message_passing import observe_fallbacks, observe_stages
from pyg_ugrapher.staging import ON_EDGE_ROWS, ON_EDGES, ON_NODES
from pyg_ugrapher.structure import recording_steps

from ..conftest import (
    TOLERANCE,
    assert_close,
    assert_same_results,
    layer_inputs,
    outputs_and_grads,
    ran_ops,
    relative_error,
)


def twins(body, setup=None, **init):
    """A user layer (its methods in ``body``) on ``ug.MessagePassing`` and the same on PyG's, with
    equal weights; ``setup(module)`` adds its submodules and parameters."""
    pair = []
    for base in (ug.MessagePassing, PyGMessagePassing):
        torch.manual_seed(0)
        methods = {name: _named(function, name) for name, function in body.items()}
        module = type(f"Layer_{base.__module__.split('.')[0]}", (base,), methods)(**init)
        if setup is not None:
            setup(module)
        pair.append(module)
    pair[0].load_state_dict(pair[1].state_dict())
    return pair


def _named(function, name):
    """``function`` under ``name``: PyG inspects a method by its function's name."""
    renamed = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__)
    renamed.__qualname__ = name
    return renamed


def forward(self, x, edge_index):
    return self.propagate(edge_index, x=x)


def edge_mlp_message(self, x_i, x_j):
    return self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))


def add_mlp(module, channels: int = 4, hidden: int = 5):
    module.mlp = nn.Sequential(nn.Linear(2 * channels, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def attention_message(self, x_i, x_j, index, ptr, size_i):
    alpha = torch.nn.functional.leaky_relu((x_i * self.att_dst).sum(-1) + (x_j * self.att_src).sum(-1), 0.2)
    alpha = softmax(alpha, index, ptr, size_i)
    return x_j * alpha.unsqueeze(-1)


def add_attention(module, channels: int = 4):
    module.att_src = nn.Parameter(torch.randn(channels))
    module.att_dst = nn.Parameter(torch.randn(channels))


def repeated_attention_message(self, x_i, x_j, index, ptr, size_i):
    """:func:`attention_message` of ``x_j`` repeated along its features: the capture refuses the
    repeat, a staged run repeats the node rows."""
    alpha = torch.nn.functional.leaky_relu((x_i * self.att_dst).sum(-1) + (x_j * self.att_src).sum(-1), 0.2)
    alpha = softmax(alpha, index, ptr, size_i)
    return x_j.repeat(1, 2) * alpha.unsqueeze(-1)


EDGE_MLP = ({"forward": forward, "message": edge_mlp_message}, add_mlp)
ATTENTION = ({"forward": forward, "message": attention_message}, add_attention)
STAGED_ATTENTION = ({"forward": forward, "message": repeated_attention_message}, add_attention)


@pytest.mark.parametrize("aggr", ["max", "mean"])
def test_linear_of_a_concatenation_is_split_by_linearity(executor, aggr):
    x, edge_index = layer_inputs(executor)
    ours, theirs = twins(*EDGE_MLP, aggr=aggr)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index), aggr)
    assert ours.fallback_reason is None and ours.capture is None
    assert "split by linearity" in ours.staged_reason and "MLP" in ours.staged_reason
    # The first Linear runs on node rows: one operator computes relu(A[dst] + B[src]) per edge,
    # PyTorch the second Linear, and one operator aggregates; no [E, 2F] concatenation is made.
    names = ran_ops(ours, x, edge_index)
    assert len(names) == 2 and names[-1] == f"copy_e_{aggr}", names


def towers_forward(self, x, edge_index):
    return self.propagate(edge_index, x=x.view(-1, 2, x.shape[-1] // 2))


def tower_message(self, x_i, x_j):
    """PNA's pattern: a Linear of each tower of a concatenation, stacked."""
    h = torch.cat([x_i, x_j], dim=-1)
    return torch.stack([self.lin(h[:, self.tower])], dim=1)


def add_tower_linear(module, tower: int = 1):
    module.lin, module.tower = nn.Linear(4, 3), tower


@pytest.mark.parametrize("aggr", ["sum", "max"])
def test_a_tower_of_a_concatenation_is_picked_on_node_rows(executor, aggr):
    """``h[:, i]`` of a concatenation of node operands indexes the node tensors, and a stack of one
    value is a new feature dimension: the message is captured, one operator fused into the gather."""
    x, edge_index = layer_inputs(executor)
    body = {"forward": towers_forward, "message": tower_message}
    ours, theirs = twins(body, add_tower_linear, aggr=aggr, node_dim=0)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index), aggr)
    assert ours.fallback_reason is None and ours.staged_reason is None
    assert ran_ops(ours, x, edge_index) == [f"v_add_u_{aggr}"]


def repeated_message(self, x_j, x_i):
    """A value repeated over a new feature dimension (PNA's edge features over its towers)."""
    return (x_j.view(-1, 1, x_j.shape[-1]).repeat(1, 2, 1) * self.scale).sum(-2) + x_i


def add_scale(module):
    module.scale = nn.Parameter(torch.tensor([[0.5], [2.0]]))


def test_a_repeat_along_the_features_repeats_the_operand_rows(executor):
    x, edge_index = layer_inputs(executor)
    ours, theirs = twins({"forward": forward, "message": repeated_message}, add_scale, aggr="mean")
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    in_pytorch = ours.staged_reason.split(" (")[0]  # the parenthesis says why the capture failed
    assert ours.fallback_reason is None and "repeat" not in in_pytorch


def indexed_message(self, x_j):
    return x_j[:, 0:1] * x_j[:, 1:].sum(-1, keepdim=True)  # a slice, a pick, then a value of it


def test_feature_picks_and_slices_of_an_operand_are_captured(executor):
    """Picks and slices of one end's features, and a dot product of them computed with: one value
    per vertex, computed before the fused operator."""
    x, edge_index = layer_inputs(executor)
    ours, theirs = twins({"forward": forward, "message": indexed_message}, aggr="sum")
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert ours.fallback_reason is None and ours.staged_reason is None
    assert [type(value).__name__ for value in ours.capture.values] == ["NodeStep"]


def dropped_edge_message(self, x_j):
    return x_j[1:]  # not a pick along the features: PyG's own result has one message too few


def test_indexing_along_the_edges_runs_in_pytorch():
    x, edge_index = layer_inputs("reference")
    ours, theirs = twins({"forward": forward, "message": dropped_edge_message}, aggr="sum")
    with pytest.raises(Exception) as theirs_error:
        theirs(x, edge_index)
    with pytest.raises(type(theirs_error.value)):
        ours(x, edge_index)


def test_segment_softmax_is_captured(executor):
    """PyG's softmax over the receivers, in a message() the capture takes whole: scores, maxima,
    sums and weights are steps of the capture, the weighted messages one fused gather."""
    x, edge_index = layer_inputs(executor)
    ours, theirs = twins(*ATTENTION)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert ours.fallback_reason is None and ours.staged_reason is None
    assert [op.gather_op for op in ours.capture.ops] == [None, "max", "sum", None, "sum"]
    names = ran_ops(ours, x, edge_index)
    assert len(names) == 5 and names[-1] == "u_mul_e_sum", names


def test_segment_softmax_runs_as_graph_operators_when_staged(executor):
    x, edge_index = layer_inputs(executor)
    ours, theirs = twins(*STAGED_ATTENTION, node_dim=0)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert "torch_geometric.utils.softmax" not in ours.staged_reason and "repeat" in ours.staged_reason
    names = ran_ops(ours, x, edge_index)
    assert "copy_e_max" in names and names[-1] == "u_mul_e_sum", names


def test_softmax_over_another_index_is_pygs():
    x, edge_index = layer_inputs("reference")

    def message(self, x_j, index):
        return x_j * softmax((x_j * self.att_src).sum(-1), index.flip(0)).unsqueeze(-1)

    ours, theirs = twins({"forward": forward, "message": message}, add_attention)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert "torch_geometric.utils.softmax" in ours.staged_reason


@pytest.mark.parametrize("attention", [ATTENTION, STAGED_ATTENTION], ids=["captured", "staged"])
def test_softmax_leaves_isolated_receivers_empty_and_handles_a_hub(attention):
    """float32 against PyG in float64, within the float32 tolerance or twice PyG's own float32 error,
    whichever is larger: a softmax over 100k edges is about 1e-5 off in float32, in PyG too, and the
    gradient of the hub's own score cancels over its edges."""
    generator = torch.Generator().manual_seed(1)
    num_nodes, hub_edges = 50, 100_000
    hub = torch.stack([torch.randint(0, num_nodes, (hub_edges,), generator=generator), torch.zeros(hub_edges).long()])
    rest = torch.randint(1, num_nodes - 1, (2, 300), generator=generator)
    edge_index = torch.cat([hub, rest], dim=1)
    x = torch.randn(num_nodes, 4, generator=generator)
    ours, theirs = twins(*attention, node_dim=0)
    mine, pyg = outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index)
    exact = outputs_and_grads(theirs.double(), x.double(), edge_index)
    for index, (a, b, c) in enumerate(zip(mine, pyg, exact)):
        assert relative_error(a, c) <= max(TOLERANCE[torch.float32], 2 * relative_error(b, c)), index
    assert mine[0][num_nodes - 1].abs().max() == 0
    assert ours.fallback_reason is None and (ours.staged_reason is None) == (attention is ATTENTION)


def test_empty_graph():
    x = torch.randn(5, 4)
    edge_index = torch.empty(2, 0, dtype=torch.long)
    for body, setup in (ATTENTION, EDGE_MLP):
        ours, theirs = twins(body, setup)
        assert_same_results(
            outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index), body["message"].__name__
        )


def test_half_precision_softmax():
    """bfloat16 against float64 PyG: the output and the input gradient within the half-type
    tolerance; the attention vectors' gradients are sums over every edge of terms that cancel (the
    receiver's own term cancels in the softmax up to the leaky ReLU), where bfloat16 rounding alone
    moves PyG's own bfloat16 gradients by about 1% of the largest gradient: twice that is allowed."""
    x, edge_index = layer_inputs("reference", dtype=torch.bfloat16)
    ours, theirs = twins(*ATTENTION)
    mine, reference = (
        outputs_and_grads(ours.to(torch.bfloat16), x, edge_index),
        outputs_and_grads(theirs.double(), x.double(), edge_index),
    )
    largest = max(t.abs().max().item() for t in reference[1:])
    assert all(t.dtype == torch.bfloat16 for t in mine)
    assert relative_error(mine[0].double(), reference[0]) <= TOLERANCE[torch.bfloat16]
    assert relative_error(mine[1].double(), reference[1], largest) <= TOLERANCE[torch.bfloat16]
    for a, b in zip(mine[2:], reference[2:]):
        assert relative_error(a.double(), b, largest) <= 2 * TOLERANCE[torch.bfloat16]


def _forward_ops(model, *args):
    """The graph operators one forward pass runs."""
    calls = []
    with ug.ops.observe(calls.append), torch.no_grad():
        model(*args)
    return [call.op for call in calls]


def softmax_aggregated_message(self, x_j, x_i):
    return torch.relu(x_j - x_i) + 0.1


@pytest.mark.parametrize(
    "t, learn, channels, semi_grad",
    [(1.0, False, 1, False), (0.5, False, 1, True), (0.5, True, 1, False), (0.5, True, 4, False)],
    ids=["plain", "semi-grad", "learn", "learn-per-channel"],
)
def test_softmax_aggregation_runs_as_gathers(executor, t, learn, channels, semi_grad):
    """``SoftmaxAggregation`` of a symbolic message is three gathers that recompute the message
    (the receivers' largest scaled message, the sums of the shifted exponentials, and the weighted
    messages): no operator writes per-edge values; captured, or staged with ``semi_grad``. Outputs
    and gradients (of the temperature too) equal PyG's, float64, with an isolated receiver, self
    loops and duplicate edges."""
    x, edge_index = layer_inputs(executor, dtype=torch.float64)
    aggr = SoftmaxAggregation(t=t, learn=learn, channels=channels, semi_grad=semi_grad)
    ours, theirs = twins({"forward": forward, "message": softmax_aggregated_message}, aggr=copy.deepcopy(aggr))
    theirs.aggr_module = aggr
    ours, theirs = ours.double(), theirs.double()
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert ours.fallback_reason is None
    if semi_grad:  # the weights take no gradient: a staged run computes them from detached operands
        assert "SoftmaxAggregation" in ours.staged_reason
    else:
        assert ours.staged_reason is None and ours.capture is not None
    assert [op.gather_op for op in _forward_ops(ours, x, edge_index)] == ["max", "sum", "sum"]


def test_softmax_aggregation_of_edge_features():
    """GENConv's message (``relu(x_j + lin_edge(edge_attr)) + eps``) and learnable temperature,
    captured: the edge features' Linear multiplies their rows, the aggregation is three gathers, and
    no per-edge value is written or computed in PyTorch; on a graph with a hub of 200 edges too."""
    x, edge_index = layer_inputs("reference", features=6, dtype=torch.float64)
    hub = torch.stack(
        [
            torch.randint(0, x.size(0), (200,), generator=torch.Generator().manual_seed(1)),
            torch.zeros(200, dtype=torch.long),
        ]
    )
    for graph in (edge_index, torch.cat([edge_index, hub], dim=1)):
        edge_attr = torch.randn(graph.size(1), 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        torch.manual_seed(0)
        theirs = GENConv(6, 6, edge_dim=3, learn_t=True, t=2.0).double()
        ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
        assert_same_results(
            outputs_and_grads(ours, x, graph, edge_attr), outputs_and_grads(theirs, x, graph, edge_attr)
        )
        assert all(op.gather_op is not None for op in _forward_ops(ours, x, graph, edge_attr))
        assert ours.staged_reason is None and [p.source.argument for p in ours.capture.products] == ["edge_attr"]


def test_stored_attention_weights_are_real_tensors(executor):
    x, edge_index = layer_inputs(executor)
    theirs = FAConv(4)
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    for _ in range(2):  # the second call takes the cached verdict
        out, (_, alpha) = ours(x, x, edge_index, return_attention_weights=True)
        expected, (_, expected_alpha) = theirs(x, x, edge_index, return_attention_weights=True)
        assert type(alpha) is torch.Tensor
        assert_close(out, expected)
        assert_close(alpha, expected_alpha)
    assert ours._alpha is None


def test_edge_updater_runs_staged(executor):
    x, edge_index = layer_inputs(executor, features=6)
    attr = torch.randn(edge_index.size(1), 3)
    theirs = GATv2Conv(6, 2, heads=2, edge_dim=3)
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    assert_same_results(outputs_and_grads(ours, x, edge_index, attr), outputs_and_grads(theirs, x, edge_index, attr))
    assert ours.edge_fallback_reason is None and ours.fallback_reason is None
    names = ran_ops(ours, x, edge_index, attr)
    assert "copy_e_max" in names, names


def test_own_edge_updater_is_kept():
    x, edge_index = layer_inputs("reference", features=6)

    class OwnUpdater(GATv2Conv):
        def edge_updater(self, edge_index, size=None, **kwargs):
            return PyGMessagePassing.edge_updater(self, edge_index, size=size, **kwargs) * 1.0

    theirs = OwnUpdater(6, 2, heads=2)
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert "its own edge_updater()" in ours.edge_fallback_reason


@pytest.mark.parametrize(
    "build, extra, runs_as",
    [
        (lambda: TransformerConv(6, 3, heads=2, edge_dim=3), "edge_attr", "fused"),
        (lambda: EdgeConv(nn.Sequential(nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 4)), aggr="max"), None, "staged"),
        (lambda: GENConv(6, 6, edge_dim=3), "edge_attr", "fused"),
        (lambda: AGNNConv(), None, "fused"),
        (lambda: NNConv(6, 4, nn.Linear(3, 24), aggr="mean"), "edge_attr", "fused"),
        (lambda: PointTransformerConv(6, 4), "pos", "fused"),
    ],
    ids=["TransformerConv", "EdgeConv", "GENConv", "AGNNConv", "NNConv", "PointTransformerConv"],
)
def test_pyg_layers_run_fused_or_staged(build, extra, runs_as):
    """PyG's layers whose message() has a softmax, parameters, a Linear of its arguments or a matmul
    of per-edge matrices (NNConv) are captured whole; an MLP after an activation runs staged."""
    x, edge_index = layer_inputs("reference", features=6, dtype=torch.float64)
    torch.manual_seed(0)
    theirs = build().double()
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    generator = torch.Generator().manual_seed(3)
    args = {
        None: (edge_index,),
        "edge_attr": (edge_index, torch.randn(edge_index.size(1), 3, generator=generator, dtype=torch.float64)),
        "pos": (torch.randn(x.size(0), 3, generator=generator, dtype=torch.float64), edge_index),
    }[extra]
    assert_same_results(outputs_and_grads(ours, x, *args), outputs_and_grads(theirs, x, *args), type(theirs).__name__)
    report = ours.ugrapher_report.observe(x, *args)
    assert report[""].runs_as == runs_as and report[""].fallbacks == (), str(report)


def test_in_place_change_of_a_traced_value_takes_pygs_path():
    x, edge_index = layer_inputs("reference")

    def message(self, x_j):
        return torch.cat([x_j, x_j.relu_()], dim=-1)

    ours, theirs = twins({"forward": forward, "message": message})
    assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
    assert "in place" in ours.fallback_reason and ours.staged_reason is None


@pytest.mark.parametrize(
    "build, edge_dim",
    [
        (lambda: GATv2Conv(6, 3, heads=2, edge_dim=3), 3),
        (lambda: TransformerConv(6, 3, heads=2, edge_dim=3), 3),
        (lambda: EdgeConv(nn.Sequential(nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 4)), aggr="max"), None),
        (lambda: GENConv(6, 6), None),
    ],
    ids=["GATv2Conv", "TransformerConv", "EdgeConv", "GENConv"],
)
def test_staged_layers_on_the_device(device, build, edge_dim):
    """The kernels themselves (the GPU, or the interpreter), float32, against PyG on the same device."""
    x, edge_index = layer_inputs("interpreter", features=6)
    args = [edge_index.to(device)]
    if edge_dim:
        args.append(torch.randn(edge_index.size(1), edge_dim, generator=torch.Generator().manual_seed(5)).to(device))
    torch.manual_seed(0)
    theirs = build().to(device)
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    assert_same_results(
        outputs_and_grads(ours, x.to(device), *args),
        outputs_and_grads(theirs, x.to(device), *args),
        type(theirs).__name__,
    )
    assert ours.fallback_reason is None and ours.edge_fallback_reason is None


@pytest.mark.parametrize(
    "build",
    [
        lambda: EdgeConv(nn.Sequential(nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 4)), aggr="max"),
        lambda: GENConv(6, 6, aggr=SoftmaxAggregation(semi_grad=True)),
    ],
    ids=["EdgeConv", "GENConv"],
)
@pytest.mark.parametrize("large", [True, False], ids=["large", "small"])
def test_staged_layer_under_torch_compile(monkeypatch, build, large):
    """On a large graph the staged propagation runs outside the compiled graph, on graph operators;
    on a small one, PyG's propagation runs, compiled where Dynamo traces it."""
    x, edge_index = layer_inputs("reference", features=6)
    limit = edge_index.size(1) if large else edge_index.size(1) + 1
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", limit)
    torch.manual_seed(0)
    theirs = build()
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="aot_eager")
    mine = outputs_and_grads(compiled, x, edge_index)
    if large:
        assert ours.staged_reason is not None and ours.fallback_reason is None
    else:  # compiled, or left to eager mode by Dynamo: PyG's
        assert ours.staged_reason is None and "fewer than" in ours.fallback_reason
    assert_same_results(mine[:2], outputs_and_grads(theirs, x, edge_index)[:2], type(theirs).__name__)


def _attention_mlp_message(self, x_i, x_j, index, ptr, size_i):
    h = self.lin(torch.cat([x_i, x_j], dim=-1))
    return h * softmax((h * self.att).sum(-1), index, ptr, size_i).unsqueeze(-1)


def _add_attention_mlp(module):
    module.lin = nn.Linear(8, 3)
    module.att = nn.Parameter(torch.randn(3))


def _forward_sized(self, x, edge_index, size=None):
    return self.propagate(edge_index, x=x, size=size)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("graph_input", ["edge_index", "bipartite", "EdgeIndex", "sparse"])
def test_graph_inputs_and_flows(flow, graph_input):
    """Captures (a Linear of a concatenation, a softmax) on every graph input PyG's propagate takes,
    in both flows: the softmax is ours wherever PyG hands message() the receivers."""
    from torch_geometric import EdgeIndex

    if graph_input == "sparse" and flow == "target_to_source":
        pytest.skip("PyG reads a sparse adjacency in the source_to_target flow only")
    generator = torch.Generator().manual_seed(7)
    body = {"forward": _forward_sized, "message": _attention_mlp_message}
    ours, theirs = twins(body, _add_attention_mlp, aggr="mean", flow=flow)
    x = torch.randn(10, 4, generator=generator)
    edge_index = torch.randint(0, 10, (2, 40), generator=generator)
    args, kwargs = (x, edge_index), {}
    if graph_input == "bipartite":
        sizes = (7, 4) if flow == "source_to_target" else (4, 7)
        index = torch.stack([torch.randint(0, sizes[0], (30,)), torch.randint(0, sizes[1], (30,))])
        pair = (torch.randn(7, 4, generator=generator), torch.randn(4, 4, generator=generator))
        args, kwargs = (pair if flow == "source_to_target" else pair[::-1], index), {"size": sizes}
    elif graph_input == "EdgeIndex":
        args = (x, EdgeIndex(edge_index, sparse_size=(10, 10)).sort_by("col")[0])
    elif graph_input == "sparse":
        args = (x, torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(40), (10, 10)).coalesce())
    with torch.no_grad():
        mine, reference = ours(*args, **kwargs), theirs(*args, **kwargs)
    assert_close(mine, reference)
    assert ours.fallback_reason is None and ours.staged_reason is None


@pytest.mark.parametrize("graph_size", ["at_the_threshold", "below_it"])
def test_small_graphs_run_pygs_propagation(monkeypatch, graph_size):
    """In eager mode too, a propagation that would run staged runs PyG's on a graph of fewer than
    ``staged_min_edges`` edges (with the reason), and stages from that many; the results are PyG's
    either way. GATv2's ``edge_update()`` follows the same rule."""
    x, edge_index = layer_inputs("reference", features=6)
    num_edges = edge_index.size(1)
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", num_edges + (graph_size == "below_it"))
    torch.manual_seed(0)
    for build in (
        lambda: EdgeConv(nn.Sequential(nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 4))),
        lambda: GATv2Conv(6, 3, heads=2, add_self_loops=False),
    ):
        theirs = build()
        ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
        assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
        staged = ours.staged_reason if isinstance(theirs, EdgeConv) else ours.edge_fallback_reason is None
        fallback = ours.fallback_reason if isinstance(theirs, EdgeConv) else ours.edge_fallback_reason
        if graph_size == "at_the_threshold":
            assert staged and fallback is None
        else:
            assert not staged and f"fewer than {num_edges + 1} edges runs PyG's propagation" in fallback


@pytest.mark.parametrize("graph_size", ["at_the_threshold", "below_it"])
def test_captures_of_several_operators_follow_the_same_rule(monkeypatch, graph_size):
    """A capture that runs graph operators before the fused one (TransformerConv's softmax) runs PyG's
    propagation below ``staged_min_edges`` edges too, except while a whole step is recorded; a
    capture of one operator (EdgeConv with a Linear) runs on every graph."""
    x, edge_index = layer_inputs("reference", features=6)
    num_edges = edge_index.size(1)
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", num_edges + (graph_size == "below_it"))
    torch.manual_seed(0)
    transformer, edge, parts = (
        TransformerConv(6, 3, heads=2),
        EdgeConv(nn.Linear(12, 4)),
        SAGEConv(6, 4, aggr=["mean", "max"]),
    )
    for theirs in (transformer, edge, parts):
        ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
        assert_same_results(outputs_and_grads(ours, x, edge_index), outputs_and_grads(theirs, x, edge_index))
        if graph_size == "below_it" and theirs is parts:
            assert ours.capture is None and "a gather per part of its aggregation" in ours.fallback_reason
        elif graph_size == "below_it" and theirs is transformer:
            assert ours.capture is None and "the capture runs 5 graph operators" in ours.fallback_reason
            with recording_steps():
                assert_close(ours(x, edge_index), theirs(x, edge_index))
            assert ours.fallback_reason is None and len(ours.capture.ops) == 5
        else:
            assert ours.fallback_reason is None and ours.capture is not None


def single_linear_message(self, x_i, x_j):
    return self.lin(torch.cat([x_i, x_j - x_i], dim=-1)).relu()


def edge_linear_message(self, x_j, edge_attr):
    return x_j * self.lin_edge(edge_attr)


def edge_chain_message(self, x_j, edge_attr):
    """HEATConv's pattern: a Linear of a nonlinear function of a Linear of the edge features."""
    return x_j * self.lin(torch.nn.functional.leaky_relu(self.lin_edge(edge_attr), 0.2))


def edge_and_node_linear_message(self, x_i, x_j, edge_attr):
    """CGConv's pattern: a Linear of a concatenation of node and edge features."""
    return self.lin(torch.cat([x_i, x_j, edge_attr], dim=-1)).sigmoid()


def vertex_value_linear_message(self, x_i, x_j, edge_attr):
    """A Linear of edge features plus a per-edge value of gathered vertex rows (a dot product,
    computed per edge first): a linear combination, split by linearity, that is not an edge input."""
    return x_j * self.lin_edge(edge_attr + (x_i * x_j).sum(-1, keepdim=True))


def forward_with_edges(self, x, edge_index, edge_attr):
    return self.propagate(edge_index, x=x, edge_attr=edge_attr)


def _linears(**shapes):
    def setup(module):
        for name, (a, b) in shapes.items():
            setattr(module, name, nn.Linear(a, b))

    return setup


LINEAR_CASES = {
    # case: (message, Linear maps, edge feature width, phrases of the staged reason)
    "mlp": (edge_mlp_message, add_mlp, None, {ON_NODES, ON_EDGES}),
    "vertex_value": (vertex_value_linear_message, _linears(lin_edge=(1, 4)), 1, {ON_EDGES}),
}
#: Linear maps of arguments alone: captured, as products of the node or edge-feature rows.
CAPTURED_LINEAR_CASES = {
    "node_rows": (single_linear_message, _linears(lin=(8, 4)), None, {"x_i", "x_j"}),
    "edge_features": (edge_linear_message, _linears(lin_edge=(3, 4)), 3, {"edge_attr"}),
    "edge_and_node_rows": (edge_and_node_linear_message, _linears(lin=(11, 4)), 3, {"x_i", "x_j", "edge_attr"}),
    # a Linear of a nonlinear transform of the edge features alone: written per edge, then multiplied
    "edge_chain": (edge_chain_message, _linears(lin_edge=(3, 5), lin=(5, 4)), 3, {"edge_attr"}),
}


def _ours_equal_pygs(executor, case, message, setup, edge_width):
    """Our twin of a layer with ``message()`` (and edge features of ``edge_width``, if any), whose
    outputs and gradients equal PyG's, float64."""
    x, edge_index = layer_inputs(executor, dtype=torch.float64)
    body = {"forward": forward if edge_width is None else forward_with_edges, "message": message}
    ours, theirs = (module.double() for module in twins(body, setup))
    args = (x, edge_index)
    if edge_width is not None:
        generator = torch.Generator().manual_seed(3)
        args += (torch.randn(edge_index.size(1), edge_width, generator=generator, dtype=torch.float64),)
    assert_same_results(outputs_and_grads(ours, *args), outputs_and_grads(theirs, *args), case)
    return ours


@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_the_staged_reason_says_where_linear_maps_ran(executor, case):
    """A Linear split into products of the node rows is named as such, and one of the edge
    features' rows (edge features given to propagate(), or values computed from them alone) as
    such: every per-edge value then comes from graph operators. A second Linear after a
    nonlinearity of gathered vertex rows, or a Linear of a per-edge value computed from vertex
    rows, runs in PyTorch on per-edge values and is named so."""
    message, setup, edge_width, phrases = LINEAR_CASES[case]
    ours = _ours_equal_pygs(executor, case, message, setup, edge_width)
    reason = ours.staged_reason
    assert ours.fallback_reason is None and reason is not None
    for phrase in (ON_NODES, ON_EDGES, ON_EDGE_ROWS):
        assert (phrase in reason) == (phrase in phrases), (phrase, reason)
    if case == "vertex_value":
        assert "linear (split by linearity, of per-edge values) " + ON_EDGES in reason, reason


@pytest.mark.parametrize("case", list(CAPTURED_LINEAR_CASES))
def test_linear_maps_of_arguments_are_captured_as_products(executor, case):
    """A Linear of arguments alone (or of a concatenation of them) is captured, not staged: one
    product per argument it reads, each multiplying that argument's rows before the fused kernel."""
    message, setup, edge_width, arguments = CAPTURED_LINEAR_CASES[case]
    ours = _ours_equal_pygs(executor, case, message, setup, edge_width)
    assert ours.fallback_reason is None and ours.staged_reason is None
    sources = {product.source.argument for product in ours.capture.products}
    assert {source for source in sources if not source.startswith("%")} == arguments
    assert len(ours.capture.ops) == (2 if case == "edge_chain" else 1)  # edge_chain: its transform per edge


@pytest.mark.parametrize(
    "build",
    [
        lambda: TransformerConv(6, 3, heads=2, edge_dim=3),
        lambda: CGConv(6, dim=3),
        lambda: GeneralConv(6, 5, in_edge_channels=3),
        lambda: GATv2Conv(6, 3, heads=2, edge_dim=3),
        lambda: GENConv(6, 6, edge_dim=3),
        lambda: PNAConv(6, 6, ["mean", "max", "std"], ["identity", "linear"], torch.tensor([1, 4, 3, 2]), edge_dim=3),
        lambda: HEATConv(6, 4, 2, 3, edge_type_emb_dim=2, edge_dim=3, edge_attr_emb_dim=4, heads=2),
    ],
    ids=["TransformerConv", "CGConv", "GeneralConv", "GATv2Conv", "GENConv", "PNAConv", "HEATConv"],
)
def test_pyg_layers_multiply_edge_features_as_input_transforms(build):
    """PyG's layers that apply a Linear to their edge features (alone, or in a concatenation with
    node features) equal PyG's, float64, and compute no per-edge value in PyTorch: the Linear is a
    product of the edge features' rows, in the capture (CGConv, GeneralConv, GENConv, TransformerConv,
    PNAConv and HEATConv) or named as such in a staged run."""
    x, edge_index = layer_inputs("reference", features=6, dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=generator, dtype=torch.float64)
    torch.manual_seed(0)
    theirs = build().double()
    args = (edge_index, edge_attr)
    if isinstance(theirs, HEATConv):
        node_type = torch.randint(0, 2, (x.size(0),), generator=generator)
        args = (edge_index, node_type, torch.randint(0, 3, (edge_index.size(1),), generator=generator), edge_attr)
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    assert_same_results(outputs_and_grads(ours, x, *args), outputs_and_grads(theirs, x, *args), type(theirs).__name__)
    stages, fallbacks = [], []
    with (
        observe_stages(lambda module, text: stages.append(text)),
        observe_fallbacks(lambda module, text: fallbacks.append(text)),
    ):
        ours(x, *args)
    assert not fallbacks, fallbacks
    if isinstance(theirs, (CGConv, GeneralConv, GENConv, TransformerConv, PNAConv, HEATConv)):
        assert not stages and "edge_attr" in {product.source.argument for product in ours.capture.products}
        return
    assert any(ON_EDGE_ROWS in text for text in stages), stages
    assert not any(ON_EDGES in text for text in stages), stages


@pytest.mark.parametrize(
    "build, edge_dim",
    [
        (lambda: EdgeConv(nn.Linear(8, 3), aggr="max"), None),
        (lambda: NNConv(4, 3, nn.Linear(2, 12)), 2),
        (lambda: GMMConv(4, 3, dim=2, kernel_size=2), 2),
        (lambda: SuperGATConv(4, 3, heads=2).eval(), None),
        (lambda: EGConv(4, 8), None),
    ],
    ids=["EdgeConv", "NNConv", "GMMConv", "SuperGATConv", "EGConv"],
)
@pytest.mark.parametrize("graph", ["empty", "hub"])
def test_captures_on_an_empty_graph_and_a_hub(monkeypatch, build, edge_dim, graph):
    """Node-row products (EdgeConv), per-edge matrices (NNConv), a tensor computed from parameters
    (GMMConv), a softmax in another method (SuperGATConv) and the module's own aggregate() (EGConv)
    on a graph without edges and on one whose hub receives 100,000 edges beside isolated vertices:
    PyG's results, float64, every propagation captured (also those of several operators)."""
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", 0)
    generator = torch.Generator().manual_seed(12)
    num_nodes = 40
    if graph == "empty":
        edge_index = torch.empty(2, 0, dtype=torch.long)
    else:
        src = torch.randint(0, num_nodes - 5, (100_000,), generator=generator)
        edge_index = torch.stack([src, torch.where(torch.arange(100_000) % 100 == 0, src % 9, 0)])
    x = torch.randn(num_nodes, 4, generator=generator, dtype=torch.float64)
    args = [edge_index]
    if edge_dim:
        args.append(torch.randn(edge_index.size(1), edge_dim, generator=generator, dtype=torch.float64))
    torch.manual_seed(0)
    theirs = build().double()
    ours = ug.accelerate(copy.deepcopy(theirs), inplace=False)
    assert_same_results(outputs_and_grads(ours, x, *args), outputs_and_grads(theirs, x, *args), graph)
    assert ours.fallback_reason is None and ours.staged_reason is None
