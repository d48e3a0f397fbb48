"""``torch.compile`` over the drop-in layers and over a captured ``ug.MessagePassing`` subclass.

``fullgraph=True`` raises on any graph break, so every test here also asserts there is none. The
``aot_eager`` backend traces forward and backward exactly as Inductor would (Dynamo, fake tensors,
AOTAutograd) without generating code, which keeps the tests cheap on the CPU. Compiled outputs and
gradients must equal eager ones, and a new graph every call (``dynamic=True``, a mini-batch
loader) must not recompile.
"""

import copy
import pickle
import weakref
from typing import Callable, Dict, List, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch_geometric import nn as pyg_nn
from torch_geometric.utils import scatter, softmax

import pyg_ugrapher as ug
from autotune import selection
from pyg_ugrapher import graph_argument, message_passing
from pyg_ugrapher import nn as ug_nn

RTOL = 1e-5


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles from scratch (Dynamo's caches are global)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_graph(num_nodes: int, num_edges: int, seed: int) -> torch.Tensor:
    """A random edge index with a hub (vertex 0), self loops, duplicate edges and an isolated vertex."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    dst = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    dst[: num_edges // 3] = 0
    src[-3:] = dst[-3:]
    edge_index = torch.stack([src, dst])
    return torch.cat([edge_index, edge_index[:, :2]], dim=1)


def outputs_and_grads(model: torch.nn.Module, forward: Callable, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The output and the gradients of a fixed projection of it (floating inputs and parameters)."""
    leaves = [t.detach().clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
    out = forward(model, *leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    wrt = [t for t in leaves if t.requires_grad] + list(model.parameters())
    grads = torch.autograd.grad((out * probe).sum(), wrt, allow_unused=True, materialize_grads=True)
    return [out.detach()] + [g.detach() for g in grads]


def assert_close(ours: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert ours.shape == expected.shape, f"{what}: shape {list(ours.shape)} vs {list(expected.shape)}"
    scale = expected.abs().max().item() if expected.numel() else 0.0
    error = (ours.double() - expected.double()).abs().max().item() if ours.numel() else 0.0
    assert error <= RTOL * max(scale, 1e-6), f"{what}: max error {error:.3e} (scale {scale:.3e})"


def check_compiled(model: torch.nn.Module, forward: Callable, inputs: Sequence[torch.Tensor], **options) -> Callable:
    """Compile ``forward`` over ``model`` with ``fullgraph=True`` and compare it with eager (the
    compiled call first, so that it is the one that meets the model first)."""
    compiled = torch.compile(forward, fullgraph=True, backend=options.pop("backend", "aot_eager"), **options)
    got = outputs_and_grads(model, compiled, inputs)
    expected = outputs_and_grads(model, forward, inputs)
    for index, (a, b) in enumerate(zip(got, expected)):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")
    return compiled


# -- the drop-in layers ------------------------------------------------------------------------------
def deployed(layer: ug.MessagePassing) -> ug.MessagePassing:
    """``layer`` with the default :attr:`~pyg_ugrapher.MessagePassing.staged_min_edges` (the tests
    set it to 0): compiled on these small graphs, its ``edge_update()`` is PyG's code in the
    compiled graph, not a staged run outside it."""
    layer.staged_min_edges = message_passing.STAGED_MIN_EDGES
    return layer


#: id -> (layer factory, forward(layer, x, edge_index, edge_weight, edge_attr)).
LAYERS: Dict[str, Tuple[Callable[[], torch.nn.Module], Callable]] = {
    "gcn": (lambda: ug_nn.GCNConv(6, 4), lambda m, x, ei, w, e: m(x, ei)),
    "gcn_weighted": (lambda: ug_nn.GCNConv(6, 4, improved=True), lambda m, x, ei, w, e: m(x, ei, w)),
    "gcn_no_loops": (lambda: ug_nn.GCNConv(6, 4, add_self_loops=False), lambda m, x, ei, w, e: m(x, ei, w)),
    "gcn_max": (lambda: ug_nn.GCNConv(6, 4, aggr="max"), lambda m, x, ei, w, e: m(x, ei, w)),
    "gcn_mean_flipped": (
        lambda: ug_nn.GCNConv(6, 4, aggr="mean", flow="target_to_source"),
        lambda m, x, ei, w, e: m(x, ei),
    ),
    "gat": (lambda: ug_nn.GATConv(6, 4, heads=2), lambda m, x, ei, w, e: m(x, ei)),
    "gat_edge_dim": (
        lambda: ug_nn.GATConv(6, 4, heads=2, edge_dim=3, concat=False),
        lambda m, x, ei, w, e: m(x, ei, e),
    ),
    "gat_no_loops": (
        lambda: ug_nn.GATConv(6, 4, heads=2, add_self_loops=False, flow="target_to_source"),
        lambda m, x, ei, w, e: m(x, ei),
    ),
    "gatv2": (lambda: deployed(ug_nn.GATv2Conv(6, 4, heads=2)), lambda m, x, ei, w, e: m(x, ei)),
    "gatv2_edge_dim_flipped": (
        lambda: deployed(ug_nn.GATv2Conv(6, 4, heads=2, edge_dim=3, fill_value="mean", flow="target_to_source")),
        lambda m, x, ei, w, e: m(x, ei, e),
    ),
    "sage": (lambda: ug_nn.SAGEConv(6, 4), lambda m, x, ei, w, e: m(x, ei)),
    "sage_max_bipartite": (
        lambda: ug_nn.SAGEConv(6, 4, aggr="max"),
        lambda m, x, ei, w, e: m((x, x[:10]), torch.stack([ei[0], ei[1] % 10])),
    ),
    # GIN's network is linear: on the hub graphs of the GPU tests a nonlinearity turns the float32
    # rounding of the hub's sum (added in another order when traced) into gradient differences far
    # above it: a ReLU's mask flips at a pre-activation within rounding of zero, a saturated Tanh's
    # slope moves by twice the pre-activation's error.
    "gin": (
        lambda: ug_nn.GINConv(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4)), train_eps=True),
        lambda m, x, ei, w, e: m(x, ei),
    ),
    "gine": (lambda: ug_nn.GINEConv(torch.nn.Linear(6, 4), edge_dim=3), lambda m, x, ei, w, e: m(x, ei, e)),
    "graph_conv_max": (lambda: ug_nn.GraphConv(6, 4, aggr="max"), lambda m, x, ei, w, e: m(x, ei, w)),
}


def layer_inputs(num_nodes: int = 12, num_edges: int = 40, seed: int = 0) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    edge_index = make_graph(num_nodes, num_edges, seed)
    num_edges = edge_index.size(1)
    return [
        torch.randn(num_nodes, 6, generator=generator),
        edge_index,
        torch.rand(num_edges, generator=generator),
        torch.randn(num_edges, 3, generator=generator),
    ]


@pytest.mark.parametrize("name", LAYERS)
def test_layer_compiles_without_graph_breaks(name, compiled_route):
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    check_compiled(factory(), forward, layer_inputs())


@pytest.mark.parametrize("name", LAYERS)
def test_graphs_without_fullgraph(name, compiled_route):
    """Without ``fullgraph=True`` (what users write) every layer compiles into one graph: the graphs
    with self loops added have sizes that depend on shapes alone (GCN's sums keep stored loops at
    weight 0, GAT points them to a spare row), weighted or not. Results equal eager ones."""
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    model = factory()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(forward, backend=counter)
    inputs = layer_inputs()
    for index, (a, b) in enumerate(
        zip(outputs_and_grads(model, compiled, inputs), outputs_and_grads(model, forward, inputs))
    ):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", [name for name in LAYERS if not name.startswith("gatv2")])
def test_small_graphs_compile_to_torch_operations(name):
    """On a graph of at most ``TRACED_GRAPH_EDGES`` edges a compiled layer calls none of the custom
    ops (no structure, no graph operator): its gathers and scatters are torch operations, which
    Inductor fuses as it fuses PyG's. Outputs and gradients are eager's. (GATv2's propagation runs
    through ``ug.MessagePassing``, whose compiled calls run the custom ops on every graph.)"""
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    calls: List[set] = []
    check_compiled(factory(), forward, layer_inputs(), backend=graph_targets(calls))
    ours = {str(target) for target in set().union(*calls) if str(target).startswith("pyg_ugrapher.")}
    assert calls and ours == set(), ours


@pytest.mark.parametrize("name", ["gcn", "gcn_max", "gat", "gat_edge_dim", "sage", "graph_conv_max"])
def test_small_graphs_traced_on_an_empty_graph(name):
    """A graph without edges, traced as torch operations: every node is isolated (zero rows, the
    self loops alone where the layer adds them), as eager."""
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    x, _, _, _ = layer_inputs()
    empty = torch.empty(2, 0, dtype=torch.long)
    calls: List[set] = []
    check_compiled(factory(), forward, [x, empty, torch.rand(0), torch.randn(0, 3)], backend=graph_targets(calls))
    assert not {str(t) for t in set().union(*calls) if str(t).startswith("pyg_ugrapher.")}


def ops_per_graph_across_sizes() -> List[set]:
    """A SAGE layer compiled with ``dynamic=True`` on graphs of 42, 54, 72 and 92 edges in turn,
    its results checked against eager's: the names of our ops in each graph Dynamo made."""
    torch.manual_seed(0)
    model = ug_nn.SAGEConv(6, 4)
    calls: List[set] = []

    def forward(m, x, ei):
        return m(x, ei)

    compiled = torch.compile(forward, backend=graph_targets(calls), dynamic=True)
    # make_graph adds two duplicate edges: 42 and 54 edges, then 72 and 92.
    for step, (num_nodes, num_edges) in enumerate([(12, 40), (15, 52), (20, 70), (25, 90)]):
        inputs = layer_inputs(num_nodes, num_edges, seed=step)[:2]
        expected = outputs_and_grads(model, forward, inputs)
        for index, (a, b) in enumerate(zip(outputs_and_grads(model, compiled, inputs), expected)):
            assert_close(a, b, f"graph {step}, tensor {index}")
    return [{str(t).split(".")[1] for t in graph if str(t).startswith("pyg_ugrapher.")} for graph in calls]


def test_dynamic_shapes_trace_up_to_the_traced_graph_bound(monkeypatch):
    """dynamic=True: the edge count is guarded at ``TRACED_GRAPH_EDGES``: graphs up to it share one
    traced graph, a larger one recompiles once, into the custom ops, which serve every larger
    graph. The results are eager's throughout."""
    monkeypatch.setattr(graph_argument, "TRACED_GRAPH_EDGES", 60)
    ours = ops_per_graph_across_sizes()
    assert len(ours) == 2, ours
    assert ours[0] == set() and {"graph_op", "recordable_graph_op"} & ours[1], ours


def test_small_compiled_graph_with_an_index_out_of_range_fails():
    """A compiled small graph's index is not checked against the node counts (a check would wait
    for the device), but an index out of range fails in the gather: no read outside the features."""
    torch.manual_seed(0)
    model = ug_nn.SAGEConv(6, 4)
    x, edge_index, _, _ = layer_inputs()
    edge_index = edge_index.clone()
    edge_index[0, 3] = x.size(0)
    compiled = torch.compile(model, backend="aot_eager")
    with pytest.raises((IndexError, RuntimeError)):
        compiled(x, edge_index)


def test_two_layer_model_in_training_mode(compiled_route):
    """A model as users write one, GAT attention dropout off, ReLU and dropout between layers."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = ug_nn.GATConv(6, 4, heads=2)
            self.conv2 = ug_nn.GCNConv(8, 3)

        def forward(self, x, edge_index):
            return self.conv2(F.dropout(F.relu(self.conv1(x, edge_index)), p=0.0, training=self.training), edge_index)

    torch.manual_seed(0)
    model = Net().train()
    x, edge_index, _, _ = layer_inputs()
    check_compiled(model, lambda m, x, ei: m(x, ei), [x, edge_index])


def test_the_graph_is_prepared_once_per_graph(monkeypatch, custom_op_graphs):
    """The structure's custom op finds its graph in the cache on the edge_index object: compiled
    calls on the same graph build it once, a new graph builds its own."""
    built = []
    original = graph_argument.graph_of
    monkeypatch.setattr(
        graph_argument, "graph_of", lambda *args, **kwargs: built.append(args[0].size(1)) or original(*args, **kwargs)
    )
    torch.manual_seed(0)
    model = ug_nn.SAGEConv(6, 4)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, edge_index, _, _ = layer_inputs()
    for _ in range(3):
        compiled(x, edge_index)
    assert built == [edge_index.size(1)]
    other = make_graph(12, 30, seed=5)
    compiled(x, other)
    assert built == [edge_index.size(1), other.size(1)]


def test_a_routed_layer_that_adds_self_loops_prepares_its_graph_once(monkeypatch):
    """A routed EGConv adds the self loops that remain in its forward() (a graph break for PyG's
    helper too): compiled, the helper's kept form runs there, so every call passes the same looped
    graph, whose structure is built once; the outputs and gradients are the eager ones."""
    built = []
    original = graph_argument.graph_of
    monkeypatch.setattr(
        graph_argument, "graph_of", lambda *args, **kwargs: built.append(args[0].size(1)) or original(*args, **kwargs)
    )
    torch.manual_seed(0)
    model = ug.accelerate(pyg_nn.EGConv(6, 8))
    x, edge_index, _, _ = layer_inputs()
    forward = lambda m, x, ei: m(x, ei)  # noqa: E731
    compiled = torch.compile(forward, backend="aot_eager")
    for _ in range(2):
        got = outputs_and_grads(model, compiled, [x, edge_index])
    for index, (a, b) in enumerate(zip(got, outputs_and_grads(model, forward, [x, edge_index]))):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")
    assert len(built) == 1 and model.fallback_reason is None


@pytest.mark.parametrize("name", ["gcn", "gat", "gat_no_loops", "gatv2", "sage", "gin", "graph_conv_max"])
def test_compiled_training_steps_reuse_the_graphs_decisions(name, interpret, monkeypatch, custom_op_graphs):
    """After the first compiled training step, the next ones find every operator's graph (forward
    and reversed, in the backward pass too) in the caches: no structure built or sorted, no degree
    statistics, no new decisions. Caches are keyed by the structure arrays' identity, which a view
    saved for the backward pass would not keep (it comes back as a new tensor object every step).
    That holds where small graphs keep the user's order in eager calls (here every graph): a
    compiled layer's graph is built sorted, once (a recordable softmax twin, which keeps nothing,
    would sort a user-order structure's rows at every call)."""
    from pyg_ugrapher import graph as graph_module
    from pyg_ugrapher import structure
    from pyg_ugrapher.ops import decisions
    from triton_kernels import csr_pair

    stats, decided, built = [], [], []
    degree_stats, schedule_for = structure.degree_stats, decisions.schedule_for
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: True)
    monkeypatch.setattr(structure, "degree_stats", lambda *args: stats.append(1) or degree_stats(*args))
    monkeypatch.setattr(decisions, "schedule_for", lambda *args: decided.append(args[0]) or schedule_for(*args))
    for module in (graph_module, csr_pair):
        build = module.build_csr_pair
        monkeypatch.setattr(module, "build_csr_pair", lambda *args, build=build: built.append(1) or build(*args))
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    model = factory()
    # The module compiled as users do it, without fullgraph.
    compiled = torch.compile(model, backend="aot_eager")
    inputs = layer_inputs()

    def training_step() -> None:
        # Features as a data loader gives them (no gradient): only the parameters are trained.
        torch.autograd.grad(forward(compiled, *inputs).square().sum(), list(model.parameters()))

    training_step()
    assert stats and decided and built
    for log in (stats, decided, built):
        log.clear()
    for _ in range(2):
        training_step()
    assert stats == [] and decided == [] and built == []


