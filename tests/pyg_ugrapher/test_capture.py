"""The tracer behind ``ug.MessagePassing``: ``message()`` -> IR operators, operand recipes, or a reason."""

import functools
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter, softmax

import pyg_ugrapher as ug
from pyg_ugrapher.capture import Argument, CaptureError, capture
from pyg_ugrapher.ir import Expr
from pyg_ugrapher.program import Capture, Operand

NUM_NODES, NUM_EDGES = 6, 9
EDGES = torch.tensor([[0, 1, 2, 3, 4, 0, 2, 2, 1], [1, 2, 0, 0, 3, 1, 2, 4, 4]])  # vertex 5 isolated


def arg(*features: int, kind="edge", dtype=torch.float32, requires_grad=False) -> Argument:
    return Argument((NUM_EDGES,) + features, dtype, torch.device("cpu"), requires_grad, kind)


def trace(message: Callable, gather: str = "sum", **arguments) -> Capture:
    return capture(message, arguments, NUM_EDGES, gather)


def node(*features: int, **options) -> Argument:
    return arg(*features, kind="src_v", **options)


@pytest.fixture(autouse=True)
def reference_executor(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


# -- what is captured, and what it computes ---------------------------------------------------------
def test_gcn_message_is_a_builtin_op_with_reshaped_operands():
    result = trace(lambda x_j, w: x_j * w.view(-1, 1), x_j=node(4), w=arg())
    assert result.op == ug.OpInfo.from_name("u_mul_e_sum")
    assert result.operands == (Operand("x_j", "src_v", (4,)), Operand("w", "edge", (1,)))
    assert result.message_shape == (4,) and result.gather is None and result.num_edges is None
    assert result.operands[1].build(torch.ones(NUM_EDGES)).shape == (NUM_EDGES, 1)


ELEMENTWISE = {
    "relu": lambda a, b, w: torch.relu(a) + F.relu(b) + a.relu(),
    "leaky_relu": lambda a, b, w: F.leaky_relu(a - b, 0.3) + F.leaky_relu(b, negative_slope=0.05),
    "sigmoid_tanh": lambda a, b, w: (
        torch.sigmoid(a) * b.sigmoid() + torch.tanh(b) - F.tanh(a) + torch.special.expit(b) - F.sigmoid(a)
    ),
    "exp_log_sqrt": lambda a, b, w: torch.exp(-a) + torch.log(b) * a.sqrt() - torch.rsqrt(b) + b.exp(),
    "abs_neg_square": lambda a, b, w: torch.abs(a - b) - (-a) + torch.square(b) + abs(a) * torch.neg(b),
    "reciprocal": lambda a, b, w: torch.reciprocal(a) + 1 / b + a.reciprocal(),
    "powers": lambda a, b, w: a**2 + b**0.5 - a**-1 + torch.pow(b, 2) + a**1,
    "constants": lambda a, b, w: 2 * a - b / 3 + 1 - (0.5 - a) * 4 + (True + a) + a.div(2) - torch.sub(a, b),
    "extrema": lambda a, b, w: torch.maximum(a, b) + torch.minimum(a, b) + torch.max(a, b) - torch.min(b, a),
    "identities": lambda a, b, w: (
        a.contiguous()
        + a.clone()
        + a.double()
        + F.dropout(b, 0.5, training=False)
        + a.to(torch.float64)
        + a.type_as(b)
        + +a
    ),
    "edge_weights": lambda a, b, w: a * w.view(-1, 1) + b / w.unsqueeze(-1) - w.reshape(-1, 1, 1).squeeze(-1),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_captured_message_computes_what_message_computes(name):
    """The captured op on a graph equals message() on real, gathered tensors, aggregated."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(NUM_NODES, 3, generator=generator, dtype=torch.float64) + 0.5
    w = torch.rand(NUM_EDGES, generator=generator, dtype=torch.float64) + 0.5
    check_aggregated_messages(ELEMENTWISE[name], x, w)


def check_aggregated_messages(message: Callable, x: torch.Tensor, w: torch.Tensor) -> None:
    """``message(x_j, x_i, w)`` captured on arguments shaped as ``x`` (at both ends) and ``w``: its
    op run on :data:`EDGES` with its operands built from ``x`` and ``w`` equals ``message()`` on the
    gathered rows, summed per destination."""
    result = trace(
        lambda x_j, x_i, w: message(x_j, x_i, w),
        x_j=arg(x.shape[1], kind="src_v", dtype=x.dtype),
        x_i=arg(x.shape[1], kind="dst_v", dtype=x.dtype),
        w=arg(dtype=w.dtype),
    )
    src, dst = EDGES
    messages = message(x[src], x[dst], w)
    expected = torch.zeros((NUM_NODES,) + messages.shape[1:], dtype=messages.dtype).index_add_(0, dst, messages)
    torch.testing.assert_close(run_capture(result, {"x_j": x, "x_i": x, "w": w}), expected)


def run_op(graph: ug.GraphTensor, op: ug.OpInfo, operands) -> torch.Tensor:
    return ug.compute(graph, op, *operands) if op.is_builtin else ug.compute(graph, op, operands=operands)


def run_capture(result: Capture, tensors, module=None) -> torch.Tensor:
    """What a propagation runs for ``result`` on :data:`EDGES`: its values (products, parameters,
    steps), its op and its gather, the output viewed as the capture's message shape."""
    graph = ug.GraphTensor.from_edge_index(EDGES, NUM_NODES)
    tensors = result.operand_tensors(tensors, module, functools.partial(run_op, graph), NUM_EDGES)
    out = run_op(graph, result.op, [operand.build(tensors[operand.argument]) for operand in result.operands])
    out = out.reshape(out.shape[:1] + result.message_shape)
    return out if result.gather is None else run_op(graph, result.gather, [out])


def test_leaky_relu_keeps_its_slope():
    result = trace(lambda x_i, x_j: F.leaky_relu(x_i + x_j, 0.2), x_i=arg(4, kind="dst_v"), x_j=node(4))
    expected = Expr.apply("leaky_relu", Expr.input(0) + Expr.input(1), 0.2)
    assert result.op.expr == expected and result.op.inputs == ("dst_v", "src_v")


def test_heads_broadcast_per_head():
    result = trace(lambda x_j, alpha: x_j.view(-1, 2, 3) * alpha.unsqueeze(-1), x_j=node(6), alpha=arg(2))
    assert result.op.name == "u_mul_e_sum"
    assert [o.shape for o in result.operands] == [(2, 3), (2, 1)] and result.message_shape == (2, 3)


def test_views_of_intermediates_follow_the_operands():
    """A view of ``a + b`` becomes a view of ``a`` and of ``b``, so later ops can combine with it."""

    def message(x_j, alpha, w):
        h = (x_j * alpha).unsqueeze(-1)  # [E, 2, 3, 1]; alpha broadcasts as [2, 1] -> [2, 1, 1]
        return (h * w.view(-1, 1, 1, 4)).flatten(1)

    result = trace(message, x_j=arg(2, 3, kind="src_v"), alpha=arg(2, 1), w=arg(4))
    assert [o.shape for o in result.operands] == [(2, 3, 1), (2, 1, 1), (1, 1, 4)]
    assert result.message_shape == (24,)


def test_final_view_that_operands_cannot_follow_views_the_aggregate():
    result = trace(
        lambda x_j, alpha: (x_j * alpha.unsqueeze(-1)).view(-1, 6), x_j=arg(2, 3, kind="src_v"), alpha=arg(2)
    )
    assert result.message_shape == (6,)
    assert [o.shape for o in result.operands] == [(2, 3), (2, 1)]


def test_dot_product_is_a_reducing_message_op_then_a_gather():
    result = trace(lambda x_i, x_j: (x_i * x_j).sum(dim=-1), "max", x_i=arg(2, 3, kind="dst_v"), x_j=node(2, 3))
    assert result.op == ug.OpInfo("dot", None, lhs="dst_v", rhs="src_v")
    assert result.gather == ug.OpInfo.from_name("copy_e_max") and result.message_shape == (2,)
    assert [op.name for op in result.ops] == ["v_dot_u", "copy_e_max"]
    kept = trace(lambda a, b: torch.sum(a * b, -1, keepdim=True), a=node(4), b=arg(4))
    assert kept.message_shape == (1,) and kept.op.reduces


def test_sum_over_a_unit_dimension_is_a_view():
    result = trace(lambda x_j, w: (x_j * w.view(-1, 1, 1)).sum(-1), x_j=arg(3, 1, kind="src_v"), w=arg())
    assert not result.op.reduces and result.gather is None and result.message_shape == (3,)


def test_kernels_get_broadcasts_they_can_read():
    """A [2, 1, 4] operand of [2, 3, 4] messages is neither per head nor per channel: expanded."""
    result = trace(lambda a, b: a * b, a=node(2, 3, 4), b=arg(2, 1, 4))
    assert result.operands[1].expand == (2, 3, 4)
    assert result.operands[1].build(torch.ones(NUM_EDGES, 8)).shape == (NUM_EDGES, 2, 3, 4)
    dot = trace(lambda a, b: (a * b).sum(-1), a=node(2, 3), b=arg(2, 1))  # a dot over a broadcast
    assert dot.operands[1].expand == (2, 3)


FEATURE_INDEXING = {
    "halves": lambda a, b, w: a[:, :2] * b[:, 2:],
    "of an expression": lambda a, b, w: ((a + b) * w.view(-1, 1))[..., 1:3],
    "steps": lambda a, b, w: F.relu(a[:, ::2] - b[:, 1::2]),
    "from the end": lambda a, b, w: a[:, -3:] + b[:, -3:],
    "an int, then a view": lambda a, b, w: a[:, 0].view(-1, 1) * b[:, 1:],
    "heads": lambda a, b, w: a.view(-1, 2, 2)[:, :, 1] * b.view(-1, 2, 2)[:, 0, :],
    "then viewed": lambda a, b, w: (a[:, :2].view(-1, 2, 1) * b[:, 2:].view(-1, 1, 2)).flatten(1),
}


@pytest.mark.parametrize("name", sorted(FEATURE_INDEXING))
def test_feature_indexing_selects_operand_features(name):
    """Slices and ints of the feature dimensions become selections of the operands' features: the
    captured op on a graph equals message() on real, gathered tensors, aggregated."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(NUM_NODES, 4, generator=generator, dtype=torch.float64)
    w = torch.rand(NUM_EDGES, generator=generator, dtype=torch.float64)
    check_aggregated_messages(FEATURE_INDEXING[name], x, w)


def test_an_operand_broadcast_along_an_indexed_dimension_keeps_its_entry():
    result = trace(lambda x_j, w: (x_j * w.view(-1, 1))[:, 1:3], x_j=node(4), w=arg())
    assert result.operands == (
        Operand("x_j", "src_v", (2,), view=(4,), index=((1, 3, 1),)),
        Operand("w", "edge", (1,), view=(1,), index=((0, 1, 1),)),
    )
    assert result.message_shape == (2,)
    x = torch.arange(NUM_NODES * 4.0).view(NUM_NODES, 4)
    torch.testing.assert_close(result.operands[0].build(x), x[:, 1:3])
    assert "x_j[:, 1:3] as src_v [2]" in str(result)


# -- the edge count, and metadata --------------------------------------------------------------------
def test_reading_the_edge_count_is_recorded():
    assert trace(lambda a: a * a.size(-1) * a.dim(), a=node(4)).num_edges is None
    assert trace(lambda a: a.view(a.size(0), 2, 2), a=node(4)).num_edges == NUM_EDGES
    assert trace(lambda a: a * a.shape[-1], a=node(4)).num_edges == NUM_EDGES
    with pytest.raises(CaptureError) as error:
        trace(lambda a: a.view(a.numel(), -1), a=node(4))
    assert error.value.num_edges == NUM_EDGES


def test_metadata_is_the_real_one():
    seen = {}

    def message(a):
        seen.update(dtype=a.dtype, grad=a.requires_grad, device=a.device, float=a.is_floating_point())
        return a * 2 if a.dtype == torch.float64 else a

    assert trace(message, a=node(2, dtype=torch.float64, requires_grad=True)).op.expr == Expr.input(0) * 2
    assert seen == {"dtype": torch.float64, "grad": True, "device": torch.device("cpu"), "float": True}
    assert trace(message, a=node(2)).op.name == "copy_u_sum"


# -- what is not captured, and why ------------------------------------------------------------------
LINEAR = torch.nn.Linear(4, 4)
WEIGHT = torch.nn.Parameter(torch.randn(4))


def _inplace(a):
    a += 1
    return a


def _branch(a):
    return a if a.sum(-1, keepdim=True).tolist()[0][0] > 0 else -a


REASONS = {
    "concatenation": (lambda a, b, w: torch.cat([a, b], -1), "captured only as the input of a Linear"),
    "concatenation of edges": (lambda a, b, w: torch.cat([a, b]), "other than along the last feature dimension"),
    "matmul": (lambda a, b, w: a @ b.view(-1, 4, 1), "matmul"),
    "linear layer": (lambda a, b, w: LINEAR(a), "not a parameter or buffer of the module"),
    "parameter": (lambda a, b, w: a * WEIGHT, "not an argument of propagate()"),
    "made inside": (lambda a, b, w: a * torch.ones(4), "not an argument of propagate()"),
    "tuple": (lambda a, b, w: (a, b), "returns a tuple of 2 values"),
    "not a tensor": (lambda a, b, w: 3.0, "returns a float"),
    "in place": (lambda a, b, w: _inplace(a), "in place"),
    "in-place activation": (lambda a, b, w: F.relu(a, inplace=True), "in place"),
    "branch": (lambda a, b, w: _branch(a), "reads tensor values in Python"),
    "rows": (lambda a, b, w: a.view(-1), "moves data between edges"),
    "rank": (lambda a, b, w: a * w, "view the smaller one first"),
    "sum over edges": (lambda a, b, w: a.sum(0), "only a sum over the last feature dimension"),
    "dropout": (lambda a, b, w: F.dropout(a, 0.5), "random numbers"),
    "constant": (lambda a, b, w: a * 0, "constant"),
    "power": (lambda a, b, w: a**3, "power 3"),
    "index list": (lambda a, b, w: a[:, [0, 2]], "only slices, ints and ... of the feature dimensions"),
    "index edges": (lambda a, b, w: a[1:] * 2, "indexes the edge dimension"),
    "index twice": (lambda a, b, w: a[:, 1:][:, :2], "whose features it indexed or transposed before"),
    "index nothing": (lambda a, b, w: a[:, 2:2], "selects no features"),
    "indices": (lambda a, b, w, index: a * index.view(-1, 1), "argument 'index', a torch.int64 tensor"),
    "user error": (lambda a, b, w: a.view(-1, 2, 2) * b.view(-1, 4, 1), "raised RuntimeError"),
    "python number": (lambda a, b, w: a * int(w), "reads tensor values in Python"),
    "dropped dtype": (lambda a, b, w, d: d * 0 + b, "promote to another dtype"),
}


@pytest.mark.parametrize("case", sorted(REASONS))
def test_unsupported_messages_say_why(case):
    message, expected = REASONS[case]
    arguments = {"a": node(4), "b": arg(4), "w": arg()}
    if "index" in message.__code__.co_varnames:
        arguments["index"] = Argument(
            (NUM_EDGES,),
            torch.int64,
            torch.device("cpu"),
            False,
            None,
            "a torch.int64 tensor (operands are floating-point)",
        )
    if "d" in message.__code__.co_varnames:
        arguments["d"] = arg(4, dtype=torch.float64)
    with pytest.raises(CaptureError) as error:
        trace(message, **arguments)
    reason = str(error.value)
    assert expected in reason and reason.startswith("message() ") and "\n" not in reason


def test_computing_with_a_view_the_operands_cannot_follow_computes_it_per_edge_first():
    """A view that the operands cannot follow, then more computation: the viewed value is a step of
    its own, an operator writing it per edge, which the fused operator reads."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(NUM_NODES, 2, 3, generator=generator, dtype=torch.float64)
    w = torch.randn(NUM_EDGES, 2, generator=generator, dtype=torch.float64)

    def message(x_j, w):
        return (x_j * w.unsqueeze(-1)).view(-1, 6) + 1

    result = trace(message, x_j=node(2, 3, dtype=torch.float64), w=arg(2, dtype=torch.float64))
    assert [type(value).__name__ for value in result.values] == ["Step"] and len(result.ops) == 2
    expected = torch.zeros(NUM_NODES, 6, dtype=torch.float64).index_add_(0, EDGES[1], message(x[EDGES[0]], w))
    torch.testing.assert_close(run_capture(result, {"x_j": x, "w": w}), expected)


def test_a_dot_product_computed_with_is_a_step_per_vertex_or_per_edge():
    """``(x_j * x_i).sum(-1)`` reads both ends: a step writes it per edge; ``(x_j * x_j).sum(-1)``
    reads one end: computed per vertex, ``N`` rows. Both then feed the fused operator."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(NUM_NODES, 4, generator=generator, dtype=torch.float64)

    def message(x_j, x_i, w):
        return x_j * (x_j * x_i).sum(-1, keepdim=True) - (x_j * x_j).sum(-1, keepdim=True) * w.view(-1, 1)

    w = torch.randn(NUM_EDGES, generator=generator, dtype=torch.float64)
    result = trace(
        message,
        x_j=node(4, dtype=torch.float64),
        x_i=arg(4, kind="dst_v", dtype=torch.float64),
        w=arg(dtype=torch.float64),
    )
    assert sorted(type(value).__name__ for value in result.values) == ["NodeStep", "Step"]
    src, dst = EDGES
    expected = torch.zeros(NUM_NODES, 4, dtype=torch.float64).index_add_(0, dst, message(x[src], x[dst], w))
    torch.testing.assert_close(run_capture(result, {"x_j": x, "x_i": x, "w": w}), expected)


def test_capture_prints_its_operators():
    text = str(trace(lambda x_j, w: x_j * w.view(-1, 1), x_j=node(4), w=arg()))
    assert "x_j as src_v [4]" in text and "u_mul_e_sum" in text and "for each edge" in text


class EdgeMLP(torch.nn.Module):
    """EdgeConv's message with a Linear or a two-layer MLP."""

    def __init__(self, hidden: int = 0):
        super().__init__()
        self.nn = torch.nn.Linear(8, 3)
        if hidden:
            self.nn = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))

    def message(self, x_i, x_j):
        return self.nn(torch.cat([x_i, x_j - x_i], dim=-1))


