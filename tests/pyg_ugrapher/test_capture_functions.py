"""Capture of the elementwise functions beyond the arithmetic core: clamps, comparisons and
``torch.where``, GELU, SiLU, ELU, softplus, sine and cosine, sign and erf. Each captured message
computes torch's values and gradients (ties at kinks and bounds included), through the reference
executor and through the Triton kernels, and through ``ug.MessagePassing`` against PyG's own."""

import types

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import MessagePassing as PyGMessagePassing

import pyg_ugrapher as ug
from pyg_ugrapher.capture import Argument, CaptureError, capture
from pyg_ugrapher.ir import Expr

from ..conftest import TOLERANCE, relative_error

NUM_NODES, NUM_EDGES, FEATURES = 50, 300, 8
#: Values placed in the node features: the kinks and bounds of the messages below (``relu6(4 x)``
#: bends at 0 and 1.5, ``softplus(x, beta=2, threshold=1)`` at 0.5, the clamps at +-0.5 and +-1),
#: where torch's derivative rules decide the gradient.
KINKS = (0.0, 0.5, -0.5, 1.0, -1.0, 0.25, 1.5)

#: name -> message(x_i, x_j, w) with ``x_*`` of [E, F] and ``w`` of [E].
MESSAGES = {
    "clamp": lambda x_i, x_j, w: torch.clamp(x_j, -0.5, 0.5) + x_i.clamp(min=0) * w.view(-1, 1),
    "clip_min_max": lambda x_i, x_j, w: (
        torch.clip(x_j - x_i, max=0.5) + x_j.clamp_max(1.0) - torch.clamp_min(x_i, -1) + x_j.clip(-1, 1)
    ),
    "where": lambda x_i, x_j, w: torch.where(x_j > x_i, x_j * w.view(-1, 1), x_i) + torch.where(x_j <= 0.5, 1.0, x_j),
    "where_lt_ge": lambda x_i, x_j, w: (
        torch.where(x_j < 0, -x_j, 2 * x_i) * x_i.where(x_i >= 1, 0.0) + torch.where(0.25 >= x_j, x_j, x_i)
    ),
    "masks": lambda x_i, x_j, w: x_j * (x_j > 0) + (x_i <= x_j).to(x_i.dtype) * x_i - x_j * (x_j == 1),
    "logical": lambda x_i, x_j, w: torch.where(((x_j > -0.5) & (x_j < 0.5)) | ~(x_i != 0), x_j, x_i * w.view(-1, 1)),
    "gelu": lambda x_i, x_j, w: F.gelu(x_j) + F.gelu(x_i * w.view(-1, 1), approximate="tanh"),
    "silu": lambda x_i, x_j, w: F.silu(x_j) * w.view(-1, 1) + F.silu(x_i),
    "elu": lambda x_i, x_j, w: F.elu(x_j) + F.elu(x_i - x_j, alpha=0.5) + F.elu(x_j, 2.0),
    "softplus": lambda x_i, x_j, w: F.softplus(x_j) + F.softplus(x_i, beta=2.0, threshold=1.0) + F.softplus(x_j * 30),
    "sin_cos": lambda x_i, x_j, w: torch.sin(x_j) * torch.cos(x_i) + x_j.sin() * w.view(-1, 1),
    "sign": lambda x_i, x_j, w: torch.sign(x_j) * x_i + x_j.sign() - torch.sign(x_i - x_j) * x_j,
    "relu6_hardtanh": lambda x_i, x_j, w: F.relu6(x_j * 4) + F.hardtanh(x_i) + F.hardtanh(x_j, -0.5, 0.25),
    "erf": lambda x_i, x_j, w: torch.erf(x_j) * x_i + torch.special.erf(x_i * w.view(-1, 1)),
}