@pytest.mark.parametrize("name", ["gcn", "gat_edge_dim", "sage", "gine"])
def test_dynamic_shapes_do_not_recompile_per_graph(name, compiled_route):
    """dynamic=True: one graph for every graph size (node and edge counts are symbolic, and so are
    the sizes of the graphs with self loops added)."""
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    model = factory()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(forward, fullgraph=True, backend=counter, dynamic=True)
    compiled_at_first = None
    for step, (num_nodes, num_edges) in enumerate([(12, 40), (15, 52), (9, 25), (20, 70), (11, 33)]):
        inputs = layer_inputs(num_nodes, num_edges, seed=step)
        expected = outputs_and_grads(model, forward, inputs)
        got = outputs_and_grads(model, compiled, inputs)
        for index, (a, b) in enumerate(zip(got, expected)):
            assert_close(a, b, f"graph {step}, tensor {index}")
        compiled_at_first = compiled_at_first or counter.frame_count
    # GAT's trace-time constant (its slope) adds an empty graph on the first call; then nothing.
    assert compiled_at_first <= 2 and counter.frame_count == compiled_at_first


def test_default_compile_recompiles_a_bounded_number_of_times(compiled_route):
    """Without dynamic=True, Dynamo's automatic dynamic shapes take over after one recompile."""
    torch.manual_seed(0)
    model = ug_nn.GCNConv(6, 4)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    for step, num_nodes in enumerate(range(10, 18)):
        x, edge_index, _, _ = layer_inputs(num_nodes, 3 * num_nodes, seed=step)
        assert_close(compiled(x, edge_index), model(x, edge_index), f"graph {step}")
    assert counter.frame_count <= 2


