"""``ug.MessagePassing`` against PyG's own ``MessagePassing``: the same user class, run through both,
must give the same outputs and gradients, captured (fused op) or not (PyG's path)."""

import copy
import types
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import pytest
import torch
import torch.nn.functional as F
from torch_geometric import EdgeIndex
from torch_geometric.nn import MessagePassing as PyGMessagePassing
from torch_geometric.nn.aggr import MaxAggregation, MeanAggregation
from torch_geometric.utils import scatter, softmax

import pyg_ugrapher as ug
from pyg_ugrapher import graph_argument
from pyg_ugrapher.structure import recording_steps

from ..conftest import FakeSparseTensor

RTOL = 1e-5


# -- graphs, executors and the comparison ------------------------------------------------------------
def make_graph(num_nodes: int, num_edges: int, seed: int, num_dst: Optional[int] = None) -> torch.Tensor:
    """A random edge index with an isolated vertex (the last one on both sides), self loops and
    duplicate edges."""
    generator = torch.Generator().manual_seed(seed)
    num_dst = num_nodes if num_dst is None else num_dst
    src = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    dst = torch.randint(0, num_dst - 1, (num_edges,), generator=generator)
    if num_dst == num_nodes:
        src[-3:] = dst[-3:]
    edge_index = torch.stack([src, dst])
    return torch.cat([edge_index, edge_index[:, :3]], dim=1)