def node_features(seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random features in which every value of :data:`KINKS` occurs."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_NODES, FEATURES, generator=generator)
    spots = torch.randperm(x.numel(), generator=generator)[: 3 * len(KINKS)]
    x.view(-1)[spots] = torch.tensor(KINKS).repeat(3)
    return x.to(dtype)


def edge_index(seed: int) -> torch.Tensor:
    """Random edges; the last vertex receives none."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack(
        [
            torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=generator),
            torch.randint(0, NUM_NODES - 1, (NUM_EDGES,), generator=generator),
        ]
    )


def trace(message, dtype: torch.dtype):
    def argument(*features, kind):
        return Argument((NUM_EDGES,) + features, dtype, torch.device("cpu"), True, kind)

    arguments = {
        "x_i": argument(FEATURES, kind="dst_v"),
        "x_j": argument(FEATURES, kind="src_v"),
        "w": argument(kind="edge"),
    }
    return capture(lambda x_i, x_j, w: message(x_i, x_j, w), arguments, NUM_EDGES, "sum")


def gradients(fn, tensors, seed: int = 0):
    """``fn(*tensors)`` and the gradients of ``sum(fn(*tensors) * probe)`` for a random probe."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    grads = torch.autograd.grad((out * probe).sum(), leaves, allow_unused=True, materialize_grads=True)
    return [out.detach()] + list(grads)


# -- what each function is captured as -------------------------------------------------------------
def test_parametrized_functions_keep_their_parameters():
    x = Expr.input(0)
    cases = {
        lambda a: F.elu(a, alpha=0.3): Expr.apply("elu", x, 0.3),
        lambda a: F.gelu(a, approximate="tanh"): Expr.apply("gelu_tanh", x),
        lambda a: F.softplus(a): Expr.apply("softplus", x),
        lambda a: torch.clamp(a, -2, 3): Expr.apply("clamp_max", Expr.apply("clamp_min", x, -2.0), 3.0),
        lambda a: a.clip(max=3): Expr.apply("clamp_max", x, 3.0),
        lambda a: torch.where(a < 1, a, 0.0): Expr.apply("where", Expr.apply("gt", 1.0, x), x, 0.0),
        lambda a: torch.sign(a): Expr.apply("gt", x, 0.0) - Expr.apply("gt", 0.0, x),
    }
    for message, expected in cases.items():
        result = capture(
            lambda x_j: message(x_j),
            {"x_j": Argument((4, 3), torch.float32, torch.device("cpu"), False, "src_v")},
            4,
            "sum",
        )
        assert result.op.expr == expected, result.op.name


def test_relu6_is_a_clamp_with_hardtanh_ties():
    result = trace(lambda x_i, x_j, w: F.relu6(x_j), torch.float32)
    assert result.op.name == "where(ge(0, u0), 0, where(ge(u0, 6), 6, u0))_sum"


# -- what the captured ops compute -----------------------------------------------------------------
def _run_captured(result, index):
    graph = ug.GraphTensor.from_edge_index(index, NUM_NODES)

    def run(x, w):
        tensors = {"x_i": x, "x_j": x, "w": w}
        operands = [operand.build(tensors[operand.argument]) for operand in result.operands]
        return ug.compute(graph, result.op, operands=operands)

    return run


def _run_message(message, index):
    def run(x, w):
        src, dst = index
        out = message(x[dst], x[src], w)
        return torch.zeros((x.size(0),) + out.shape[1:], dtype=out.dtype).index_add(0, dst, out)

    return run


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_reference_executor_computes_torch(name, dtype):
    """Values and gradients of the captured op (its backward made of IR operators) against torch's
    autograd through message() on gathered tensors; half precision against torch in float32 from
    the same inputs."""
    index = edge_index(1)
    x = node_features(2, dtype)
    w = torch.rand(NUM_EDGES, generator=torch.Generator().manual_seed(3)).to(dtype) + 0.5
    result = trace(MESSAGES[name], dtype)
    ours = gradients(_run_captured(result, index), [x, w])
    exact = torch.float64 if dtype == torch.float64 else torch.float32
    theirs = gradients(_run_message(MESSAGES[name], index), [x.to(exact), w.to(exact)])
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == dtype
        error = relative_error(a, b)
        assert error <= TOLERANCE[dtype], f"{name}: tensor {k}, relative error {error:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_compares_with_numbers_rounded_as_torch(dtype):
    """torch compares a half-precision tensor with a Python number rounded to its dtype; the kernels
    compare in float32, so capture rounds comparands and bounds: the value equal to the rounded
    number picks torch's branch and torch's clamp gradient."""
    rounded = torch.tensor(0.3, dtype=dtype)
    assert rounded.item() != 0.3

    def message(x_i, x_j, w):
        return torch.where(x_j > 0.3, x_j, -x_j) + x_j.clamp(max=0.3) * 2 + F.hardtanh(x_j, -1.0, 0.3) * 4

    index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.stack([rounded, rounded + 0.125, rounded - 0.125]).view(3, 1).expand(3, FEATURES).contiguous()
    w = torch.ones(3, dtype=dtype)
    arguments = {
        "x_i": Argument((3, FEATURES), dtype, torch.device("cpu"), True, "dst_v"),
        "x_j": Argument((3, FEATURES), dtype, torch.device("cpu"), True, "src_v"),
        "w": Argument((3,), dtype, torch.device("cpu"), True, "edge"),
    }
    result = capture(message, arguments, 3, "sum")
    graph = ug.GraphTensor.from_edge_index(index, 3)

    def run(x, w):
        tensors = {"x_i": x, "x_j": x, "w": w}
        return ug.compute(graph, result.op, operands=[o.build(tensors[o.argument]) for o in result.operands])

    ours = gradients(run, [x, w])
    theirs = gradients(_run_message(message, index), [x, w])
    for a, b in zip(ours, theirs):
        assert relative_error(a, b) <= TOLERANCE[dtype]


# -- through ug.MessagePassing, against PyG --------------------------------------------------------
def _module(base, message, aggr):
    def forward(self, x, edge_index, w):
        return self.propagate(edge_index, x=x, w=w)

    def body(self, x_i, x_j, w):
        return message(x_i, x_j, w)

    method = types.FunctionType(body.__code__, body.__globals__, "message", None, body.__closure__)
    return type(f"Functions{base.__name__}", (base,), {"forward": forward, "message": method})(aggr=aggr)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_passing_matches_pyg(name, executor):
    """A user layer whose message() uses the function is captured into one fused op and gives
    PyG's outputs and gradients (features and edge weights) in float32."""
    aggr = {"gelu": "max", "silu": "min", "elu": "mean"}.get(name, "sum")
    ours, theirs = _module(ug.MessagePassing, MESSAGES[name], aggr), _module(PyGMessagePassing, MESSAGES[name], aggr)
    index = edge_index(4)
    x = node_features(5)
    w = torch.rand(NUM_EDGES, generator=torch.Generator().manual_seed(6)) + 0.5
    mine = gradients(lambda x, w: ours(x, index, w), [x, w], seed=1)
    assert ours.fallback_reason is None and ours.capture is not None, ours.fallback_reason
    ref = gradients(lambda x, w: theirs(x, index, w), [x, w], seed=1)
    for what, a, b in zip(("output", "d x", "d w"), mine, ref):
        error = relative_error(a, b)
        assert error <= TOLERANCE[torch.float32], f"{name} ({executor}): {what}, relative error {error:.3g}"


# -- what is still not captured ----------------------------------------------------------------------
UNSUPPORTED = {
    "selu": (lambda a, b: F.selu(a), "torch.nn.functional.selu"),
    "log1p": (lambda a, b: torch.log1p(a), "torch.log1p"),
    "mish": (lambda a, b: F.mish(a), "torch.nn.functional.mish"),
    "bitwise and of floats": (lambda a, b: a & b, "torch.Tensor.__and__"),
    "tensor bound": (lambda a, b: a.clamp(min=b), "torch.Tensor.clamp with a min bound that is not a Python number"),
    "no bound": (lambda a, b: torch.clamp(a), "without a bound"),
    "gelu approximation": (lambda a, b: F.gelu(a, approximate="erf"), "approximate='erf'"),
    "elu alpha tensor": (lambda a, b: F.elu(a, alpha=torch.ones(1)), "elu with an alpha"),
    "hardtanh bounds": (lambda a, b: F.hardtanh(a, 1.0, -1.0), "min_val 1.0 above max_val -1.0"),
    "float condition": (lambda a, b: torch.where(a, a, b), "condition that is not a comparison"),
    "where of integers": (lambda a, b: torch.where(a > b, 1, 0) * a, "Python integers (or booleans) for both values"),
    "mask alone": (lambda a, b: (a > 0) + 1.0, "comparison result (a boolean tensor) on its own"),
    "activation of a mask": (lambda a, b: torch.exp(a > b), "comparison result"),
    "returned mask": (lambda a, b: a > b, "returns a comparison result"),
    "where as nonzero": (lambda a, b: torch.where(a > b)[0], "torch.where with 1 arguments"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_functions_say_why(case):
    message, expected = UNSUPPORTED[case]
    arguments = {
        "a": Argument((9, 4), torch.float32, torch.device("cpu"), False, "src_v"),
        "b": Argument((9, 4), torch.float32, torch.device("cpu"), False, "edge"),
    }
    with pytest.raises(CaptureError) as error:
        capture(message, arguments, 9, "sum")
    reason = str(error.value)
    assert expected in reason and reason.startswith("message() ") and "\n" not in reason
