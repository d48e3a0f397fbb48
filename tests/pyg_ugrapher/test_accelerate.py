"""``ug.accelerate`` against the unconverted PyG model: known layers swapped for the drop-ins, other
``MessagePassing`` layers routed through our capture, the same outputs and gradients (float64, on the
reference executor), and a report that says what each layer became and how it ran."""

import copy
import pickle

import pytest
import torch
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.conv import (
    EdgeConv,
    EGConv,
    GATConv,
    GATv2Conv,
    GCNConv,
    GINConv,
    GMMConv,
    GraphConv,
    LEConv,
    LGConv,
    SAGEConv,
    SuperGATConv,
)
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

import pyg_ugrapher as ug
from pyg_ugrapher import nn as drop_ins
from pyg_ugrapher import ops
from pyg_ugrapher.acceleration import routed_class

from ..conftest import assert_close

F_IN = 6


@pytest.fixture
def graph():
    """Features, edge index (an isolated vertex, a self loop, a duplicate edge) and edge weights."""
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 9, (2, 30), generator=generator)
    edge_index[:, 0] = 3
    edge_index = torch.cat([edge_index, edge_index[:, :2]], dim=1)
    x = torch.randn(10, F_IN, generator=generator, dtype=torch.float64)
    edge_weight = torch.rand(edge_index.size(1), generator=generator, dtype=torch.float64) + 0.5
    return x, edge_index, edge_weight


def outputs_and_grads(model, x, *args, **kwargs):
    """The model's output and the gradients of every parameter and of ``x`` for a fixed loss."""
    x = x.clone().requires_grad_()
    out = model(x, *args, **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * weights).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    grads["x"] = x.grad
    return out, grads


def assert_same(ours, theirs, context):
    """Outputs and gradients equal; each gradient relative to the model's largest at least, since
    some cancel to zero (GATv2's ``lin_r`` through a softmax) and differ there by rounding alone."""
    (out, grads), (expected, expected_grads) = ours, theirs
    assert_close(out, expected, context=f"{context}: output")
    assert grads.keys() == expected_grads.keys(), context
    largest = max((g.abs().max().item() for g in expected_grads.values() if g is not None and g.numel()), default=0.0)
    for name, grad in expected_grads.items():
        assert (grads[name] is None) == (grad is None), f"{context}: gradient of {name}"
        if grad is not None:
            assert_close(grads[name], grad, context=f"{context}: gradient of {name}", scale=largest)


def convert_and_compare(model, *inputs, inplace=True, **kwargs):
    """``(converted model, its report)`` after checking outputs and gradients against ``model``."""
    model = model.double()
    reference = copy.deepcopy(model)
    converted = ug.accelerate(model, inplace=inplace)
    assert_same(
        outputs_and_grads(converted, *inputs, **kwargs),
        outputs_and_grads(reference, *inputs, **kwargs),
        type(model).__name__,
    )
    return converted, converted.ugrapher_report


class Mixed(torch.nn.Module):
    """Four known layers, two routed ones that fuse (one through a Linear split into products of the
    node rows) and one whose message() runs staged (an MLP)."""

    def __init__(self):
        super().__init__()
        self.gcn = GCNConv(F_IN, 8)
        self.gat = GATConv(8, 4, heads=2)
        self.sage = SAGEConv(8, 8, aggr="max")
        self.gatv2 = GATv2Conv(8, 4, heads=2, concat=False)
        self.le = LEConv(4, 5)
        self.point = EdgeConv(torch.nn.Linear(10, 5), aggr="max")
        self.edge = EdgeConv(
            torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)), aggr="mean"
        )

    def forward(self, x, edge_index, edge_weight):
        x = self.gcn(x, edge_index, edge_weight).relu()
        x = self.sage(self.gat(x, edge_index), edge_index).tanh()
        x = self.le(self.gatv2(x, edge_index), edge_index, edge_weight)
        return self.edge(self.point(x, edge_index), edge_index)


