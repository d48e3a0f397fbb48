"""Derivatives of the elementwise functions beyond the arithmetic core (clamps, comparisons and
``where``, GELU, SiLU, ELU, softplus, sine, cosine, erf): the symbolic rules of
:meth:`~pyg_ugrapher.ir.Expr.grad` against torch's autograd, kinks and NaN included, and the
backward operators they make through the kernels (gradcheck in float64, half precision)."""

import math

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import Expr, OpInfo
from pyg_ugrapher.parallel import STRATEGIES


def _where(condition: Expr, a, b) -> Expr:
    return Expr.apply("where", condition, a, b)


def _hardtanh(x: Expr, low: float, high: float) -> Expr:
    return _where(Expr.apply("ge", low, x), low, _where(Expr.apply("ge", x, high), high, x))


#: name -> f(x) over an expression, as capture writes each function (torch's equivalent beside it).
FUNCTIONS = {
    "erf": lambda x: Expr.apply("erf", x),
    "sin": lambda x: Expr.apply("sin", x),
    "cos": lambda x: Expr.apply("cos", x),
    "silu": lambda x: Expr.apply("silu", x),
    "gelu": lambda x: Expr.apply("gelu", x),
    "gelu_tanh": lambda x: Expr.apply("gelu_tanh", x),
    "softplus": lambda x: Expr.apply("softplus", x),
    "elu": lambda x: Expr.apply("elu", x, 0.7),
    "clamp": lambda x: Expr.apply("clamp_max", Expr.apply("clamp_min", x, -0.5), 1.0),
    "hardtanh": lambda x: _hardtanh(x, -0.5, 1.0),
    "sign": lambda x: (Expr.apply("gt", x, 0.0) - Expr.apply("gt", 0.0, x)) * x,
    "where": lambda x: _where(Expr.apply("gt", x, 0.5), x * x, Expr.apply("sigmoid", x)),
    "mask": lambda x: Expr.apply("ge", x, 0.5) * x + Expr.apply("ge", -0.5, x),
}
#: Points where the functions above bend, saturate or switch branch, and NaN.
SPECIAL = (0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 20.0, 21.0, -30.0, math.nan)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_derivative_rules_are_torch(name):
    """``d f(x^2 - x) / dx`` from :meth:`Expr.grad`, evaluated with torch, equals torch's autograd
    through ``f`` elementwise in float64, at the special points (ties at kinks and bounds, NaN) too."""
    x = torch.cat([torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3])
    x = torch.cat([x, torch.tensor(SPECIAL, dtype=torch.float64)])
    expr = FUNCTIONS[name](Expr.input(0))
    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(reference.evaluate(expr, [leaf]).sum(), leaf)
    ours = reference.evaluate(expr.grad(0), [x]).expand_as(x)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12, equal_nan=True)
    # Through an inner function: the chain rule, and the kinks reached at other inputs.
    inner = Expr.apply("square", Expr.input(0)) - Expr.input(0)
    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(reference.evaluate(FUNCTIONS[name](inner), [leaf]).sum(), leaf)
    ours = reference.evaluate(FUNCTIONS[name](inner).grad(0), [x]).expand_as(x)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_where_does_not_differentiate_the_branch_it_does_not_pick():
    """``where(x > 0, log(x), 0)`` has derivative 0 at 0, where torch's autograd gives NaN."""
    expr = _where(Expr.apply("gt", Expr.input(0), 0.0), Expr.apply("log", Expr.input(0)), 0.0)
    x = torch.tensor([0.0, 2.0], dtype=torch.float64)
    assert torch.equal(reference.evaluate(expr.grad(0), [x]), torch.tensor([0.0, 0.5], dtype=torch.float64))


def test_derivatives_of_constant_branches_vanish():
    x = Expr.input(0)
    assert _where(Expr.apply("gt", x, 0.0), 1.0, 2.0).grad(0) == Expr.const(0.0)
    assert (Expr.apply("ge", x, 1.0) - Expr.apply("gt", 1.0, x)).grad(0) == Expr.const(0.0)
    assert Expr.apply("clamp_min", Expr.input(1), 0.0).grad(0) == Expr.const(0.0)


def _op(name: str, gather) -> OpInfo:
    """``f(u0 * e1) * v2``: source, edge and destination gradients."""
    expr = FUNCTIONS[name](Expr.input(0) * Expr.input(1)) * Expr.input(2)
    return OpInfo(expr, gather, operands=("src_v", "edge", "dst_v"))


def _operands(graph, dtype, device, seed):
    generator = torch.Generator().manual_seed(seed)
    rows = (graph.num_src, graph.num_edges, graph.num_dst)
    values = [torch.rand(r, 3, generator=generator, dtype=torch.float64) * 4 - 2 for r in rows]
    return [t.to(device=device, dtype=dtype) for t in values]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_gradcheck_through_the_kernels(name, device, graph_factory):
    """float64 gradcheck of a gather and of a message op using the function, one strategy each."""
    graph = graph_factory("tiny")
    index = sorted(FUNCTIONS).index(name)
    for k, gather in enumerate(("sum", None)):
        strategy = STRATEGIES[(index + k) % len(STRATEGIES)]
        operands = [t.requires_grad_() for t in _operands(graph, torch.float64, device, seed=index)]
        op = _op(name, gather)
        info = ug.ParallelInfo(strategy, block_f=4)
        assert torch.autograd.gradcheck(
            lambda *xs: ug.compute(graph, op, operands=xs, parallel_info=info),
            operands,
            fast_mode=True,
            atol=1e-7,
            rtol=1e-5,
        ), f"{name} with gather {gather} under {strategy}"


def _grads(fn, operands):
    leaves = [t.detach().clone().requires_grad_() for t in operands]
    out = fn(*leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad((out * probe).sum(), leaves, allow_unused=True, materialize_grads=True)
    return [out.detach()] + list(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_gradients_through_the_kernels_equal_the_reference(name, dtype, device, graph_factory, check_close):
    """Outputs and gradients through the kernels against torch's autograd through the reference
    executor (which computes half precision in float32, as the kernels do)."""
    graph = graph_factory("mixed")
    op = _op(name, "mean")
    operands = _operands(graph, dtype, device, seed=7)
    ours = _grads(
        lambda *xs: ug.compute(graph, op, operands=xs, parallel_info=ug.ParallelInfo("edge", block_f=4)), operands
    )
    theirs = _grads(lambda *xs: reference.execute(graph, op, xs), operands)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        check_close(a, b, dtype, f"{name} in {dtype}, tensor {k}")
