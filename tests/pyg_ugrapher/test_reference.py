"""The reference executor, the oracle of every other test, against a naive per-edge Python loop for
the IR's full op matrix, in float32, float16 and bfloat16."""

import itertools
from typing import List, Sequence

import pytest
import torch

from pyg_ugrapher import reference
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import GATHER_OPS, Expr, OpInfo
from pyg_ugrapher.layout import infer_layout

TARGETS = ("u", "v", "e")
NAMES = (
    [f"copy_{t}_{g}" for g in GATHER_OPS for t in TARGETS]
    + [
        f"{a}_{op}_{b}_{g}"
        for g in GATHER_OPS
        for a, b in itertools.product(TARGETS, repeat=2)
        for op in ("add", "sub", "mul", "div")
    ]
    + [f"copy_{t}" for t in TARGETS]
    + [f"{a}_{op}_{b}" for a, b in itertools.product(TARGETS, repeat=2) for op in ("add", "sub", "mul", "div", "dot")]
)
GRAPHS = ("mixed", "bipartite", "hub", "empty")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FNS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def naive(graph: GraphTensor, op: OpInfo, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    """The op as its definition reads: one message per edge, then one reduction per destination,
    in float64, in plain Python loops."""
    src, dst = graph.src.tolist(), graph.dst.tolist()
    messages: List[torch.Tensor] = []
    for e in range(graph.num_edges):
        row = {"src_v": src[e], "dst_v": dst[e], "edge": e}
        values = [t[row[kind]].double() for kind, t in zip(op.inputs, operands)]
        if op.edge_op == "copy_lhs":
            message = values[0]
        elif op.edge_op == "dot":
            message = (values[0] * values[1]).sum(-1, keepdim=True)
        else:
            message = FNS[op.edge_op](values[0], values[1])
        messages.append(message)
    if op.gather_op is None:
        return torch.stack(messages) if messages else None
    shape = infer_layout(op, [t.shape for t in operands]).out_shape
    out = torch.zeros((graph.num_dst,) + shape, dtype=torch.float64)
    for v in range(graph.num_dst):
        incoming = [m for m, d in zip(messages, dst) if d == v]
        if not incoming:
            continue
        total = incoming[0]
        for m in incoming[1:]:
            total = {"sum": torch.add, "mean": torch.add, "max": torch.maximum, "min": torch.minimum}[op.gather_op](
                total, m
            )
        out[v] = total / len(incoming) if op.gather_op == "mean" else total
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_matches_naive_loop(name, dtype, graph_factory, operand_factory, operand_shapes, check_close):
    op = OpInfo.from_name(name)
    shapes = operand_shapes(op)
    for i, case in enumerate(GRAPHS):
        graph = graph_factory(case, seed=i)
        shape = shapes[(NAMES.index(name) + i) % len(shapes)]
        operands = operand_factory(graph, op, shape, dtype, seed=i)
        out = reference.execute(graph, op, operands)
        expected = naive(graph, op, operands)
        if expected is None:  # message creation on a graph without edges
            layout = infer_layout(op, [t.shape for t in operands])
            assert out.shape == (0,) + layout.out_shape and out.dtype == dtype
            continue
        check_close(out, expected.to(dtype), dtype, f"{name} on {case} with {shape} operands")


@pytest.mark.parametrize("gather", GATHER_OPS)
@pytest.mark.parametrize("case", ["isolated", "bipartite", "mixed", "empty"])
def test_isolated_vertices_get_zero(case, gather, graph_factory, operand_factory, isolated):
    graph = graph_factory(case)
    for name in (f"copy_u_{gather}", f"u_mul_e_{gather}", f"e_sub_v_{gather}"):
        op = OpInfo.from_name(name)
        out = reference.execute(graph, op, operand_factory(graph, op))
        assert isolated(graph).any()
        assert torch.equal(out[isolated(graph)], torch.zeros_like(out[isolated(graph)]))
        assert (out[~isolated(graph)] != 0).all()


def test_half_inputs_accumulate_in_float32():
    # 3000 ones into one vertex: a float16 running sum would stop at 2048.
    graph = GraphTensor.from_edge_index(
        torch.stack([torch.arange(3000), torch.zeros(3000, dtype=torch.int64)]), (3000, 1)
    )
    x = torch.ones(3000, 2, dtype=torch.float16)
    out = reference.execute(graph, OpInfo.from_name("copy_u_sum"), [x])
    assert out.dtype == torch.float16 and out.tolist() == [[3000.0, 3000.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_gradients_round_once(dtype, device):
    """The gradient of a gathered half-type operand is summed in float32 and rounded once (on a
    GPU, a gather in the half type has a backward that rounds at every one of a hub's atomic
    additions, in no fixed order)."""
    num_edges = 4000
    graph = GraphTensor(torch.zeros(num_edges, dtype=torch.long), torch.arange(num_edges) % 2, 1, 2)
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 3, generator=generator, dtype=torch.float64) + 1).to(device)
    weight = (torch.rand(num_edges, 3, generator=generator, dtype=torch.float64) + 1).to(device)
    op = OpInfo.from_name("u_mul_e")
    found = {}
    for wanted in (dtype, torch.float64):
        x_in = x.to(wanted).requires_grad_()
        reference.execute(graph, op, [x_in, weight.to(wanted)]).backward(
            torch.ones(num_edges, 3, dtype=wanted, device=device)
        )
        found[wanted] = x_in.grad
    # Each gradient is a sum of 4000 weights: one rounding of it is within half an ulp.
    assert torch.equal(found[dtype], found[torch.float64].to(dtype))


def test_mixed_dtypes_promote():
    graph = GraphTensor.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    x = torch.randn(2, 3, dtype=torch.float16)
    w = torch.randn(2, 3, dtype=torch.float64)
    out = reference.execute(graph, OpInfo.from_name("u_mul_e_sum"), [x, w])
    assert out.dtype == torch.float64
    assert torch.allclose(out, (x.double() * w).flip(0))


def test_expression_op_matches_loop(graph_factory):
    graph = graph_factory("mixed")
    x, w, a = Expr.input(0), Expr.input(1), Expr.input(2)
    op = OpInfo(Expr.apply("leaky_relu", x * w + Expr.apply("exp", a), 0.2), "max", operands=("src_v", "edge", "dst_v"))
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(graph.num_src, 4, generator=gen)
    ws = torch.randn(graph.num_edges, 4, generator=gen)
    vs = torch.randn(graph.num_dst, 1, generator=gen)
    out = reference.execute(graph, op, [xs, ws, vs])
    message = torch.nn.functional.leaky_relu(xs[graph.src] * ws + vs[graph.dst].exp(), 0.2)
    for v in range(graph.num_dst):
        into = message[graph.dst == v]
        expected = into.max(0).values if len(into) else torch.zeros(4)
        assert torch.allclose(out[v], expected)