# -- a user's MessagePassing -----------------------------------------------------------------------
class WeightedSum(ug.MessagePassing):
    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_j, edge_weight):
        return x_j * edge_weight.view(-1, 1)


class Attention(ug.MessagePassing):
    """Heads, broadcasting, an activation and a dot product, aggregated by max."""

    def __init__(self):
        super().__init__(aggr="max", node_dim=0)
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, 2, 3)
        return self.propagate(edge_index, x=h).flatten(1)

    def message(self, x_i, x_j):
        return F.leaky_relu(x_i + x_j, 0.2) * torch.sigmoid(x_j)


class Sliced(ug.MessagePassing):
    """Slices of the features on both ends and of an intermediate result."""

    def __init__(self, aggr: str = "add"):
        super().__init__(aggr=aggr)

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_i, x_j, edge_weight):
        return F.relu(x_j[:, :3] - x_i[:, 3:]) * edge_weight.view(-1, 1) + x_j[..., ::2]


class EdgeLinear(ug.MessagePassing):
    """EdgeConv's message with a Linear of a concatenation, split into products of the node rows."""

    def __init__(self, aggr: str = "max"):
        super().__init__(aggr=aggr)
        self.lin = torch.nn.Linear(12, 5)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return torch.tanh(self.lin(torch.cat([x_i, x_j - x_i], dim=-1)))