@pytest.fixture(autouse=True)
def reference_by_default(monkeypatch) -> None:
    """Tests that do not ask for ``executor`` run on the reference executor."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def sizes(executor: str) -> Tuple[int, int]:
    """(vertices, edges): small enough for the interpreter, larger on the reference executor."""
    return (6, 10) if executor == "interpreter" else (12, 40)


class _Forward:
    """The forward pass of every test class: ``propagate(edge_index, size, **kwargs)``."""

    def forward(self, edge_index, size=None, **kwargs):
        return self.propagate(edge_index, size=size, **kwargs)


def twins(
    message: Callable,
    aggr: Any = "sum",
    extra: Optional[Dict[str, Any]] = None,
    setup: Optional[Callable] = None,
    **init: Any,
) -> Tuple[ug.MessagePassing, PyGMessagePassing]:
    """The same user class built on ``ug.MessagePassing`` and on PyG's ``MessagePassing``, with equal
    state (``setup(module)`` adds submodules before PyG's weights are copied into ours)."""
    body = {
        name: _named(fn, name) if callable(fn) else fn for name, fn in {"message": message, **(extra or {})}.items()
    }
    modules = []
    for base in (ug.MessagePassing, PyGMessagePassing):
        cls = type(f"{message.__name__}_{base.__module__.split('.')[0]}", (_Forward, base), dict(body))
        module = cls(aggr=aggr, **init)
        if setup is not None:
            setup(module)
        modules.append(module)
    ours, theirs = modules
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _named(fn: Callable, name: str) -> Callable:
    """``fn`` under the method name PyG's inspector looks it up by."""
    return types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _leaves(value: Any) -> Any:
    """Fresh leaf copies of every floating tensor (also inside pairs), requiring gradients."""
    if isinstance(value, (tuple, list)):
        return type(value)(_leaves(v) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.layout == torch.strided:
        return value.detach().clone().requires_grad_()
    return value


def _flat(value: Any) -> List[torch.Tensor]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    return [value] if isinstance(value, torch.Tensor) and value.requires_grad else []


def _run(
    module: torch.nn.Module, edge_index: Any, kwargs: Dict[str, Any], make_graph_arg: Optional[Callable] = None
) -> List[torch.Tensor]:
    kwargs = {name: _leaves(value) for name, value in kwargs.items()}
    graph = edge_index if make_graph_arg is None else make_graph_arg(kwargs)
    out = module(graph, **kwargs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    wrt = _flat(kwargs) + list(module.parameters())
    grads = torch.autograd.grad((out * probe).sum(), wrt, allow_unused=True, materialize_grads=True)
    return [out.detach()] + [g.detach() for g in grads]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: shape {list(ours.shape)} vs PyG's {list(theirs.shape)}"
    assert ours.dtype == theirs.dtype, f"{what}: dtype {ours.dtype} vs PyG's {theirs.dtype}"
    scale = theirs.abs().max().item() if theirs.numel() else 0.0
    error = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0.0
    assert error <= RTOL * max(scale, 1e-6), f"{what}: max error {error:.3e} (scale {scale:.3e})"


def compare(
    ours: torch.nn.Module,
    theirs: torch.nn.Module,
    edge_index: Any,
    captured: Union[bool, str] = True,
    make_graph_arg: Optional[Callable] = None,
    **kwargs: Any,
) -> List[torch.Tensor]:
    """Outputs and gradients (every floating input and parameter) of ours and PyG's agree; ours ran a
    captured op (``captured=True``), ran ``message()`` staged (``"staged"``) or PyG's path with a reason."""
    mine = _run(ours, edge_index, kwargs, make_graph_arg)
    ref = _run(theirs, edge_index, kwargs, make_graph_arg)
    if captured == "staged":
        assert ours.fallback_reason is None, ours.fallback_reason
        assert ours.capture is None and ours.staged_reason
    elif captured:
        assert ours.fallback_reason is None, ours.fallback_reason
        assert ours.capture is not None and ours.staged_reason is None
    else:
        assert ours.capture is None
        assert isinstance(ours.fallback_reason, str) and ours.fallback_reason
    names = ["output"] + [f"gradient {i}" for i in range(len(mine) - 1)]
    for name, a, b in zip(names, mine, ref):
        assert_close(a, b, name)
    return mine


def random_inputs(executor: str, seed: int = 0, features: int = 4):
    num_nodes, num_edges = sizes(executor)
    edge_index = make_graph(num_nodes, num_edges, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, features, generator=generator)
    return x, edge_index, edge_index.size(1), generator


# -- the user classes' messages ---------------------------------------------------------------------
def gcn_message(self, x_j, edge_weight):
    return x_j * edge_weight.view(-1, 1)


def gin_message(self, x_j, edge_attr):
    return F.relu(x_j + edge_attr)


def gat_message(self, x_j, alpha):
    return x_j * alpha.unsqueeze(-1)


def edge_conv_message(self, x_i, x_j):
    return x_i - x_j


def edge_conv_cat_message(self, x_i, x_j):
    return torch.cat([x_i, x_j - x_i], dim=-1)


def product_message(self, x_i, x_j):
    return x_i * x_j


def constants_message(self, x_i, x_j):
    return 2.0 * x_j - x_i / 4 + 1 - (0.5 - x_j) * 3


def activations_message(self, x_i, x_j):
    return (
        torch.sigmoid(x_j) * torch.tanh(x_i)
        + torch.exp(-x_j.abs())
        - torch.maximum(x_i, x_j) / 2
        + torch.minimum(x_i, x_j) * torch.sqrt(x_j * x_j + 1)
        - torch.log(1 + x_i**2)
        + F.relu(-x_i)
    )


def leaky_relu_message(self, x_i, x_j):
    return F.leaky_relu(x_i + x_j, 0.2) - F.leaky_relu(x_j, negative_slope=0.1)


def linear_message(self, x_j):
    return self.lin(x_j)


def tuple_message(self, x_j, edge_weight):
    return x_j, edge_weight


def tuple_aggregate(self, inputs, index, dim_size=None):
    x_j, edge_weight = inputs
    return scatter(x_j * edge_weight.view(-1, 1), index, dim=0, dim_size=dim_size, reduce="sum")


def weighted_message(self, x_i, x_j, edge_weight):
    return (x_i + x_j) * edge_weight.view(-1, 1)


def update_with_x(self, inputs, x):
    return inputs * 2 + x[1] if isinstance(x, tuple) else inputs * 2 + x


def multihead_message(self, x_i, x_j, alpha):
    heads = alpha.size(-1)
    out = (x_i + x_j).view(-1, heads, x_j.size(-1) // heads) * alpha.unsqueeze(-1)
    return out.view(-1, x_j.size(-1))


def dot_message(self, x_i, x_j):
    return (x_i * x_j).sum(dim=-1, keepdim=True)


def scaled_message(self, x_j):
    return x_j * self.scale


def parameter_message(self, x_j):
    return x_j * self.weight


def in_place_message(self, x_i, x_j):
    return x_j.sub_(x_i)


def branching_message(self, x_j):
    if x_j.sum(-1, keepdim=True).tolist()[0][0] > 0:  # branches on the first edge's message
        return x_j
    return -x_j


def optional_weight_message(self, x_j, edge_weight):
    return x_j if edge_weight is None else x_j * edge_weight.view(-1, 1)


# -- captured messages -----------------------------------------------------------------------------
def test_gcn_like(executor):
    x, edge_index, num_edges, generator = random_inputs(executor)
    ours, theirs = twins(gcn_message)
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert ours.capture.op.name == "u_mul_e_sum"


@pytest.mark.parametrize("graph_size", ["at_the_threshold", "below_it"])
def test_eager_calls_on_small_gpu_graphs_run_pygs_propagation(monkeypatch, graph_size):
    """On a host-bound device (the CPU stands in for a GPU here), an eager propagation on a graph of
    fewer than ``fused_min_edges`` edges runs PyG's, with the reason, and the fused operator from
    that many; while a whole step is recorded it runs fused on the smaller graph too. PyG's
    results either way."""
    monkeypatch.setattr(graph_argument, "HOST_BOUND_DEVICES", ("cpu",))
    x, edge_index, num_edges, generator = random_inputs("reference")
    limit = num_edges + (graph_size == "below_it")
    monkeypatch.setattr(ug.MessagePassing, "fused_min_edges", limit)
    weight = torch.rand(num_edges, generator=generator)
    ours, theirs = twins(gcn_message)
    below = graph_size == "below_it"
    compare(ours, theirs, edge_index, captured=not below, x=x, edge_weight=weight)
    if below:
        assert f"fewer than {limit} edges runs PyG's propagation" in ours.fallback_reason
        with recording_steps():
            compare(ours, theirs, edge_index, x=x, edge_weight=weight)
        assert ours.capture.op.name == "u_mul_e_sum"


def test_eager_calls_on_small_graphs_of_other_devices_run_fused(monkeypatch):
    """The rule is the host-bound devices' only: the same small graph on the CPU runs fused."""
    x, edge_index, num_edges, generator = random_inputs("reference")
    monkeypatch.setattr(ug.MessagePassing, "fused_min_edges", num_edges + 1)
    ours, theirs = twins(gcn_message)
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))


def test_gin_like(executor):
    x, edge_index, num_edges, generator = random_inputs(executor, seed=1)
    ours, theirs = twins(gin_message)
    compare(ours, theirs, edge_index, x=x, edge_attr=torch.randn(num_edges, 4, generator=generator))
    assert ours.capture.op.expr.fn == "relu" and ours.capture.op.inputs == ("src_v", "edge")


def test_gat_like_heads(executor):
    """``x`` of shape [N, H, C] times a per-head edge weight: PyG's GATConv needs node_dim=0."""
    x, edge_index, num_edges, generator = random_inputs(executor, seed=2, features=6)
    ours, theirs = twins(gat_message, node_dim=0)
    compare(ours, theirs, edge_index, x=x.view(-1, 2, 3), alpha=torch.rand(num_edges, 2, generator=generator))
    assert ours.capture.message_shape == (2, 3)


def test_edge_conv_like(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=3)
    ours, theirs = twins(edge_conv_message, aggr="max")
    compare(ours, theirs, edge_index, x=x)
    assert ours.capture.op.name == "v_sub_u_max"


def sliced_message(self, x_j, x_i, edge_weight):
    return F.relu(x_j[:, :2] - x_i[:, 2:]) * edge_weight.view(-1, 1) + x_j[..., 1::2]


def test_feature_slices_are_captured(executor):
    """Slices of the node features on both ends, gradients included: one fused operator."""
    x, edge_index, num_edges, generator = random_inputs(executor, seed=6)
    ours, theirs = twins(sliced_message)
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert ours.capture.message_shape == (2,) and len(ours.capture.ops) == 1


def test_edge_conv_concatenation_runs_staged(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=3)
    ours, theirs = twins(edge_conv_cat_message, aggr="max")
    compare(ours, theirs, edge_index, captured="staged", x=x)
    assert "torch.cat" in ours.staged_reason


@pytest.mark.parametrize("aggr", ["mean", "max", "min", "add", MeanAggregation(), MaxAggregation()])
def test_product_with_every_aggregation(executor, aggr):
    x, edge_index, _, _ = random_inputs(executor, seed=4)
    ours, theirs = twins(product_message, aggr=aggr)
    compare(ours, theirs, edge_index, x=x)
    expected = {"add": "sum", "MeanAggregation()": "mean", "MaxAggregation()": "max"}.get(str(aggr), aggr)
    assert ours.capture.op.gather_op == expected


def test_scalar_constants(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=5)
    ours, theirs = twins(constants_message)
    compare(ours, theirs, edge_index, x=x)


def test_activations(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=6)
    ours, theirs = twins(activations_message, aggr="mean")
    compare(ours, theirs, edge_index, x=x)


def test_leaky_relu_slopes(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=7)
    ours, theirs = twins(leaky_relu_message, aggr="max")
    compare(ours, theirs, edge_index, x=x)
    slopes = {node.args[1].value for node in ours.capture.op.expr.walk() if node.fn == "leaky_relu"}
    assert slopes == {0.2, 0.1}


def test_view_of_an_intermediate_result(executor):
    x, edge_index, num_edges, generator = random_inputs(executor, seed=8, features=6)
    ours, theirs = twins(multihead_message)
    compare(ours, theirs, edge_index, x=x, alpha=torch.rand(num_edges, 2, generator=generator))


def test_dot_product_then_aggregation(executor):
    x, edge_index, _, _ = random_inputs(executor, seed=9)
    ours, theirs = twins(dot_message, aggr="max")
    compare(ours, theirs, edge_index, x=x)
    assert [op.name for op in ours.capture.ops] == ["v_dot_u", "copy_e_max"]


def test_update_is_applied_after_the_fused_op(executor):
    x, edge_index, num_edges, generator = random_inputs(executor, seed=10)
    ours, theirs = twins(weighted_message, extra={"update": update_with_x})
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))


