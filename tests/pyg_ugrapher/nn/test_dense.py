"""The layers' dense steps (``pyg_ugrapher.nn._dense``): the matrix-vector bias gradient equals
autograd's sum, a root term added in a GEMM's epilogue equals the modules' sum, the plain paths
are kept where they must be, and every layer that uses them still matches PyG with them switched
on for small graphs."""
import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_ugrapher.nn as ug_nn
from pyg_ugrapher.nn import _dense


def _grads(fn, out, bias):
    out = out.detach().requires_grad_()
    bias = bias.detach().requires_grad_()
    result = fn(out, bias)
    probe = torch.randn(result.shape, generator=torch.Generator().manual_seed(1))
    return (result,) + torch.autograd.grad((result * probe).sum(), (out, bias))


@pytest.mark.parametrize("shape", [(_dense.MIN_ROWS, 8), (3, _dense.MIN_ROWS // 2, 4)], ids=["2d", "3d"])
def test_add_bias_gradient_is_the_row_sum(shape, check_close):
    generator = torch.Generator().manual_seed(0)
    out, bias = torch.randn(shape, generator=generator), torch.randn(shape[-1], generator=generator)
    ours = _grads(_dense.add_bias, out, bias)
    plain = _grads(lambda o, b: o + b, out, bias)
    assert ours[0].grad_fn.name().endswith("_AddBiasBackward")
    for a, b in zip(ours, plain):
        check_close(a, b)


def test_plain_sum_where_the_product_does_not_pay_or_apply():
    """Small outputs, a bias without gradient, no grad mode, dtype mismatch: ``out + bias``."""
    big, small = torch.randn(_dense.MIN_ROWS, 4), torch.randn(8, 4)
    bias = torch.randn(4, requires_grad=True)
    assert _dense.add_bias(small, bias).grad_fn.name() == "AddBackward0"
    assert _dense.add_bias(big, bias.detach()).grad_fn is None
    with torch.no_grad():
        assert _dense.add_bias(big, bias).grad_fn is None
    assert _dense.add_bias(big.double(), bias).dtype == torch.float64


@pytest.mark.parametrize("make", [lambda: torch.nn.Linear(6, 5), lambda: pyg_nn.Linear(6, 5),
                                  lambda: pyg_nn.Linear(6, 5, bias=False)], ids=["torch", "pyg", "no_bias"])
def test_linear_equals_the_module(make, check_close, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ROWS", 1)
    torch.manual_seed(0)
    lin = make()
    x = torch.randn(20, 6, requires_grad=True)
    ours, theirs = _dense.linear(lin, x), lin(x)
    check_close(ours, theirs)
    params = [x] + list(lin.parameters())
    for a, b in zip(torch.autograd.grad(ours.square().sum(), params), torch.autograd.grad(theirs.square().sum(), params)):
        check_close(a, b)


def test_linear_keeps_lazy_modules_and_autocast():
    """A lazy ``Linear`` initialises through its own forward; under autocast the module's dtype
    (bias included) is kept."""
    lazy = pyg_nn.Linear(-1, 5)
    out = _dense.linear(lazy, torch.randn(7, 3))
    assert out.shape == (7, 5) and lazy.weight.shape == (5, 3)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(_dense.MIN_ROWS, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _dense.linear(lin, x).dtype == lin(x).dtype == torch.bfloat16


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("make", [torch.nn.Linear, pyg_nn.Linear], ids=["torch", "pyg"])
def test_linear_sum_equals_the_modules(make, bias, check_close, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ROWS", 1)
    torch.manual_seed(0)
    lin, root = make(6, 5, bias=bias), make(3, 5, bias=False)
    x, root_x = torch.randn(20, 6, requires_grad=True), torch.randn(20, 3, requires_grad=True)
    ours, theirs = _dense.linear_sum(lin, x, root, root_x), lin(x) + root(root_x)
    assert ours.grad_fn.name().endswith("_LinearSumBackward")
    check_close(ours, theirs)
    params = [x, root_x] + list(lin.parameters()) + list(root.parameters())
    probe = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(torch.autograd.grad((ours * probe).sum(), params),
                    torch.autograd.grad((theirs * probe).sum(), params)):
        check_close(a, b)


def test_linear_sum_keeps_the_modules_where_it_does_not_apply():
    """Few rows, a root with a bias, a lazy map, autocast: the modules' own sum."""
    torch.manual_seed(0)
    lin, root = torch.nn.Linear(6, 5), torch.nn.Linear(3, 5, bias=False)
    x, root_x = torch.randn(_dense.MIN_ROWS, 6), torch.randn(_dense.MIN_ROWS, 3)
    assert _dense.linear_sum(lin, x, root, root_x).grad_fn.name().endswith("_LinearSumBackward")
    assert _dense.linear_sum(lin, x[:8], root, root_x[:8]).grad_fn.name() == "AddBackward0"
    assert _dense.linear_sum(lin, x, torch.nn.Linear(3, 5), root_x).grad_fn.name() == "AddBackward0"
    lazy = pyg_nn.Linear(-1, 5, bias=False)
    assert _dense.linear_sum(lin, x, lazy, root_x).shape == (_dense.MIN_ROWS, 5) and lazy.weight.shape == (5, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _dense.linear_sum(lin, x, root, root_x).dtype == torch.bfloat16


LAYERS = [
    ("GCNConv", lambda ns: ns.GCNConv(6, 4)),
    ("GATConv", lambda ns: ns.GATConv(6, 4, heads=2)),
    ("SAGEConv", lambda ns: ns.SAGEConv(6, 4)),
    ("GraphConv", lambda ns: ns.GraphConv(6, 4, aggr="max")),
]


@pytest.mark.parametrize("name,make", LAYERS, ids=[name for name, _ in LAYERS])
def test_layers_with_the_product_match_pyg(name, make, compare, small_graph, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ROWS", 1)
    applied = []
    for function in (_dense._AddBias, _dense._LinearSum):
        monkeypatch.setattr(function, "apply",
                            lambda *args, apply=function.apply: applied.append(1) or apply(*args))
    x, edge_index = small_graph
    torch.manual_seed(0)
    compare(make(ug_nn), make(pyg_nn), lambda layer, x: layer(x, edge_index), [x], train=True)
    assert applied