def test_a_linear_of_a_concatenation_becomes_products_of_the_module_weights():
    """``W [x_i || x_j - x_i] + b``: ``x_i`` reads ``W_1 - W_2`` (and the bias), ``x_j`` reads ``W_2``;
    the products, computed from the real rows and weights, make the captured op compute the messages."""
    module = EdgeMLP().double()
    arguments = {"x_i": arg(4, kind="dst_v", dtype=torch.float64), "x_j": node(4, dtype=torch.float64)}
    result = capture(module.message, arguments, NUM_EDGES, "max", module)
    by_source = {product.source.argument: product for product in result.products}
    assert by_source["x_i"].columns == ((0, 4, 1.0), (4, 8, -1.0)) and by_source["x_i"].bias == "nn.bias"
    assert by_source["x_j"].columns == ((4, 8, 1.0),) and by_source["x_j"].bias is None
    assert all(product.weight == "nn.weight" and product.matches(module) for product in result.products)
    assert "= linear(x_i, nn.weight[:, 0:4] - nn.weight[:, 4:8], nn.bias)" in str(result)
    assert "= linear(x_j, nn.weight[:, 4:8])" in str(result)
    x = torch.randn(NUM_NODES, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert result.op.name == "v_add_u_max" and all(o.argument.startswith("%linear") for o in result.operands)
    out = run_capture(result, {"x_i": x, "x_j": x}, module)
    messages = module.message(x[EDGES[1]], x[EDGES[0]])
    expected = torch.full((NUM_NODES, 3), float("-inf"), dtype=torch.float64)
    expected = expected.scatter_reduce(0, EDGES[1].view(-1, 1).expand(-1, 3), messages, "amax")
    has_edges = torch.zeros(NUM_NODES, dtype=torch.bool)
    has_edges[EDGES[1]] = True
    assert torch.allclose(out[has_edges], expected[has_edges], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="module"):
        result.operand_tensors({"x_i": x, "x_j": x}, None, lambda op, operands: operands[0], NUM_EDGES)


def test_an_mlp_after_an_activation_says_why():
    module = EdgeMLP(hidden=5)
    with pytest.raises(CaptureError, match="a Linear after an activation, as in an MLP's later layers"):
        capture(module.message, {"x_i": arg(4, kind="dst_v"), "x_j": node(4)}, NUM_EDGES, "sum", module)


def test_a_weight_computed_in_message_is_not_captured():
    module = EdgeMLP()
    message = lambda x_j: F.linear(x_j, module.nn.weight * 2)  # noqa: E731
    with pytest.raises(CaptureError, match="not a parameter or buffer of the module"):
        capture(message, {"x_j": node(8)}, NUM_EDGES, "sum", module)


class Attention(torch.nn.Module):
    """A GAT-style message: per-vertex scores with parameters, PyG's softmax over the receivers,
    the weights stored on the module."""

    def __init__(self):
        super().__init__()
        self.att_src = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(4)))
        self.att_dst = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(5)))
        self._alpha = None

    def message(self, x_j, x_i, index, size_i):
        alpha = F.leaky_relu((x_j * self.att_src).sum(-1) + (x_i * self.att_dst).sum(-1), 0.2)
        alpha = softmax(alpha, index, num_nodes=size_i)
        self._alpha = alpha
        return x_j * alpha.unsqueeze(-1)