def test_target_to_source(executor):
    x, edge_index, num_edges, generator = random_inputs(executor, seed=11)
    ours, theirs = twins(weighted_message, flow="target_to_source")
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))


def asymmetric_message(self, x_i, x_j):
    return x_j * 2.0 - x_i


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_pair_of_node_tensors_under_either_flow(executor, flow):
    """``x_j`` reads the pair's first tensor and ``x_i`` its second under either flow, as PyG's
    generated propagate() reads them (its generic one swaps them under target_to_source)."""
    num_nodes, num_edges = sizes(executor)
    edge_index = make_graph(num_nodes, num_edges, seed=13)
    generator = torch.Generator().manual_seed(13)
    x = (torch.randn(num_nodes, 3, generator=generator), torch.randn(num_nodes, 3, generator=generator))
    ours, theirs = twins(asymmetric_message, flow=flow)
    compare(ours, theirs, edge_index, x=x)


def test_bipartite_pair_with_size(executor):
    num_src, num_edges = sizes(executor)
    num_dst = num_src // 2 + 1
    edge_index = make_graph(num_src, num_edges, seed=12, num_dst=num_dst)
    generator = torch.Generator().manual_seed(12)
    x = (torch.randn(num_src, 4, generator=generator), torch.randn(num_dst, 4, generator=generator))
    weight = torch.rand(edge_index.size(1), generator=generator)
    ours, theirs = twins(weighted_message, extra={"update": update_with_x})
    compare(ours, theirs, edge_index, size=(num_src, num_dst), x=x, edge_weight=weight)
    # Only x_j: the number of destinations comes from size alone.
    ours, theirs = twins(gcn_message, aggr="mean")
    out = compare(ours, theirs, edge_index, size=(num_src, num_dst), x=x[0], edge_weight=weight)[0]
    assert out.shape == (num_dst, 4)