class SoftmaxAttention(ug.MessagePassing):
    """GAT's pattern in message(): per-vertex scores with parameters, PyG's softmax, stored weights."""

    def __init__(self, aggr: str = "add"):
        super().__init__(aggr=aggr)
        self.att_src = torch.nn.Parameter(torch.randn(6))
        self.att_dst = torch.nn.Parameter(torch.randn(6))
        self._alpha = None

    def forward(self, x, edge_index):
        out = self.propagate(edge_index, x=x)
        assert self._alpha is not None and self._alpha.shape == (edge_index.size(1),)
        return out

    def message(self, x_i, x_j, index, size_i):
        alpha = F.leaky_relu((x_j * self.att_src).sum(-1) + (x_i * self.att_dst).sum(-1), 0.2)
        self._alpha = softmax(alpha, index, num_nodes=size_i)
        return x_j * self._alpha.unsqueeze(-1)


class OwnAggregate(ug.MessagePassing):
    """A module with its own aggregate(): one PyG scatter of weighted messages over the receivers."""

    def __init__(self, aggr: str = "mean"):
        super().__init__()
        self.reduce = aggr

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_j):
        return torch.tanh(x_j)

    def aggregate(self, inputs, index, dim_size=None, edge_weight=None):
        return scatter(inputs * edge_weight.view(-1, 1), index, 0, dim_size, reduce=self.reduce)