def test_mixed_model(graph):
    # Seeded: with some initialisations a max aggregation's result is exactly 0, where PyG's
    # gradient differs from ours by design (docs/limitations.md), and which ones depends on the
    # tests run before this one.
    torch.manual_seed(0)
    model = Mixed()
    parameters = list(model.parameters())
    converted, report = convert_and_compare(model, *graph)
    assert converted is model
    assert [p is q for p, q in zip(parameters, converted.parameters())] == [True] * len(parameters)
    assert isinstance(model.gcn, drop_ins.GCNConv) and isinstance(model.gat, drop_ins.GATConv)
    assert isinstance(model.sage, drop_ins.SAGEConv) and isinstance(model.gatv2, drop_ins.GATv2Conv)
    assert type(model.le) is routed_class(LEConv) and isinstance(model.le, (ug.MessagePassing, LEConv))
    report.observe(*graph)
    runs = {layer.name: (layer.conversion, layer.runs_as) for layer in report}
    assert runs == {
        "gcn": ("swapped", "drop-in"),
        "gat": ("swapped", "drop-in"),
        "sage": ("swapped", "drop-in"),
        "gatv2": ("swapped", "drop-in"),
        "le": ("routed", "fused"),
        "point": ("routed", "fused"),
        "edge": ("routed", "staged"),
    }
    assert report["le"].ops == 1 and report["point"].ops == 1 and report["gatv2"].edge_updates == 0
    assert "MLP" in report["edge"].why and "split by linearity" in report["edge"].why
    text = str(report)
    assert text.splitlines()[0].startswith("ug.accelerate: 4 swapped, 3 routed, 0 kept")
    assert all(name in text for name in runs)


def test_copy_leaves_the_model(graph):
    model = Mixed()
    converted, _ = convert_and_compare(model, *graph, inplace=False)
    assert converted is not model and type(model.gcn) is GCNConv and type(model.le) is LEConv
    assert not hasattr(model, "ugrapher_report")


@pytest.mark.parametrize(
    "build, drop_in, kwargs",
    [
        (lambda: GCN(F_IN, 8, num_layers=2, out_channels=3), drop_ins.GCNConv, {"edge_weight": True}),
        (lambda: GraphSAGE(F_IN, 8, num_layers=2, aggr="max"), drop_ins.SAGEConv, {}),
        (lambda: GAT(F_IN, 4, num_layers=2, heads=2, edge_dim=2), drop_ins.GATConv, {"edge_attr": True}),
        (lambda: GIN(F_IN, 8, num_layers=2, train_eps=True), drop_ins.GINConv, {}),
    ],
    ids=["GCN", "GraphSAGE", "GAT", "GIN"],
)
def test_basic_models(graph, build, drop_in, kwargs):
    torch.manual_seed(0)
    x, edge_index, edge_weight = graph
    inputs = {}
    if "edge_weight" in kwargs:
        inputs["edge_weight"] = edge_weight
    if "edge_attr" in kwargs:
        inputs["edge_attr"] = torch.stack([edge_weight, edge_weight.sqrt()], dim=1)
    model = build().eval()
    converted, report = convert_and_compare(model, x, edge_index, **inputs)
    assert all(type(conv) is drop_in for conv in converted.convs)
    assert [layer.conversion for layer in report] == ["swapped", "swapped"]
    assert not converted.training


class Weighted(MessagePassing):
    """A user's layer: a weighted mean of transformed neighbours, plus the root."""

    def __init__(self, channels):
        super().__init__(aggr="mean")
        self.lin = torch.nn.Linear(channels, channels)
        self.scale = 0.5

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight) + x

    def message(self, x_i, x_j, edge_weight):
        return torch.sigmoid(x_i * self.scale) * x_j * edge_weight.view(-1, 1)