def receivers() -> Argument:
    """PyG's ``index``: the receiver of each edge, not an operand."""
    return Argument((NUM_EDGES,), torch.int64, torch.device("cpu"), False, None, "an index")


def attention_arguments() -> dict:
    """The float64 arguments of :class:`Attention`'s ``message()``."""
    return {
        "x_j": node(4, dtype=torch.float64),
        "x_i": arg(4, kind="dst_v", dtype=torch.float64),
        "index": receivers(),
        "size_i": NUM_NODES,
    }


def test_softmax_over_the_receivers_and_stored_weights():
    """Parameters become broadcast operands, the one-ended scores steps per vertex, PyG's softmax four
    steps (scores, maxima, sums, weights), and ``self._alpha`` the weights' step, set on the module
    when the capture runs: outputs, weights and gradients equal message() on gathered rows."""
    module = Attention().double()
    result = capture(module.message, attention_arguments(), NUM_EDGES, "sum", module)
    assert module._alpha is None  # the traced value is not left on the module
    kinds = [type(value).__name__ for value in result.values]
    assert kinds.count("Broadcast") == 2 and kinds.count("NodeStep") == 2 and kinds.count("Step") == 4, kinds
    assert [op.gather_op for op in result.ops] == [None, "max", "sum", None, "sum"]
    ((attribute, argument),) = result.stores
    assert attribute == "_alpha" and argument == result.operands[-1].argument
    x = torch.randn(NUM_NODES, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    out = run_capture(result, {"x_j": leaf, "x_i": leaf}, module)
    stored = module._alpha
    src, dst = EDGES
    reference = Attention().double()
    expected_leaf = x.clone().requires_grad_()
    messages = reference.message(expected_leaf[src], expected_leaf[dst], dst, NUM_NODES)
    expected = torch.zeros(NUM_NODES, 4, dtype=torch.float64).index_add(0, dst, messages)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(stored, reference._alpha)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    mine = torch.autograd.grad((out * probe).sum(), [leaf, module.att_src, module.att_dst])
    theirs = torch.autograd.grad((expected * probe).sum(), [expected_leaf, reference.att_src, reference.att_dst])
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b)