class Bandwidth(ug.MessagePassing):
    """GMMConv's pattern: a divisor computed from a parameter in message()."""

    def __init__(self, aggr: str = "add"):
        super().__init__(aggr=aggr)
        self.sigma = torch.nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return torch.exp(-((x_j - x_i) ** 2) / (1e-6 + self.sigma.view(1, -1).pow(2)))


def graph_targets(calls: List[set]) -> Callable:
    """An ``aot_eager`` backend that records the call targets of every Dynamo graph."""

    def backend(gm, example_inputs):
        calls.append({node.target for node in gm.graph.nodes if node.op == "call_function"})
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    return backend


@pytest.mark.parametrize(
    "cls, aggr",
    [(WeightedSum, "mean"), (Attention, None), (EdgeLinear, "max"), (SoftmaxAttention, "add")],
    ids=["weighted_mean", "heads", "linear_products", "softmax"],
)
def test_captured_message_passing_on_graphs_of_several_sizes(cls, aggr):
    """Compiled as users compile a model (no ``dynamic=True``): the second graph size makes the
    sizes symbolic (Dynamo's automatic dynamic shapes), and the capture, traced on a fixed edge
    count and node count (softmax's ``size_i``), still enters the graph as constants: no graph
    break, no recompile after that one, eager's results on every graph."""
    torch.manual_seed(0)
    model = cls(aggr=aggr) if aggr else cls()
    model.staged_min_edges = 0  # the softmax's several operators captured on these small graphs too
    forward = (lambda m, x, ei, w: m(x, ei, w)) if cls is WeightedSum else (lambda m, x, ei, w: m(x, ei))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(forward, fullgraph=True, backend=counter)
    for step, (num_nodes, num_edges) in enumerate([(12, 40), (15, 52), (9, 25), (20, 70)]):
        inputs = layer_inputs(num_nodes, num_edges, seed=step)[:3]
        expected = outputs_and_grads(model, forward, inputs)
        for index, (a, b) in enumerate(zip(outputs_and_grads(model, compiled, inputs), expected)):
            assert_close(a, b, f"graph {step}, tensor {index}")
    assert counter.frame_count == 2 and model.fallback_reason is None