def test_edge_index_object(executor):
    x, edge_index, num_edges, generator = random_inputs(executor, seed=13)
    index = EdgeIndex(edge_index, sparse_size=(x.size(0), x.size(0)))
    ours, theirs = twins(gcn_message)
    compare(ours, theirs, index, x=x, edge_weight=torch.rand(num_edges, generator=generator))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_adjacency_values_are_edge_weights(executor, layout):
    """A transposed adjacency ``adj_t[dst, src]``; its values fill ``edge_weight=None``."""
    x, edge_index, _, generator = random_inputs(executor, seed=14)
    num_nodes = x.size(0)
    values = torch.rand(edge_index.size(1), generator=generator)

    def adjacency(kwargs):
        adj_t = torch.sparse_coo_tensor(edge_index.flip(0), kwargs["values"], (num_nodes, num_nodes)).coalesce()
        return adj_t if layout == torch.sparse_coo else adj_t.to_sparse_csr()

    def forward(self, adj_t, values, x):
        return self.propagate(adj_t, x=x, edge_weight=None)

    # PyG's generic propagate() cannot differentiate through a COO adjacency (it flags it coalesced
    # in place); its compiled one can, and needs the argument types of a class built without source.
    ours, theirs = twins(gcn_message, extra={"forward": forward, "propagate_type": PROPAGATE_TYPE})
    compare(ours, theirs, None, make_graph_arg=adjacency, x=x, values=values)


PROPAGATE_TYPE = {"x": torch.Tensor, "edge_weight": Optional[torch.Tensor]}


def test_torch_sparse_tensor_by_duck_typing(executor):
    x, edge_index, _, generator = random_inputs(executor, seed=15)
    num_nodes = x.size(0)
    values = torch.rand(edge_index.size(1), generator=generator)

    def adjacency(kwargs):
        return FakeSparseTensor(edge_index[1], edge_index[0], kwargs["values"], (num_nodes, num_nodes))

    def forward(self, adj_t, values, x):
        return self.propagate(adj_t, x=x, edge_weight=None)

    ours, theirs = twins(gcn_message, extra={"forward": forward})
    compare(ours, theirs, None, make_graph_arg=adjacency, x=x, values=values)


# -- fallbacks -------------------------------------------------------------------------------------
def test_linear_layer_of_an_argument_is_a_product_of_the_node_rows(executor):
    """``self.lin(x_j)`` is captured: the Linear multiplies the node rows before the kernel, from
    the module's current weights, so that an optimiser step reaches the next call."""
    x, edge_index, _, _ = random_inputs(executor, seed=16)
    ours, theirs = twins(linear_message, setup=lambda m: setattr(m, "lin", torch.nn.Linear(4, 3)))
    compare(ours, theirs, edge_index, x=x)
    (product,) = ours.capture.products
    assert (product.source.argument, product.weight, product.bias) == ("x_j", "lin.weight", "lin.bias")
    for module in (ours, theirs):
        with torch.no_grad():
            module.lin.weight.mul_(-2.0)
    compare(ours, theirs, edge_index, x=x)
    assert ours.trace_count == 1