def test_softmax_over_other_groups_is_not_captured():
    module = Attention()

    def message(x_j, index):
        return x_j * softmax(x_j.sum(-1), index.flip(0)).unsqueeze(-1)

    arguments = {"x_j": node(4), "index": receivers()}
    with pytest.raises(CaptureError, match="torch.Tensor.flip"):
        capture(message, arguments, NUM_EDGES, "sum", module)


class EdgeNetwork(torch.nn.Module):
    """NNConv's message: a per-edge matrix from the edge features, times the source's features."""

    def __init__(self):
        super().__init__()
        self.nn = torch.nn.Linear(3, 4 * 2)

    def message(self, x_j, edge_attr):
        weight = self.nn(edge_attr).view(-1, 4, 2)
        return torch.matmul(x_j.unsqueeze(1), weight).squeeze(1)


class Mixture(torch.nn.Module):
    """GMMConv's pattern: views of parameters, a dot product computed with, a sum over the
    next-to-last dimension."""

    def __init__(self):
        super().__init__()
        self.mu = torch.nn.Parameter(torch.randn(2, 3, generator=torch.Generator().manual_seed(8)))

    def message(self, x_j, edge_attr):
        gaussian = torch.exp(-0.5 * (edge_attr.view(-1, 1, 3) - self.mu.view(1, 2, 3)).pow(2).sum(dim=-1))
        return (x_j.view(-1, 2, 2) * gaussian.view(-1, 2, 1)).sum(dim=-2)