def test_captured_message_passing_compiled_first_compiles_once():
    """A module compiled before any eager call: its first call reads the arguments' defaults as a
    constant of the graph, so the second call finds the same graph (no recompile)."""
    torch.manual_seed(0)
    model = WeightedSum(aggr="mean")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda m, x, ei, w: m(x, ei, w), fullgraph=True, backend=counter)
    inputs = layer_inputs()[:3]
    first, second = (outputs_and_grads(model, compiled, inputs) for _ in range(2))
    for index, (a, b) in enumerate(zip(first, second)):
        assert_close(a, b, f"tensor {index}")
    assert counter.frame_count == 1


def test_a_message_reading_the_edge_count_runs_pyg_propagation_when_compiled():
    """A capture that depends on the edge count holds for that count alone, which a compiled graph
    may not know: PyG's propagation runs there, with eager's results."""

    class ViewsRows(ug.MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j.view(x_j.size(0), -1) * 2

    model = ViewsRows(aggr="max")
    inputs = layer_inputs()[:2]
    forward = lambda m, x, ei: m(x, ei)  # noqa: E731
    got = outputs_and_grads(model, torch.compile(forward, fullgraph=True, backend="aot_eager"), inputs)
    assert "reads the number of edges" in model.fallback_reason
    for index, (a, b) in enumerate(zip(got, outputs_and_grads(model, forward, inputs))):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")


@pytest.mark.parametrize(
    "cls, aggr",
    [
        (WeightedSum, "mean"),
        (Attention, None),
        (Sliced, "max"),
        (EdgeLinear, "max"),
        (SoftmaxAttention, "add"),
        (OwnAggregate, "max"),
        (Bandwidth, "add"),
    ],
    ids=["weighted_mean", "heads", "sliced", "linear_products", "softmax", "own_aggregate", "computed_parameter"],
)
def test_captured_message_passing_compiles_to_the_fused_op(cls, aggr):
    torch.manual_seed(0)
    model = cls(aggr=aggr) if aggr else cls()
    x, edge_index, weight, _ = layer_inputs()
    if cls in (WeightedSum, Sliced, OwnAggregate):
        forward, inputs = (lambda m, x, ei, w: m(x, ei, w)), [x, edge_index, weight]
    else:
        forward, inputs = (lambda m, x, ei: m(x, ei)), [x, edge_index]
    outputs_and_grads(model, forward, inputs)  # eager, with the same argument signature
    assert model.fallback_reason is None, model.fallback_reason
    traces = model.trace_count
    calls: List[set] = []
    check_compiled(model, forward, inputs, backend=graph_targets(calls))
    assert len(calls) == 1
    targets = calls[0]
    assert torch.ops.pyg_ugrapher.recordable_graph_op.default in targets  # a small graph of fixed size
    # The messages are never materialised: no gather of node rows per edge, no scatter.
    gathers = {torch.index_select, torch.Tensor.index_select, torch.ops.aten.index_select.default}
    assert not targets & gathers and not any("scatter" in str(t) for t in targets), targets
    assert model.trace_count == traces  # the eager call's capture served the compiled trace


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_captured_message_passing_with_a_sparse_adjacency(layout):
    """A ``torch.sparse`` adjacency cannot enter a compiled graph: its propagation runs as in eager
    mode (Dynamo used to crash on it; the eager result is PyG's, see test_message_passing), the
    gradients too."""
    torch.manual_seed(0)
    x, edge_index, _, _ = layer_inputs()
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.size(1)), (x.size(0), x.size(0)))
    adj_t = adj_t.coalesce() if layout == torch.sparse_coo else adj_t.to_sparse_csr()
    model = Attention()
    expected = outputs_and_grads(model, lambda m, x: m(x, adj_t), [x])
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    for index, (a, b) in enumerate(zip(outputs_and_grads(compiled, lambda m, x: m(x, adj_t), [x]), expected)):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")
    assert counter.frame_count <= 1  # at most the projection before propagate


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_compiled_gat_runs_the_fused_softmax(dropout, custom_op_graphs):
    """Under ``torch.compile``, on a graph that runs the custom ops, GATConv's softmax and
    aggregation are the one fused custom op (as in eager mode), not the separate operators of
    ``return_attention_weights``; the dropout scale is drawn in the graph and fed to it."""
    torch.manual_seed(0)
    model = ug_nn.GATConv(6, 4, heads=2, dropout=dropout).train()
    x, edge_index, _, _ = layer_inputs()
    calls: List[set] = []
    compiled = torch.compile(lambda m, x, ei: m(x, ei), fullgraph=True, backend=graph_targets(calls))
    outputs_and_grads(model, compiled, [x, edge_index])
    targets = set().union(*calls)
    assert torch.ops.pyg_ugrapher.recordable_softmax_aggregate.default in targets, targets