def test_user_layer_runs_our_capture(graph):
    layer = Weighted(F_IN)
    assert "propagate" in vars(Weighted)  # PyG put its generated propagate() on the class itself
    converted, report = convert_and_compare(layer, *graph)
    assert converted is layer and type(layer).propagate is ug.MessagePassing.propagate
    calls = []
    with ops.observe(calls.append):
        layer(*graph)
    assert len(calls) == 1 and layer.fallback_reason is None and layer.trace_count >= 1
    assert report[""].runs_as == "fused" and report.observe(*graph)[""].ops == 1
    # PyG's explain setter binds a propagate() to the instance, the class's own: ours.
    layer.explain = True
    layer.explain = False
    assert vars(layer)["propagate"].__func__ is ug.MessagePassing.propagate
    calls.clear()
    with ops.observe(calls.append):
        layer(*graph)
    assert len(calls) == 1


def test_layer_already_bound_to_pyg_propagate_is_routed(graph):
    layer = Weighted(F_IN)
    layer.explain = True
    layer.explain = False  # leaves PyG's generated propagate() bound on the instance
    assert "propagate" in vars(layer)
    convert_and_compare(layer, *graph)
    assert "propagate" not in vars(layer)
    assert layer.capture is not None


class OwnPropagate(Weighted):
    def propagate(self, edge_index, size=None, **kwargs):
        return super().propagate(edge_index, size=size, **kwargs) * 2


def test_layer_with_its_own_propagate_is_kept(graph):
    _, report = convert_and_compare(OwnPropagate(F_IN), *graph)
    assert report[""].conversion == "kept" and report[""].runs_as == "PyG"
    assert "OwnPropagate defines its own propagate()" in report[""].why


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: GraphConv(F_IN, 4, aggr="mul"), "not 'mul'"),
        (lambda: SAGEConv(F_IN, 4, aggr=["mean", "max"]), "sum, mean, max or min aggregation"),
        (lambda: GCNConv(F_IN, 4, node_dim=0), "does not take node_dim=0"),
    ],
    ids=["mul", "multi", "node_dim"],
)
def test_unsupported_configuration_is_routed(graph, make, reason):
    x, edge_index, _ = graph
    _, report = convert_and_compare(make(), x, edge_index)
    assert report[""].conversion == "routed" and reason in report[""].reason


def test_hooked_layer_is_routed_and_keeps_its_hook(graph):
    x, edge_index, _ = graph
    seen = []
    layer = GCNConv(F_IN, 4)
    layer.register_forward_hook(lambda module, inputs, output: seen.append(module))
    converted, report = convert_and_compare(layer, x, edge_index)
    assert converted is layer and "hooks on the layer (forward_hooks)" in report[""].reason
    assert len(seen) == 2 and seen[0] is layer  # the converted layer ran it, then the reference's copy
    assert report.observe(x, edge_index)[""].runs_as == "fused"


def test_parameters_kept_as_they_are(graph):
    model = torch.nn.ModuleDict({"a": GINConv(torch.nn.Linear(F_IN, F_IN), train_eps=True), "b": GCNConv(F_IN, 3)})
    model["b"].lin.weight.requires_grad_(False)
    model["a"].nn.eval()
    shared = GraphConv(F_IN, F_IN)
    model["c"], model["d"] = shared, shared
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ug.accelerate(model)
    assert model["c"] is model["d"] and isinstance(model["c"], drop_ins.GraphConv)
    assert not model["b"].lin.weight.requires_grad and not model["a"].nn.training and model["a"].training
    assert {id(p) for p in model.parameters()} == {id(p) for p in optimizer.param_groups[0]["params"]}
    assert [layer.name for layer in model.ugrapher_report] == ["a", "b", "c"]


def test_copies_and_pickles_of_routed_layers(graph):
    x, edge_index, edge_weight = graph
    model = ug.accelerate(torch.nn.ModuleList([LEConv(F_IN, 4)]).double())
    expected = model[0](x, edge_index, edge_weight)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone[0]) is routed_class(LEConv) and clone.ugrapher_report.layers[0].layer is clone[0]
        assert_close(clone[0](x, edge_index, edge_weight), expected)
        assert clone[0].capture is not None and clone[0]._ug is not model[0]._ug