def test_a_linear_layer_of_a_new_shape_traces_again():
    x, edge_index, _, _ = random_inputs("reference", seed=16)
    ours, theirs = twins(linear_message, setup=lambda m: setattr(m, "lin", torch.nn.Linear(4, 3)))
    compare(ours, theirs, edge_index, x=x)
    torch.manual_seed(0)
    ours.lin = torch.nn.Linear(4, 5)
    theirs.lin = copy.deepcopy(ours.lin)
    assert compare(ours, theirs, edge_index, x=x)[0].shape[-1] == 5
    assert ours.trace_count == 2


def test_tuple_message_with_custom_aggregate_falls_back():
    x, edge_index, num_edges, generator = random_inputs("reference", seed=17)
    ours, theirs = twins(tuple_message, extra={"aggregate": tuple_aggregate})
    compare(ours, theirs, edge_index, captured=False, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert "aggregate()" in ours.fallback_reason


def tanh_message(self, x_j):
    return torch.tanh(x_j)


def weighted_scatter(reduce: str) -> Callable:
    def aggregate(self, inputs, index, dim_size=None, edge_weight=None):
        return scatter(inputs * edge_weight.view(-1, 1), index, dim=0, dim_size=dim_size, reduce=reduce)

    return aggregate


@pytest.mark.parametrize("reduce, gather_op", [("sum", "sum"), ("add", "sum"), ("mean", "mean"), ("max", "max")])
def test_an_aggregate_of_one_scatter_is_the_fused_gather(executor, reduce, gather_op):
    """A module's own aggregate() that returns one PyG scatter over the receivers: its reduction is
    the gather op, and what it scatters (here weighted by an argument of aggregate() alone) is fused
    into the message; the module's aggr plays no part, as in PyG."""
    x, edge_index, num_edges, generator = random_inputs(executor, seed=23)
    ours, theirs = twins(tanh_message, aggr="min", extra={"aggregate": weighted_scatter(reduce)})
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert len(ours.capture.ops) == 1 and ours.capture.op.gather_op == gather_op
    assert [o.argument for o in ours.capture.operands] == ["x_j", "edge_weight"]


def two_scatters(self, inputs, index, dim_size=None):
    return torch.stack([scatter(inputs, index, 0, dim_size, "sum"), scatter(inputs, index, 0, dim_size, "max")], 1)


def scatter_without_size(self, inputs, index, dim_size=None):
    return scatter(inputs, index, 0, reduce="sum")


def scatter_product(self, inputs, index, dim_size=None):
    return scatter(inputs, index, 0, dim_size, reduce="mul")


@pytest.mark.parametrize(
    "aggregate, why",
    [
        (two_scatters, "aggregate() calls torch.stack of several values"),
        (scatter_without_size, "dim_size that is not the number of receivers"),
        (scatter_product, "reduce='mul'"),
    ],
    ids=["stacked", "no_dim_size", "product"],
)
def test_any_other_aggregate_runs_pygs_path_and_says_why(aggregate, why):
    x, edge_index, _, _ = random_inputs("reference", seed=24)
    ours, theirs = twins(tanh_message, extra={"aggregate": aggregate})
    compare(ours, theirs, edge_index, captured=False, x=x)
    assert why in ours.fallback_reason and "own aggregate()" in ours.fallback_reason


def test_tuple_message_reason():
    x, edge_index, num_edges, generator = random_inputs("reference", seed=17)
    ours, _ = twins(tuple_message)
    with pytest.raises(Exception):  # PyG's aggregation cannot take a tuple either
        ours(edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert ours.fallback_reason.startswith("message() returns a tuple")


def test_module_parameter_in_message_is_an_operand_read_at_every_call(executor):
    """A parameter combined with the messages is an operand of the fused kernel, read from the
    module at every call: a change of its value reaches the next call without a new trace."""
    x, edge_index, _, _ = random_inputs(executor, seed=18)
    ours, theirs = twins(parameter_message, setup=lambda m: setattr(m, "weight", torch.nn.Parameter(torch.randn(4))))
    compare(ours, theirs, edge_index, x=x)
    (value,) = ours.capture.values
    assert value.path == "weight"
    for module in (ours, theirs):
        with torch.no_grad():
            module.weight.mul_(-3.0)
    compare(ours, theirs, edge_index, x=x)
    assert ours.trace_count == 1


def test_a_parameter_of_a_new_shape_traces_again():
    x, edge_index, _, _ = random_inputs("reference", seed=18)
    ours, theirs = twins(parameter_message, setup=lambda m: setattr(m, "weight", torch.nn.Parameter(torch.randn(4))))
    compare(ours, theirs, edge_index, x=x)
    for module in (ours, theirs):
        module.weight = torch.nn.Parameter(torch.randn(1, generator=torch.Generator().manual_seed(2)))
    compare(ours, theirs, edge_index, x=x)
    assert ours.trace_count == 2 and ours.capture.values[0].shape == (1,)


def test_a_tensor_made_inside_message_runs_staged():
    x, edge_index, _, _ = random_inputs("reference", seed=18)

    def message(self, x_j):
        return x_j * torch.ones(4)

    ours, theirs = twins(message)
    compare(ours, theirs, edge_index, captured="staged", x=x)
    assert "not an argument of propagate() nor a parameter or buffer" in ours.staged_reason


def test_data_dependent_python_runs_staged():
    x, edge_index, _, _ = random_inputs("reference", seed=19)
    ours, theirs = twins(branching_message)
    compare(ours, theirs, edge_index, captured="staged", x=x)
    assert "values" in ours.staged_reason and "tolist" in ours.staged_reason


def test_in_place_change_of_an_argument_falls_back():
    x, edge_index, _, _ = random_inputs("reference", seed=19)
    ours, theirs = twins(in_place_message)
    compare(ours, theirs, edge_index, captured=False, x=x)
    assert "in place" in ours.fallback_reason and "staged run fails too" in ours.fallback_reason


@pytest.mark.parametrize(
    "option, reason",
    [
        ("decomposed_layers", "decomposed_layers=2"),
        ("explain", "explain mode"),
        ("message_hook", "hooks"),
        ("list_aggr", "MultiAggregation"),
    ],
)
def test_configurations_that_need_messages_fall_back(option, reason):
    x, edge_index, num_edges, generator = random_inputs("reference", seed=20)
    init = {"decomposed_layers": 2} if option == "decomposed_layers" else {}
    aggr = ["mul", "softmax"] if option == "list_aggr" else "sum"  # no part is a graph operator
    ours, theirs = twins(gcn_message, aggr=aggr, **init)
    for module in (ours, theirs):
        if option == "explain":
            module.explain = True
            module._edge_mask = torch.linspace(-1, 1, num_edges)
        if option == "message_hook":
            module.register_message_forward_hook(lambda m, inputs, out: out * 2)
    compare(ours, theirs, edge_index, captured=False, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert reason in ours.fallback_reason


def test_a_list_of_aggregations_runs_staged_part_by_part():
    x, edge_index, num_edges, generator = random_inputs("reference", seed=20)
    ours, theirs = twins(gcn_message, aggr=["sum", "max", "std", "mul"])
    compare(ours, theirs, edge_index, captured="staged", x=x, edge_weight=torch.rand(num_edges, generator=generator))
    assert "MultiAggregation runs part by part" in ours.staged_reason and "MulAggregation" in ours.staged_reason


def test_fallback_reason_is_a_sentence():
    x, edge_index, _, _ = random_inputs("reference", seed=21)
    ours, _ = twins(in_place_message)
    ours(edge_index, x=x)
    reason = ours.fallback_reason
    assert reason.startswith("message() modifies a tensor in place") and "\n" not in reason
    ours.__class__.message = product_message  # the same module, now capturable
    ours(edge_index, x=x)
    assert ours.fallback_reason is None


# -- hooks, caching, edge cases ----------------------------------------------------------------------
def test_propagate_pre_hook_runs_once_on_both_paths():
    x, edge_index, num_edges, generator = random_inputs("reference", seed=22)
    weight = torch.rand(num_edges, generator=generator)
    for message in (gcn_message, lambda self, x_j, edge_weight: torch.cat([x_j, x_j], -1) * edge_weight[:, None]):
        ours, theirs = twins(message)
        calls = []
        for module in (ours, theirs):
            module.register_propagate_forward_pre_hook(
                lambda m, inputs: (inputs[0], inputs[1], {**inputs[2], "x": inputs[2]["x"] * 3})
            )
            module.register_propagate_forward_hook(lambda m, inputs, out: calls.append(1) or out + 1)
        compare(ours, theirs, edge_index, captured=message is gcn_message or "staged", x=x, edge_weight=weight)
        assert len(calls) == 2


def test_missing_arguments_take_their_defaults():
    """As in PyG's compiled propagate(): ``edge_weight=None`` when the forward pass does not pass it."""
    x, edge_index, _, _ = random_inputs("reference", seed=28)

    def message(self, x_j, edge_weight=None):
        return x_j if edge_weight is None else x_j * edge_weight.view(-1, 1)

    ours, theirs = twins(message, extra={"propagate_type": {"x": torch.Tensor}})
    compare(ours, theirs, edge_index, x=x)
    assert ours.capture.op.name == "copy_u_sum"


def test_capture_is_cached_and_retraced_when_the_signature_changes():
    x, edge_index, num_edges, generator = random_inputs("reference", seed=23)
    ours, theirs = twins(optional_weight_message)
    weight = torch.rand(num_edges, generator=generator)
    compare(ours, theirs, edge_index, x=x, edge_weight=weight)
    assert ours.trace_count == 1
    other = make_graph(9, 25, seed=5)  # another graph, same signature
    compare(ours, theirs, other, x=torch.randn(9, 4), edge_weight=torch.rand(other.size(1)))
    assert ours.trace_count == 1
    compare(ours, theirs, edge_index, x=torch.randn(x.size(0), 7), edge_weight=weight)  # feature size
    assert ours.trace_count == 2
    compare(ours, theirs, edge_index, x=x.double(), edge_weight=weight.double())  # dtype
    assert ours.trace_count == 3
    compare(ours, theirs, edge_index, x=x, edge_weight=None)  # an argument absent
    assert ours.trace_count == 4 and ours.capture.op.name == "copy_u_sum"
    compare(ours, theirs, edge_index, x=x, edge_weight=weight)  # back to the first signature
    assert ours.trace_count == 4


def test_module_attributes_key_the_capture():
    x, edge_index, _, _ = random_inputs("reference", seed=24)
    ours, theirs = twins(scaled_message)
    for scale in (2.0, 2.0, -0.5):
        ours.scale = theirs.scale = scale
        compare(ours, theirs, edge_index, x=x)
    assert ours.trace_count == 2


def test_reading_the_edge_count_keys_the_capture():
    def message(self, x_j):
        return x_j.view(x_j.size(0), -1) * 2

    x, edge_index, _, _ = random_inputs("reference", seed=25)
    ours, theirs = twins(message)
    compare(ours, theirs, edge_index, x=x)
    compare(ours, theirs, edge_index, x=x)
    other = make_graph(9, 25, seed=5)
    compare(ours, theirs, other, x=torch.randn(9, 4))
    assert ours.trace_count == 2 and ours.capture.num_edges == other.size(1)


def test_the_capture_reading_shapes_itself_serves_every_edge_count():
    """A Linear of a concatenation (EdgeConv's message): the shapes that the capture reads to split
    it are not message()'s reads of the edge count, so one capture serves graphs of every size (a
    mini-batch's new graph every step traces nothing)."""

    def message(self, x_i, x_j):
        return torch.tanh(self.lin(torch.cat([x_i, x_j - x_i], dim=-1)))

    x, edge_index, _, _ = random_inputs("reference", seed=26)
    ours, theirs = twins(message, aggr="max", setup=lambda m: setattr(m, "lin", torch.nn.Linear(8, 3)))
    compare(ours, theirs, edge_index, x=x)
    for seed, (num_nodes, num_edges) in enumerate([(9, 25), (14, 51)]):
        compare(ours, theirs, make_graph(num_nodes, num_edges, seed=seed), x=torch.randn(num_nodes, 4))
    assert ours.trace_count == 1 and ours.capture.num_edges is None


def test_an_integer_argument_per_edge_keys_the_capture_without_the_edge_count():
    """The receivers' index given to PyG's softmax (TransformerConv's, AGNNConv's message) is one
    integer per edge, not an operand: the capture is keyed by its other dimensions, so graphs of
    one node count and new edge counts (DropEdge's every step) trace message() once."""

    def message(self, x_i, x_j, index, ptr, size_i):
        return x_j * softmax((x_i * x_j).sum(-1), index, ptr, size_i).unsqueeze(-1)

    ours, theirs = twins(message)
    for seed, num_edges in enumerate([40, 25, 51]):
        x = torch.randn(12, 4, generator=torch.Generator().manual_seed(seed))
        compare(ours, theirs, make_graph(12, num_edges, seed=seed), x=x)
    assert ours.trace_count == 1 and ours.capture.num_edges is None


def test_the_node_count_given_to_softmax_keys_no_capture():
    """``size_i``, which PyG's softmax takes, keys no capture: graphs of new node and edge counts
    (a mini-batch's every step) trace message() once."""

    def message(self, x_i, x_j, index, ptr, size_i):
        return x_j * softmax((x_i * x_j).sum(-1), index, ptr, size_i).unsqueeze(-1)

    ours, theirs = twins(message)
    for seed, (num_nodes, num_edges) in enumerate([(12, 40), (9, 25), (15, 51)]):
        x = torch.randn(num_nodes, 4, generator=torch.Generator().manual_seed(seed))
        compare(ours, theirs, make_graph(num_nodes, num_edges, seed=seed), x=x)
    assert ours.trace_count == 1


@pytest.mark.parametrize(
    "use",
    [
        lambda x_j, size_i: x_j / size_i,
        lambda x_j, size_i: x_j * (2.0 if size_i > 10 else 1.0),
        lambda x_j, size_i: x_j * float(size_i),
        lambda x_j, size_i: x_j + torch.full_like(x_j, size_i),
        lambda x_j, size_i: x_j * len(range(size_i)),
    ],
    ids=["arithmetic", "branch", "float", "torch_call", "index"],
)
def test_a_message_computing_with_the_node_count_is_not_captured(use):
    """The node count used as a number would make a capture hold for one node count: such a
    message() is refused (it runs staged), with PyG's results on every graph."""

    def message(self, x_j, size_i):
        return self.use(x_j, size_i)

    ours, theirs = twins(message, setup=lambda m: setattr(m, "use", use))
    for seed, (num_nodes, num_edges) in enumerate([(12, 40), (9, 25)]):
        x = torch.randn(num_nodes, 4, generator=torch.Generator().manual_seed(seed))
        compare(ours, theirs, make_graph(num_nodes, num_edges, seed=seed), captured="staged", x=x)


def test_a_message_type_checking_the_node_count_sees_an_int():
    """``isinstance(size_i, int)`` holds in a traced message() as in PyG's, so the branch it takes,
    and the capture, are PyG's."""

    def message(self, x_j, size_i):
        return x_j * (2.0 if isinstance(size_i, int) else 1.0)

    ours, theirs = twins(message)
    x, edge_index, _, _ = random_inputs("reference", seed=27)
    compare(ours, theirs, edge_index, x=x)


def test_graph_without_edges():
    ours, theirs = twins(gcn_message, aggr="max")
    compare(ours, theirs, torch.empty(2, 0, dtype=torch.long), x=torch.randn(5, 3), edge_weight=torch.rand(0))


def test_node_dim_pointing_past_the_rows_falls_back():
    """PyG's default node_dim=-2 indexes dimension 1 of a [N, H, C] tensor: not a node gather."""
    x, edge_index, _, _ = random_inputs("reference", seed=26)
    ours, _ = twins(edge_conv_message)
    with pytest.raises(Exception):  # PyG selects along the heads, with indices out of range
        ours(edge_index, x=x.view(x.size(0), 2, 2))
    assert "node_dim" in ours.fallback_reason


def test_saved_and_copied_modules_retrace():
    import copy

    x, edge_index, num_edges, generator = random_inputs("reference", seed=27)
    ours, theirs = twins(gcn_message)
    compare(ours, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))
    clone = copy.deepcopy(ours)
    assert clone.trace_count == 0
    compare(clone, theirs, edge_index, x=x, edge_weight=torch.rand(num_edges, generator=generator))


# -- PyG's own layers, with ug.MessagePassing mixed in --------------------------------------------------
@pytest.mark.parametrize(
    "name, args, captured",
    [
        ("GCNConv", (4, 3), True),
        ("GATConv", (4, 3), True),
        ("GINEConv", (None,), True),
        ("SAGEConv", (4, 3), True),
        ("GraphConv", (4, 3), True),
        ("EdgeConv", (None,), True),
    ],
)
def test_pyg_layers_with_the_mixin(executor, name, args, captured):
    """``class Fast(ug.MessagePassing, GATConv)``: PyG's layer, its propagations captured."""
    import torch_geometric.nn as pyg_nn

    x, edge_index, num_edges, generator = random_inputs(executor, seed=29)
    weight, attr = torch.rand(num_edges, generator=generator), torch.randn(num_edges, 4, generator=generator)
    conv = getattr(pyg_nn, name)
    torch.manual_seed(29)  # the layer's initial weights: the same whatever tests ran before
    if args == (None,):
        args = (torch.nn.Linear(8 if name == "EdgeConv" else 4, 3),)
    theirs = conv(*args)
    ours = type(f"Fast{name}", (ug.MessagePassing, conv), {})(*args)
    ours.load_state_dict(theirs.state_dict())
    extra = {"GCNConv": (weight,), "GraphConv": (weight,), "GINEConv": (attr,)}.get(name, ())
    results = []
    for module in (ours, theirs):
        leaf = x.clone().requires_grad_()
        out = module(leaf, edge_index, *extra)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        grads = torch.autograd.grad((out * probe).sum(), [leaf] + list(module.parameters()))
        results.append([out] + list(grads))
    for index, (a, b) in enumerate(zip(*results)):
        assert_close(a, b, f"tensor {index}")
    assert ours.fallback_reason is None, ours.fallback_reason
    assert (ours.staged_reason is not None) == (captured == "staged"), ours.staged_reason


def _torch_sparse_missing() -> str:
    import importlib.util

    return (
        ""
        if importlib.util.find_spec("torch_sparse")
        else "torch_sparse is not installed (FakeSparseTensor covers PyG's SparseTensor path)"
    )


@pytest.mark.skipif(bool(_torch_sparse_missing()), reason=_torch_sparse_missing() or "installed")
def test_torch_sparse_tensor(executor):
    from torch_sparse import SparseTensor as RealSparseTensor

    x, edge_index, _, generator = random_inputs(executor, seed=15)
    num_nodes = x.size(0)
    values = torch.rand(edge_index.size(1), generator=generator)

    def adjacency(kwargs):
        return RealSparseTensor(
            row=edge_index[1], col=edge_index[0], value=kwargs["values"], sparse_sizes=(num_nodes, num_nodes)
        )

    def forward(self, adj_t, values, x):
        return self.propagate(adj_t, x=x, edge_weight=None)

    ours, theirs = twins(gcn_message, extra={"forward": forward})
    compare(ours, theirs, None, make_graph_arg=adjacency, x=x, values=values)