def test_message_passing_traced_first_under_compile():
    """The first call ever is compiled: message() is traced while Dynamo traces propagate()."""
    torch.manual_seed(0)
    model = WeightedSum(aggr="sum")
    x, edge_index, weight, _ = layer_inputs()
    check_compiled(model, lambda m, x, ei, w: m(x, ei, w), [x, edge_index, weight])
    assert model.trace_count == 1 and model.fallback_reason is None


@pytest.mark.parametrize("cls", [pyg_nn.ResGatedGraphConv, pyg_nn.LEConv], ids=lambda cls: cls.__name__)
def test_routed_layer_under_target_to_source_compiles_whole(cls, monkeypatch):
    """A routed layer with ``flow="target_to_source"`` whose first call is compiled: which end of
    the pair ``(x_src, x_dst)`` PyG reads as ``x_j`` there depends on whether it generates the
    class's ``propagate()``, which its inspector decides by reading the class's source. That
    decision is a constant of the compiled graph (``fullgraph=True``: traced, each step of reading
    the source broke the graph); outputs and gradients equal PyG's layer."""
    monkeypatch.setattr(message_passing, "_GENERATED", weakref.WeakKeyDictionary())  # not decided yet
    torch.manual_seed(0)
    theirs = cls(6, 4, flow="target_to_source")
    ours = ug.accelerate(torch.nn.ModuleList([copy.deepcopy(theirs)]))[0]
    assert isinstance(ours, ug.MessagePassing)
    forward = lambda m, x, ei: m(x, ei)  # noqa: E731
    x, edge_index, _, _ = layer_inputs()
    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    got = outputs_and_grads(ours, compiled, [x, edge_index])
    expected = outputs_and_grads(theirs, forward, [x, edge_index])
    for index, (a, b) in enumerate(zip(got, expected)):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")


@pytest.mark.parametrize(
    "make_copy", [copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["copy", "deepcopy", "pickle"]
)
def test_copied_message_passing_compiles_its_own_capture(make_copy):
    """A copy (or an unpickled module) captures through its own registration: the compiled trace
    reaches the module by a constant token, never the module it was copied from."""
    torch.manual_seed(0)
    original = WeightedSum(aggr="sum")
    x, edge_index, weight, _ = layer_inputs()
    forward = lambda m, x, ei, w: m(x, ei, w)  # noqa: E731
    outputs_and_grads(original, forward, [x, edge_index, weight])
    model = make_copy(original)
    assert model._ug is not original._ug and model._ug.token != original._ug.token
    check_compiled(model, forward, [x, edge_index, weight])
    assert model.trace_count == 1 and model.fallback_reason is None
    assert original.trace_count == 1
    torch._dynamo.reset()
    check_compiled(original, forward, [x, edge_index, weight])
    assert original.trace_count == 1  # its own capture, from its eager call


# -- CUDA graphs: where a step is host-bound (graphs of up to ~1e6 edges) -------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_sum", "copy_u_max"])
def test_operators_replay_in_a_cuda_graph(name):
    """Forward and backward captured once (after a warm-up call, which builds the graph's
    caches) and replayed on new inputs written into the captured tensors."""
    device = torch.device("cuda")
    edge_index = make_graph(300, 3000, seed=1).to(device)
    graph = ug.GraphTensor.from_edge_index(edge_index, 300)
    x = torch.randn(300, 32, device=device, requires_grad=True)
    weight = torch.rand(edge_index.size(1), 1, device=device, requires_grad=True)
    grad = torch.randn(300, 32, device=device)
    operands = [x, weight] if name.startswith("u_mul_e") else [x]

    def step():
        out = ug.compute(graph, name, *operands)
        return [out] + list(torch.autograd.grad(out, operands, grad))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        captured = step()
    for seed in range(3):
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for t in operands + [grad]:
                t.copy_(torch.randn(t.shape, generator=generator, device=device))
        cuda_graph.replay()
        for index, (a, b) in enumerate(zip(captured, step())):
            assert_close(a, b, f"replay {seed}: {'output' if index == 0 else f'gradient {index - 1}'}")


@pytest.mark.skipif(not hasattr(torch.Tag, "cudagraph_unsafe"), reason="this torch has no cudagraph_unsafe tag")
def test_only_the_recordable_twins_run_inside_cuda_graphs():
    """mode="reduce-overhead" records CUDA graphs with copies of their inputs, which the caches of
    the ops that build or find a graph's structure (keyed by tensor identity) cannot find: those are
    tagged to run outside them. The operators have a twin each that the graphs record
    (``recordable_<name>``, untagged), and the tagged original for graphs it does not admit."""
    names = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("pyg_ugrapher::")}
    assert len(names) >= 10, names
    recordable = {name for name in names if name.startswith("recordable_")}
    assert recordable == {
        "recordable_graph_op",
        "recordable_gather_with_edge_output",
        "recordable_softmax_aggregate",
        "recordable_softmax_aggregate_backward",
    }
    tags = {name: getattr(torch.ops.pyg_ugrapher, name).default.tags for name in names}
    assert [name for name in recordable if torch.Tag.cudagraph_unsafe in tags[name]] == []
    outside = names - recordable
    assert {name.removeprefix("recordable_") for name in recordable} <= outside
    assert [name for name in outside if torch.Tag.cudagraph_unsafe not in tags[name]] == []


