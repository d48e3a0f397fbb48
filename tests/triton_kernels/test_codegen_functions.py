"""The elementwise functions of the generated kernels beyond the arithmetic core (clamps,
comparisons and ``where``, GELU, SiLU, ELU, softplus, sine, cosine, erf): torch's values at the
special points (kinks, saturation, overflow, infinities, NaN) and in every dtype, and the text that
``where`` renders."""

import math

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import Expr, OpInfo, parse_expr
from triton_kernels.codegen import render_expr

X = Expr.input(0)
#: name -> f(x) as capture writes each function.
FUNCTIONS = {
    "erf": Expr.apply("erf", X),
    "sin": Expr.apply("sin", X),
    "cos": Expr.apply("cos", X),
    "silu": Expr.apply("silu", X),
    "gelu": Expr.apply("gelu", X),
    "gelu_tanh": Expr.apply("gelu_tanh", X),
    "softplus": Expr.apply("softplus", X),
    "elu": Expr.apply("elu", X, 1.3),
    "clamp_min": Expr.apply("clamp_min", X, -0.5),
    "clamp_max": Expr.apply("clamp_max", X, 6.0),
    "ge": Expr.apply("ge", X, 0.5),
    "where": Expr.apply("where", Expr.apply("ge", 1.0, X), X * X, Expr.apply("sigmoid", X)),
    "where_mask": Expr.apply("where", Expr.apply("gt", X, -1.0) * Expr.apply("gt", 6.0, X), X, -X),
    "sign": Expr.apply("gt", X, 0.0) - Expr.apply("gt", 0.0, X),
}
SPECIAL = (0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 6.0, 20.0, 20.5, -20.0, 30.0, -30.0, 88.0, -88.0, 100.0, -100.0)
SPECIAL += (1e-4, -1e-4, math.inf, -math.inf, math.nan)


def _chain(num_edges: int, device) -> ug.GraphTensor:
    return ug.GraphTensor.from_edge_index(torch.arange(num_edges + 1).unfold(0, 2, 1).t().contiguous().to(device))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_special_values_are_torch(name, device):
    """Per-edge values of the function (a message op) equal torch's elementwise in float32 and
    float64, NaN and infinities where torch has them. Torch's float32 values are its float64 ones
    rounded: its vectorised float32 CPU functions vary with the processor (GELU of +inf came out
    NaN on a machine with AVX-512, +inf on others)."""
    for dtype in (torch.float32, torch.float64):
        values = torch.tensor(SPECIAL, dtype=dtype)
        graph = _chain(len(SPECIAL), device)
        op = OpInfo(FUNCTIONS[name], None, operands=("edge",))
        ours = ug.compute(graph, op, operands=[values.view(-1, 1).to(device)]).cpu().view(-1)
        expected = reference.evaluate(FUNCTIONS[name], [values.double()]).expand_as(values).to(dtype)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(ours, expected, rtol=tolerance, atol=tolerance, equal_nan=True, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gather", ["sum", "max", None])
@pytest.mark.parametrize("case", ["hub", "isolated", "empty"])
def test_functions_in_every_dtype(case, gather, dtype, device, graph_factory, check_close):
    """All the functions in one edge function, gathered or per edge, against the reference
    executor (half precision is computed in float32 by both), on a hub, on isolated vertices and
    on a graph without edges."""
    terms = [expr.remap({0: i % 2}) * Expr.input(2) for i, expr in enumerate(FUNCTIONS.values())]
    expr = terms[0]
    for term in terms[1:]:
        expr = expr + term
    op = OpInfo(expr, gather, operands=("src_v", "edge", "dst_v"))
    graph = graph_factory(case)
    generator = torch.Generator().manual_seed(0)
    rows = (graph.num_src, graph.num_edges, graph.num_dst)
    operands = [(torch.randn(r, 8, generator=generator) * 2).to(dtype) for r in rows]
    ours = ug.compute(graph, op, operands=[t.to(device) for t in operands]).cpu()
    check_close(ours, reference.execute(graph, op, operands), dtype, f"gather {gather}")


def test_where_renders_its_comparison_as_the_condition():
    """A comparison condition is the boolean itself; any other condition is tested against 0."""
    compared = Expr.apply("where", Expr.apply("gt", X, 0.5), X, Expr.apply("neg", X))
    assert render_expr(compared, ["a"], "tl.float32") == "tl.where((a > 0.5), a, (-a))"
    product = Expr.apply("where", Expr.apply("ge", X, 0.0) * Expr.apply("eq", X, 1.0), X, 0.0)
    text = render_expr(product, ["a"], "tl.float32")
    assert text.startswith("tl.where(((tl.where(a >= 0.0, 1.0, 0.0) * tl.where(a == 1.0, 1.0, 0.0)) != 0.0), a")
    wide = render_expr(compared, ["a"], "tl.float64")
    assert wide == "tl.where((a > tl.full([], 0.5, tl.float64)), a, (-a))"


def test_kernel_keys_read_back_every_function():
    """Kernel specs carry the edge function as :meth:`Expr.serialize` text, read back by
    :func:`parse_expr`; a parameter must stay a constant."""
    for name, expr in FUNCTIONS.items():
        assert parse_expr(expr.serialize()) == expr, name
    with pytest.raises(ValueError, match="second argument of elu"):
        Expr("elu", (X, X))
    with pytest.raises(ValueError, match="'where' takes 3 arguments"):
        Expr("where", (X, X))