class ScaledMixture(Mixture):
    """GMMConv's full pattern: a divisor computed from a parameter outside the traced values."""

    def __init__(self):
        super().__init__()
        self.sigma = torch.nn.Parameter(torch.rand(2, 3, generator=torch.Generator().manual_seed(10)) + 0.5)

    def message(self, x_j, edge_attr):
        distance = -0.5 * (edge_attr.view(-1, 1, 3) - self.mu.view(1, 2, 3)).pow(2)
        gaussian = torch.exp((distance / (1e-15 + self.sigma.view(1, 2, 3).pow(2))).sum(dim=-1))
        return (x_j.view(-1, 2, 2) * gaussian.view(-1, 2, 1)).sum(dim=-2)


@pytest.mark.parametrize(
    "cls", [EdgeNetwork, Mixture, ScaledMixture], ids=["matmul", "sum_over_dim_-2", "computed_parameter"]
)
def test_per_edge_matrices_and_sums_over_the_next_to_last_dimension(cls):
    """A matmul of per-edge matrices and a sum over the next-to-last dimension transpose their
    operands (a copy of the rows) and sum over the last one; a view of a parameter is the
    parameter's operand: the messages, aggregated, and their gradients equal message()'s."""
    module = cls().double()
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(NUM_NODES, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    edge_attr = torch.randn(NUM_EDGES, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    arguments = {"x_j": node(4, dtype=torch.float64), "edge_attr": arg(3, dtype=torch.float64)}
    result = capture(module.message, arguments, NUM_EDGES, "sum", module)
    assert any(o.transposed for o in result.operands)
    if cls is not EdgeNetwork:
        assert [value.path for value in result.values if hasattr(value, "path")] == ["mu"]
    out = run_capture(result, {"x_j": x, "edge_attr": edge_attr}, module)
    src, dst = EDGES
    expected = torch.zeros(NUM_NODES, 2, dtype=torch.float64).index_add(0, dst, module.message(x[src], edge_attr))
    torch.testing.assert_close(out, expected)
    probe = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    wrt = [x, edge_attr] + list(module.parameters())
    for a, b in zip(torch.autograd.grad((out * probe).sum(), wrt), torch.autograd.grad((expected * probe).sum(), wrt)):
        torch.testing.assert_close(a, b)


def test_a_transposed_operand_is_built_transposed():
    operand = Operand("w", "edge", (3, 2), transposed=True)
    rows = torch.arange(2 * 6.0).view(2, 6)
    assert torch.equal(operand.build(rows), rows.view(2, 2, 3).transpose(1, 2))
    assert operand.build(rows).is_contiguous()


def test_a_tensor_computed_from_parameters_is_computed_again_at_every_call():
    """The calls that made ``1e-15 + sigma.view(...).pow(2)`` are replayed on the module's current
    sigma: an update in place reaches the capture, and another shape traces again."""
    module = ScaledMixture().double()
    arguments = {"x_j": node(4, dtype=torch.float64), "edge_attr": arg(3, dtype=torch.float64)}
    result = capture(module.message, arguments, NUM_EDGES, "sum", module)
    (computed,) = [value for value in result.values if type(value).__name__ == "Computed"]
    assert [name for name, _, _ in computed.calls] == ["torch.Tensor.view", "torch.Tensor.pow", "torch.Tensor.add"]
    assert computed.reads == (("sigma", (2, 3), torch.float64),)
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(NUM_NODES, 4, generator=generator, dtype=torch.float64)
    edge_attr = torch.randn(NUM_EDGES, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        module.sigma.mul_(3.0)
    out = run_capture(result, {"x_j": x, "edge_attr": edge_attr}, module)
    src, dst = EDGES
    expected = torch.zeros(NUM_NODES, 2, dtype=torch.float64).index_add(0, dst, module.message(x[src], edge_attr))
    torch.testing.assert_close(out, expected)
    assert result.matches(module)
    module.sigma = torch.nn.Parameter(torch.ones(6, dtype=torch.float64))
    assert not result.matches(module)


def test_a_tensor_made_inside_message_is_not_an_operand():
    module = ScaledMixture()

    def message(x_j):
        return x_j / (1.0 + torch.ones(4) * module.sigma.sum())

    with pytest.raises(CaptureError, match="nor computed from those alone"):
        capture(message, {"x_j": node(4)}, NUM_EDGES, "sum", module)


class DelegatedAttention(Attention):
    """SuperGATConv's pattern: message() calls a method of the module that calls PyG's softmax."""

    def message(self, x_j, x_i, index, size_i):
        return x_j * self.attention(x_j, x_i, index, size_i).unsqueeze(-1)

    def attention(self, x_j, x_i, index, size_i):
        alpha = F.leaky_relu((x_j * self.att_src).sum(-1) + (x_i * self.att_dst).sum(-1), 0.2)
        return softmax(alpha, index, num_nodes=size_i)


def test_a_method_that_message_calls_reads_the_traced_softmax():
    module = DelegatedAttention().double()
    result = capture(module.message, attention_arguments(), NUM_EDGES, "sum", module)
    assert [op.gather_op for op in result.ops] == [None, "max", "sum", None, "sum"]
    assert "attention" not in vars(module)  # the traced method is bound for the trace only
    x = torch.randn(NUM_NODES, 4, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    src, dst = EDGES
    expected = torch.zeros(NUM_NODES, 4, dtype=torch.float64).index_add(
        0, dst, module.message(x[src], x[dst], dst, NUM_NODES)
    )
    torch.testing.assert_close(run_capture(result, {"x_j": x, "x_i": x}, module), expected)


class Summed(torch.nn.Module):
    def message(self, x_j):
        return x_j * 2.0

    def aggregate(self, inputs, index, dim_size=None):
        return scatter(inputs, index, 0, dim_size, reduce="max") * 2.0


def test_an_aggregate_that_computes_with_its_scatter_says_why():
    module = Summed()
    aggregate = (module.aggregate, {"index": receivers(), "dim_size": NUM_NODES})
    with pytest.raises(CaptureError, match=r"aggregate\(\) computes with the result of a scatter in aggregate\(\)"):
        capture(module.message, {"x_j": node(4)}, NUM_EDGES, "sum", module, aggregate=aggregate)


class Slotted:
    """A message() bound to an object without an attribute dictionary."""

    __slots__ = ()

    def message(self, x_j):
        return x_j * softmax(x_j.sum(-1), torch.zeros(NUM_EDGES, dtype=torch.long)).unsqueeze(-1)


def test_a_method_of_an_object_without_attributes_is_traced():
    """Its message() reads the trace's softmax (which refuses groups that are not the receivers)."""
    with pytest.raises(CaptureError, match="other groups than the receivers"):
        capture(Slotted().message, {"x_j": node(4)}, NUM_EDGES, "sum")
