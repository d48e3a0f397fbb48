"""The backward pass, itself made of IR operators: gradcheck in float64 for every op of the IR
through the kernels (the Triton interpreter on a CPU), gradient parity with the reference
executor's autograd under every strategy, the tie rule of max/min, and the table of docs/backward.md."""

import itertools
import math
import re
from pathlib import Path

import pytest
import torch

import pyg_ugrapher as ug
import triton_kernels
from pyg_ugrapher import reference
from pyg_ugrapher.backward import backward_table, derive, describe, on_reversed
from pyg_ugrapher.ir import GATHER_OPS, Expr, OpInfo
from pyg_ugrapher.parallel import STRATEGIES

TARGETS = ("u", "v", "e")
PAIRS = list(itertools.product(TARGETS, repeat=2))
NAMES = (
    [f"copy_{t}_{g}" for g in GATHER_OPS for t in TARGETS]
    + [f"{a}_{op}_{b}_{g}" for g in GATHER_OPS for a, b in PAIRS for op in ("add", "sub", "mul", "div")]
    + [f"copy_{t}" for t in TARGETS]
    + [f"{a}_{op}_{b}" for a, b in PAIRS for op in ("add", "sub", "mul", "div", "dot")]
)
BACKWARD_DOC = Path(__file__).resolve().parents[2] / "docs" / "backward.md"


def small_schedule(strategy: str, operands) -> ug.ParallelInfo:
    """Blocks smaller than the test graphs' hub rows and edge counts, so that chunks, blocks and
    atomics all take part (the template tests sweep smaller ones); feature tiles of at most 8,
    within the operands' width."""
    knobs = {
        "vertex": dict(block_v=2, block_e=4),
        "edge": dict(block_e=8),
        "group": dict(group_size=4, block_v=2, block_e=4),
    }[strategy]
    width = max(math.prod(t.shape[1:]) for t in operands)
    return ug.ParallelInfo(strategy, block_f=min(8, 1 << max(width - 1, 0).bit_length()), **knobs)


def grads(fn, operands, probe_seed=0):
    """``fn(*operands)`` and the gradients of ``sum(fn(*operands) * probe)`` for a random probe."""
    leaves = [t.detach().clone().requires_grad_() for t in operands]
    out = fn(*leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(probe_seed), dtype=torch.float64)
    torch.autograd.backward(out, (probe.to(out))) if out.numel() else None
    return [out.detach()] + [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name, device, graph_factory, operand_factory, operand_shapes):
    """Every op, float64, one strategy each (cycling), through the kernels."""
    op = OpInfo.from_name(name)
    index = NAMES.index(name)
    strategy = STRATEGIES[index % len(STRATEGIES)]
    shapes = operand_shapes(op)
    graph = graph_factory("tiny")
    operands = [
        t.requires_grad_()
        for t in operand_factory(graph, op, shapes[index % len(shapes)], torch.float64, seed=index, device=device)
    ]
    info = small_schedule(strategy, operands)
    assert torch.autograd.gradcheck(
        lambda *xs: ug.compute(graph, op, *xs, parallel_info=info), operands, fast_mode=True, atol=1e-7, rtol=1e-5
    )


PARITY_GATHER = [
    "copy_u_sum",
    "copy_e_mean",
    "copy_v_max",
    "u_mul_e_sum",
    "u_div_e_mean",
    "e_sub_v_max",
    "v_add_u_min",
    "u_mul_v_max",
    "e_div_u_sum",
    "u_sub_e_min",
    "v_mul_e_mean",
    "e_add_e_max",
]
PARITY_MESSAGE = ["u_dot_v", "u_add_v", "e_div_u", "copy_e", "v_mul_e", "e_dot_e", "u_sub_u", "copy_u"]
PARITY = [(s, n) for s in ("vertex", "edge", "group") for n in PARITY_GATHER] + [
    (s, n) for s in ("vertex", "edge", "group") for n in PARITY_MESSAGE
]


@pytest.mark.parametrize("strategy,name", PARITY, ids=[f"{s}-{n}" for s, n in PARITY])
def test_gradient_parity(strategy, name, device, graph_factory, operand_factory, operand_shapes, check_close):
    """Gradients through the kernels equal torch's autograd through the reference executor, in
    three operand layouts per op, cycling through all (per-head edge operands take the
    reducing-message path)."""
    op = OpInfo.from_name(name)
    graph = graph_factory("mixed")
    shapes = operand_shapes(op)
    for i in range(3):
        shape = shapes[(PARITY.index((strategy, name)) + i) % len(shapes)]
        operands = operand_factory(graph, op, shape, seed=i, device=device)
        info = small_schedule(strategy, operands)
        ours = grads(lambda *xs: ug.compute(graph, op, *xs, parallel_info=info), operands)
        theirs = grads(lambda *xs: reference.execute(graph, op, xs), operands)
        for k, (a, b) in enumerate(zip(ours, theirs)):
            check_close(a, b, context=f"{name} under {strategy}, {shape} operands, tensor {k}")