def test_converting_twice(graph):
    model = ug.accelerate(Mixed())
    classes = [type(m) for m in model.modules()]
    again = ug.accelerate(model)
    assert again is model and [type(m) for m in model.modules()] == classes
    assert {layer.conversion for layer in again.ugrapher_report} == {"none"}
    assert again.ugrapher_report["gatv2"].pyg_class == "GATv2Conv"


def test_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        ug.accelerate(GCNConv)
    with pytest.raises(TypeError, match="inplace"):
        ug.accelerate(GCNConv(2, 2), inplace="yes")


@pytest.mark.parametrize("weighted", [False, True], ids=["EGConv", "LGConv_weighted"])
def test_routed_forward_keeps_its_self_loops_on_the_graph(graph, weighted):
    """A routed layer whose forward() normalises its graph on every call through PyG's gcn_norm
    (EGConv adding self loops, LGConv with fixed edge weights) passes the same normalised graph to
    propagate() on every call, so its structures are built once; its outputs and gradients stay
    PyG's, also after the graph or the weights change in place."""
    x, edge_index, edge_weight = graph
    seen = []
    torch.manual_seed(0)
    model = (LGConv() if weighted else EGConv(F_IN, 8)).double()
    reference = copy.deepcopy(model)
    routed = ug.accelerate(model)
    # what gcn_norm made: EGConv's looped index, LGConv's normalised weights (its index is the input)
    made = (lambda inputs: inputs[2]["edge_weight"]) if weighted else (lambda inputs: inputs[0])
    routed.register_propagate_forward_pre_hook(lambda module, inputs: seen.append(made(inputs)))
    extra = (edge_weight,) if weighted else ()
    for _ in range(2):
        ours, theirs = (outputs_and_grads(m, x, edge_index, *extra) for m in (routed, reference))
        assert_same(ours, theirs, type(model).__name__)
    assert seen[0] is seen[1] and seen[0] is not (edge_weight if weighted else edge_index)
    (edge_weight if weighted else edge_index[1])[0] += 1
    ours, theirs = (outputs_and_grads(m, x, edge_index, *extra) for m in (routed, reference))
    assert_same(ours, theirs, "changed")
    assert seen[2] is not seen[1]


#: PyG layers whose capture needs a computed parameter (GMMConv), a softmax in another method of the
#: module (SuperGATConv) and the module's own aggregate() (EGConv), built with float32 weights.
CAPTURED_ON_THE_GPU = {
    "GMMConv": (lambda: GMMConv(16, 8, dim=3, kernel_size=4), True),
    "SuperGATConv": (lambda: SuperGATConv(16, 4, heads=2).eval(), False),
    "EGConv": (lambda: EGConv(16, 16), False),
}


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CAPTURED_ON_THE_GPU))
def test_routed_layers_fuse_on_the_gpu(monkeypatch, name):
    """The Triton kernels of these captures, against PyG's layer in float32 on the GPU, on a graph
    with a hub, self loops, duplicate edges and isolated vertices."""
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", 0)
    build, takes_pseudo = CAPTURED_ON_THE_GPU[name]
    generator = torch.Generator().manual_seed(1)
    hub = torch.stack([torch.randint(0, 3000, (20000,), generator=generator), torch.zeros(20000, dtype=torch.long)])
    rest = torch.randint(0, 2990, (2, 30000), generator=generator)
    loops = torch.arange(50).repeat(2, 1)
    edge_index = torch.cat([hub, rest, loops, rest[:, :100]], dim=1).cuda()
    x = torch.randn(3000, 16, generator=generator).cuda()
    extra = (torch.rand(edge_index.size(1), 3, generator=generator).cuda(),) if takes_pseudo else ()
    torch.manual_seed(0)
    model = build().cuda()
    reference = copy.deepcopy(model)
    routed = ug.accelerate(model)
    ours = outputs_and_grads(routed, x, edge_index, *extra)
    assert routed.fallback_reason is None and routed.staged_reason is None and routed.capture is not None
    assert_same(ours, outputs_and_grads(reference, x, edge_index, *extra), name)