@pytest.mark.parametrize("size", ["small", "large"])
def test_compiled_layers_call_the_recordable_twins_on_small_graphs(monkeypatch, size, custom_op_graphs):
    """A graph of a fixed number of edges up to ``SMALL_GRAPH_EDGES`` gets the recordable twins of
    the operators, forward and backward; a larger one the operators that run outside CUDA graphs;
    the results are the eager ones either way."""
    if size == "large":
        monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 8)
    torch._dynamo.reset()  # the choice is made while tracing: no graph traced for another size
    torch.manual_seed(0)
    modules = torch.nn.ModuleList([ug_nn.GATConv(6, 4, heads=2), ug_nn.SAGEConv(8, 4)])
    x, edge_index, _, _ = layer_inputs()
    calls: List[set] = []

    def forward(m, x, ei):
        return m[1](m[0](x, ei).relu(), ei)

    expected = outputs_and_grads(modules, forward, [x, edge_index])
    compiled = torch.compile(forward, backend=graph_targets(calls))
    for index, (a, b) in enumerate(zip(outputs_and_grads(modules, compiled, [x, edge_index]), expected)):
        assert_close(a, b, "output" if index == 0 else f"gradient {index - 1}")
    ours = {str(t).split(".")[1] for t in set().union(*calls) if str(t).startswith("pyg_ugrapher.")}
    inside = {"recordable_graph_op", "recordable_softmax_aggregate"}
    outside = {"graph_op", "softmax_aggregate"}
    assert ours & (inside | outside) == (inside if size == "small" else outside), ours


def test_dynamic_shapes_call_the_recordable_twins_below_the_small_graph_bound(monkeypatch, custom_op_graphs):
    """dynamic=True: Dynamo hands traced code a symbolic edge count as an int, so the forward pass
    calls the recordable twins and guards the count; a graph above ``SMALL_GRAPH_EDGES`` recompiles
    once, into the operators that run outside CUDA graphs. The results are eager's throughout."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 60)
    ours = ops_per_graph_across_sizes()
    assert len(ours) == 2, ours
    assert "recordable_graph_op" in ours[0] and "graph_op" not in ours[0], ours
    assert "graph_op" in ours[1] and "recordable_graph_op" not in ours[1], ours


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gcn", "gcn_mean_flipped", "gat", "gatv2", "sage", "gin", "graph_conv_max"])
def test_layers_train_under_reduce_overhead(name, compiled_route):
    """torch.compile(mode="reduce-overhead") (Inductor and CUDA graphs: the traced operators, or
    CUDA graphs around the structure builders and our operators recorded on these small graphs):
    training calls (warm-up, recording, replays) on three graphs of one size in turn give eager's
    outputs and gradients on each, so a replay reads the graph of its call."""
    device = torch.device("cuda")
    factory, forward = LAYERS[name]
    torch.manual_seed(0)
    model = factory().to(device)
    compiled = torch.compile(copy.deepcopy(model), mode="reduce-overhead")
    graphs = [[t.to(device) for t in layer_inputs(200, 2000, seed)] for seed in range(3)]
    assert len({tuple(inputs[1].shape) for inputs in graphs}) == 1
    for call in range(6):
        inputs = graphs[call % 3]
        results = []
        for module in (compiled, model):
            out = forward(module, *inputs)
            # A fixed projection of the output, not its square: the hub's large output would weigh
            # the gradients' rounding, which differs where the sums are added in another order.
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(call)).to(device)
            grads = torch.autograd.grad(
                (out * probe).sum(), list(module.parameters()), allow_unused=True, materialize_grads=True
            )
            results.append([t.detach().clone() for t in (out, *grads)])
        for index, (a, b) in enumerate(zip(*results)):
            assert_close(a, b, f"call {call}: {'output' if index == 0 else f'gradient {index - 1}'}")