HALF = [
    ("vertex", "u_mul_e_sum"),
    ("edge", "copy_u_max"),
    ("group", "u_add_v_mean"),
    ("vertex", "u_dot_v"),
    ("edge", "e_mul_v"),
    ("group", "u_dot_v"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("strategy,name", HALF, ids=[f"{s}-{n}" for s, n in HALF])
def test_half_gradients(strategy, name, dtype, device, graph_factory, operand_factory, check_close):
    op = OpInfo.from_name(name)
    graph = graph_factory("hub")
    operands = operand_factory(graph, op, "heads", dtype, seed=2, device=device)
    info = small_schedule(strategy, operands)
    ours = grads(lambda *xs: ug.compute(graph, op, *xs, parallel_info=info), operands)
    theirs = grads(lambda *xs: reference.execute(graph, op, xs), operands)
    for a, b in zip(ours, theirs):
        check_close(a, b, dtype, f"{name} under {strategy}")


@pytest.mark.parametrize("gather", ["max", "min"])
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_tie_rule(strategy, gather, device, graph_factory, check_close):
    """Tied messages share the gradient evenly, as ``torch.scatter_reduce(include_self=False)``:
    small integers make many ties, within rows and across chunks and blocks. (Positive ones: see
    :func:`test_zero_result_is_not_a_tie_with_the_initial_value`.)"""
    graph = graph_factory("hub")
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(1, 4, (graph.num_src, 3), generator=gen).to(device, torch.float64)
    w = torch.randint(1, 3, (graph.num_edges, 3), generator=gen).to(device, torch.float64)
    op = OpInfo.from_name(f"u_mul_e_{gather}")
    ours = grads(lambda x, w: ug.compute(graph, op, x, w, parallel_info=small_schedule(strategy, [x])), [x, w])

    def torch_rule(x, w):
        index = graph.dst.to(device)[:, None].expand(-1, 3)
        message = x[graph.src.to(device)] * w
        return message.new_zeros(graph.num_dst, 3).scatter_reduce(0, index, message, f"a{gather}", include_self=False)

    theirs = grads(torch_rule, [x, w])
    hub_messages = (x[graph.src.to(device)] * w)[graph.dst.to(device) == 0]
    winners = hub_messages == (hub_messages.amax(0) if gather == "max" else hub_messages.amin(0))
    assert (winners.sum(0) > 1).all(), "the hub must have tied winners in every feature"
    for k, (a, b) in enumerate(zip(ours, theirs)):
        check_close(a, b, context=f"tensor {k}")


def test_zero_result_is_not_a_tie_with_the_initial_value(device):
    """One message of value 0 wins: it gets the whole gradient. torch's ``scatter_reduce`` backward
    also counts the (zero-filled) output it reduces into as a tie even with ``include_self=False``
    and would give it half; the IR backward compares messages only."""
    graph = ug.GraphTensor.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 2)
    x = torch.tensor([[0.0], [-1.0]], dtype=torch.float64, device=device)
    _, dx = grads(
        lambda x: ug.compute(graph, "copy_u_max", x, parallel_info=small_schedule("vertex", [x])), [x], probe_seed=1
    )
    probe = torch.randn((2, 1), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(dx.cpu(), torch.tensor([[probe[0, 0].item()], [0.0]], dtype=torch.float64))


def test_mean_gives_isolated_vertices_no_gradient(device, graph_factory, operand_factory):
    graph = graph_factory("isolated")
    op = OpInfo.from_name("copy_u_mean")
    (x,) = operand_factory(graph, op, device=device)
    _, dx = grads(lambda x: ug.compute(graph, op, x, parallel_info=ug.ParallelInfo("vertex", block_f=8)), [x])
    no_out_edges = torch.bincount(graph.src, minlength=graph.num_src) == 0
    assert no_out_edges.any() and torch.equal(dx[no_out_edges], torch.zeros_like(dx[no_out_edges]))
    assert (dx[~no_out_edges] != 0).all()


#: Reducing ops whose gradient messages do not vary along the summed features, for an operand that
#: has them (spread over them) or is broadcast along them (summed over them), and ops with an operand
#: whose derivative is identically 0 (only inside ``gt``/``eq``, or ``x - x``): name -> (op, shapes).
CONSTANT_MESSAGES = {
    "sum_last(u0)": (OpInfo(Expr.input(0), None, operands=("src_v",), reduce=True), [(6, 4)]),
    "sum_last(log(|e0| + 0.5) + e1)": (
        OpInfo(
            Expr.apply("log", Expr.apply("abs", Expr.input(0)) + 0.5) + Expr.input(1),
            None,
            operands=("edge", "edge"),
            reduce=True,
        ),
        [(None, 9), (None,)],
    ),
    "sum_last(u0 * v1), v1 per head": (
        OpInfo(Expr.input(0) * Expr.input(1), None, operands=("src_v", "dst_v"), reduce=True),
        [(6, 2, 3), (6, 2, 1)],
    ),
    "gt(u0, 0) + e1, sum": (
        OpInfo(Expr.apply("gt", Expr.input(0), 0.0) + Expr.input(1), "sum", operands=("src_v", "edge")),
        [(6, 4), (None, 4)],
    ),
    "u0 - u0, max": (OpInfo(Expr.input(0) - Expr.input(0), "max", operands=("src_v",)), [(6,)]),
    "e0 * eq(v1, v1)": (
        OpInfo(Expr.input(0) * Expr.apply("eq", Expr.input(1), Expr.input(1)), None, operands=("edge", "dst_v")),
        [(None, 2), (6, 2)],
    ),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", CONSTANT_MESSAGES)
def test_gradients_of_constant_messages(name, strategy, device, graph_factory, check_close):
    """Autograd's gradients through the reference executor, in float64 through the kernels. These
    backward passes crashed (a message of the wrong width, an op without operands) or, for an
    operand broadcast along a reducing op's summed features, counted one of them instead of all."""
    op, shapes = CONSTANT_MESSAGES[name]
    graph = graph_factory("mixed")
    rows = [
        graph.num_edges if shape[0] is None else graph.num_src if kind == "src_v" else graph.num_dst
        for shape, kind in zip(shapes, op.inputs)
    ]
    generator = torch.Generator().manual_seed(5)
    operands = [
        torch.randn((count,) + tuple(shape[1:]), generator=generator, dtype=torch.float64)
        for count, shape in zip(rows, shapes)
    ]
    info = small_schedule(strategy, operands)
    ours = grads(lambda *xs: ug.compute(graph, op, operands=xs, parallel_info=info), [t.to(device) for t in operands])
    exact = grads(lambda *xs: reference.execute(graph, op, list(xs)), operands)
    for a, b in zip(ours, exact):
        check_close(a.cpu(), b, context=name)


@pytest.mark.parametrize("shape", [(), (1,), (2, 1)], ids=["E", "E,1", "E,H,1"])
def test_second_derivative_of_a_broadcast_edge_operand(shape, device, graph_factory):
    """``d2/dw2`` of ``sum(x_u / w_e)`` and of ``sum(x_u * exp(w_e))`` for an edge operand broadcast
    over the features, against torch's own autograd in float64: the first backward's gradient of
    ``w`` is a reducing op, whose gradient steps already sum over the features, and the result was
    multiplied by their count once more."""
    graph = graph_factory("mixed")
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(
        (graph.num_src, 2, 3) if len(shape) == 2 else (graph.num_src, 3), generator=generator, dtype=torch.float64
    )
    w = torch.rand((graph.num_edges,) + shape, generator=generator, dtype=torch.float64) + 0.5
    ops = {"u_div_e_sum": lambda a, b: a / b, "exp": lambda a, b: a * torch.exp(b)}
    for name, message in ops.items():
        op = OpInfo(
            Expr.input(0) / Expr.input(1)
            if name == "u_div_e_sum"
            else Expr.input(0) * Expr.apply("exp", Expr.input(1)),
            "sum",
            operands=("src_v", "edge"),
        )

        def second(run):
            xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
            (first,) = torch.autograd.grad(run(xs, ws).sum(), ws, create_graph=True)
            return torch.autograd.grad(first.square().sum(), [xs, ws])

        def torch_op(a, b):
            b = b.reshape(b.shape + (1,) * (a.dim() - b.dim()))
            return torch.zeros_like(a).index_add(0, graph.dst, message(a[graph.src], b))

        ours = second(lambda a, b: ug.compute(graph, op, operands=[a.to(device), b.to(device)]).cpu())
        for a, b in zip(ours, second(torch_op)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_backward_ops_follow_the_ir():
    """The structure the issue asks for: vertex gradients of a gather are gathers (source operands
    on the reversed graph), edge gradients are message creation, broadcast edge operands reduce."""
    backward = derive(OpInfo.from_name("u_mul_e_sum"), (False, False))
    dx, dw = backward.slots
    assert (dx.op.name, dx.reverse, dx.sources) == ("u_mul_e_sum", True, ("grad", 1))
    assert (dw.op.name, dw.reverse, dw.sources) == ("v_mul_u", False, ("grad", 0))
    reduced = derive(OpInfo.from_name("u_mul_e_sum"), (False, True)).slots[1]
    assert reduced.op.name == "v_dot_u" and reduced.op.gather_op is None
    copy = derive(OpInfo.from_name("copy_u_sum"), (False,)).slots[0]
    assert (copy.op.name, copy.reverse) == ("copy_u_sum", True)
    assert derive(OpInfo.from_name("copy_u_max"), (False,)).count.op.gather_op == "sum"
    assert describe(OpInfo.from_name("u_dot_v")) == "dlhs: e_mul_u_sum on the reversed graph; drhs: e_mul_u_sum"
    assert backward.shared_pass == (0, 1)
    assert derive(OpInfo.from_name("e_div_u_mean"), (False, False)).shared_pass == (1, 0)
    assert derive(OpInfo.from_name("copy_u_sum"), (False,)).shared_pass is None
    assert derive(OpInfo.from_name("u_mul_v_sum"), (False, False)).shared_pass is None
    assert on_reversed(reduced.op).name == "u_dot_v"


#: (op, operand layout, feature tile, whether that tile can fuse): GAT's per-head weights with a
#: tile inside a head (partial sums) or straddling heads of 3 (run one by one), full edge operands
#: (an elementwise edge output), a mean, and a max (whose backward counts ties first).
SHARED = [
    ("u_mul_e_sum", "head_bcast", 1, True),
    ("u_mul_e_sum", "head_bcast", 4, False),
    ("u_mul_e_sum", "vector", 8, True),
    ("e_div_u_mean", "heads", 2, True),
    ("u_add_e_max", "vector", 4, True),
]


@pytest.mark.parametrize("strategy", ["vertex", "group"])
@pytest.mark.parametrize("name,shape,block_f,fuses", SHARED)
def test_vertex_and_edge_gradients_share_one_pass(
    name, shape, block_f, fuses, strategy, device, graph_factory, operand_factory, check_close, monkeypatch
):
    """The source gradient (a gather on the reversed graph) and the edge gradient (message
    creation) run as one kernel where the feature tile allows, and equal the reference's autograd
    either way."""
    fused = []  # what each pass that may fuse returned: a pair's launch plan, or run_with_edge_output
    run_pair, run_plan = triton_kernels.run_with_edge_output, triton_kernels.PairPlan.__call__
    monkeypatch.setattr(
        triton_kernels, "run_with_edge_output", lambda *args: fused.append(run_pair(*args)) or fused[-1]
    )
    monkeypatch.setattr(triton_kernels.PairPlan, "__call__", lambda *args: fused.append(run_plan(*args)) or fused[-1])
    op = OpInfo.from_name(name)
    graph = graph_factory("mixed")
    operands = operand_factory(graph, op, shape, seed=4, device=device)
    info = small_schedule(strategy, operands).with_knobs(block_f=block_f)
    ours = grads(lambda *xs: ug.compute(graph, op, *xs, parallel_info=info), operands)
    theirs = grads(lambda *xs: reference.execute(graph, op, xs), operands)
    assert len(fused) == 1 and (fused[0] is not None) == fuses
    for k, (a, b) in enumerate(zip(ours, theirs)):
        check_close(a, b, context=f"{name} under {strategy}, {shape} operands, tensor {k}")


def test_backward_doc_table_is_generated():
    text = BACKWARD_DOC.read_text()
    match = re.search(r"<!-- BACKWARD_TABLE -->\n(.*?)\n<!-- /BACKWARD_TABLE -->", text, re.S)
    assert match, "docs/backward.md has no <!-- BACKWARD_TABLE --> section"
    assert match.group(1) == backward_table(), "regenerate it with `python -m pyg_ugrapher.backward`"


def test_backward_table_lists_every_op():
    rows = backward_table().splitlines()[2:]
    forwards = [row.split("|")[1].strip().strip("`") for row in rows]
    builtin = [n for n in NAMES if re.fullmatch(r"copy_u(_\w+)?|u_\w+_e_\w+|u_\w+_v", n)]
    expected = set(builtin) | {f"copy_e_{g}" for g in GATHER_OPS} | {"copy_v"}
    expected = {n for n in expected if not re.fullmatch(r"u_\w+_e", n)}
    assert set(forwards) == expected and len(forwards) == len(set(forwards)) == 31
