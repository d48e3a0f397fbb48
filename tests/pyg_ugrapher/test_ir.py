"""The IR: every DGL gspmm/gsddmm name, the loop it stands for, every invalid combination, and
(de)serialisation of built-in and expression ops."""

import itertools

import pytest

from pyg_ugrapher.ir import EDGE_OPS, GATHER_OPS, Expr, OpInfo, parse_expr

TARGETS = {"u": "src_v", "v": "dst_v", "e": "edge"}
BINARY = ("add", "sub", "mul", "div")
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _names():
    """Every DGL-style name with its expected fields: (name, edge_op, gather, lhs, rhs)."""
    for gather in (None,) + GATHER_OPS:
        suffix = f"_{gather}" if gather else ""
        for t in TARGETS:
            yield f"copy_{t}{suffix}", "copy_lhs", gather, TARGETS[t], None
        for a, b in itertools.product(TARGETS, repeat=2):
            for op in BINARY + (("dot",) if gather is None else ()):
                yield f"{a}_{op}_{b}{suffix}", op, gather, TARGETS[a], TARGETS[b]


NAMES = list(_names())


def test_name_matrix_is_complete():
    # 3 copies + 9 target pairs x 4 binary ops per gather op, plus dot for message creation.
    assert len(NAMES) == 5 * (3 + 36) + 9
    assert {edge_op for _, edge_op, *_ in NAMES} == set(EDGE_OPS) - {"copy_rhs"}


@pytest.mark.parametrize("name,edge_op,gather,lhs,rhs", NAMES, ids=[n[0] for n in NAMES])
def test_from_name(name, edge_op, gather, lhs, rhs):
    op = OpInfo.from_name(name)
    assert (op.edge_op, op.gather_op, op.lhs, op.rhs) == (edge_op, gather, lhs, rhs)
    assert op.out == ("dst_v" if gather else "edge")
    assert op.inputs == tuple(k for k in (lhs, rhs) if k is not None)
    assert op.reduces == (edge_op == "dot")
    assert op.name == name
    assert OpInfo.deserialize(op.serialize()) == op
    assert hash(OpInfo.from_name(name)) == hash(op)


@pytest.mark.parametrize("name,edge_op,gather,lhs,rhs", NAMES, ids=[n[0] for n in NAMES])
def test_repr_shows_the_loop(name, edge_op, gather, lhs, rhs):
    text = repr(OpInfo.from_name(name))
    first, loop, body = text.split("\n")
    assert first == f"OpInfo {name}"
    assert loop.strip() == "for each edge (u, e, v):"
    a = f"lhs[{name.split('_')[1] if edge_op == 'copy_lhs' else name[0]}]"
    if edge_op == "copy_lhs":
        message = a
    else:
        message = f"({a} {SYMBOL.get(edge_op, '*')} rhs[{name.split('_')[2]}])"
    if edge_op == "dot":
        message = f"sum over last dim of {message}"
    if gather is None:
        expected = f"out[e] = {message}"
    elif gather == "mean":
        expected = f"out[v] = sum(out[v], {message}) / in_degree(v)"
    else:
        expected = f"out[v] = {gather}(out[v], {message})"
    assert body.strip() == expected


def test_copy_rhs_and_explicit_out():
    op = OpInfo("copy_rhs", "max", rhs="edge")
    assert op.name == "copy_e_max" and op.inputs == ("edge",)
    assert OpInfo("mul", "sum", lhs="src_v", rhs="edge", out="dst_v") == OpInfo.from_name("u_mul_e_sum")
    assert OpInfo("add", None, lhs="src_v", rhs="dst_v", out="edge") == OpInfo.from_name("u_add_v")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(edge_op="mul", gather_op="sum", lhs="src_v", rhs="edge", out="edge"), "out"),
        (dict(edge_op="add", gather_op=None, lhs="src_v", rhs="dst_v", out="dst_v"), "out"),
        (dict(edge_op="mul", gather_op="sum", lhs="src_v", rhs="edge", out="vertex"), "out"),
        (dict(edge_op="copy_lhs", gather_op="sum"), "lhs"),
        (dict(edge_op="copy_lhs", gather_op="sum", lhs="src_v", rhs="edge"), "rhs"),
        (dict(edge_op="copy_rhs", gather_op="sum"), "rhs"),
        (dict(edge_op="copy_rhs", gather_op="sum", lhs="src_v", rhs="edge"), "lhs"),
        (dict(edge_op="mul", gather_op="sum", rhs="edge"), "lhs"),
        (dict(edge_op="mul", gather_op="sum", lhs="src_v"), "rhs"),
        (dict(edge_op="dot", gather_op="sum", lhs="src_v", rhs="dst_v"), "gather_op"),
        (dict(edge_op="mul", gather_op="prod", lhs="src_v", rhs="edge"), "gather_op"),
        (dict(edge_op="mul", gather_op="sum", lhs="node", rhs="edge"), "lhs"),
        (dict(edge_op="mul", gather_op="sum", lhs="src_v", rhs="graph"), "rhs"),
        (dict(edge_op="pow", gather_op="sum", lhs="src_v", rhs="edge"), "edge_op"),
        (dict(edge_op="mul", gather_op="sum", lhs="src_v", rhs="edge", operands=("src_v",)), "operands"),
        (dict(edge_op="mul", gather_op=None, lhs="src_v", rhs="edge", reduce=True), "operands"),
        (dict(edge_op=Expr.input(0) * Expr.input(1), gather_op="sum", lhs="src_v"), "lhs"),
        (dict(edge_op=Expr.input(0) * Expr.input(1), gather_op="sum", operands=("src_v",)), "operands"),
        (dict(edge_op=Expr.input(0) * Expr.input(2), gather_op="sum", operands=("src_v", "edge", "dst_v")), "operands"),
        (dict(edge_op=Expr.input(0), gather_op="sum", operands=("vertex",)), "operands"),
        (
            dict(edge_op=Expr.input(0) * Expr.input(1), gather_op="max", operands=("src_v", "dst_v"), reduce=True),
            "gather_op",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_opinfo(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        OpInfo(**kwargs)


@pytest.mark.parametrize(
    "name", ["copy_x_sum", "u_mul_sum", "u_pow_e_sum", "u_mul_e_prod", "copy_u_sum_max", "dot_u_v", "", "u_mul_e_"]
)
def test_invalid_name(name):
    with pytest.raises(ValueError, match="^name:"):
        OpInfo.from_name(name)


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match="^name:"):
        OpInfo.from_name(3)


def test_expression_op():
    x, w, a = Expr.input(0), Expr.input(1), Expr.input(2)
    expr = Expr.apply("leaky_relu", x * w + a, 0.2)
    op = OpInfo(expr, "max", operands=("src_v", "edge", "dst_v"))
    assert op.inputs == ("src_v", "edge", "dst_v") and not op.is_builtin
    assert op.name == "leaky_relu(((u0 * e1) + v2), 0.2)_max"
    assert "out[v] = max(out[v], leaky_relu(((in0[u] * in1[e]) + in2[v]), 0.2))" in repr(op)
    assert OpInfo.deserialize(op.serialize()) == op
    reducing = OpInfo(Expr.apply("exp", x) * w, None, operands=("src_v", "dst_v"), reduce=True)
    assert reducing.out == "edge" and reducing.reduces
    assert "sum over last dim of" in repr(reducing)
    assert OpInfo.deserialize(reducing.serialize()) == reducing


@pytest.mark.parametrize(
    "fn",
    [
        "neg",
        "exp",
        "log",
        "relu",
        "sigmoid",
        "tanh",
        "abs",
        "sqrt",
        "square",
        "reciprocal",
        "add",
        "sub",
        "mul",
        "div",
        "maximum",
        "minimum",
        "eq",
        "gt",
    ],
)
def test_expr_serialize_round_trip(fn):
    args = (
        (Expr.input(0),)
        if fn in ("neg", "exp", "log", "relu", "sigmoid", "tanh", "abs", "sqrt", "square", "reciprocal")
        else (Expr.input(0), Expr.input(1) * 2.5)
    )
    expr = Expr(fn, args)
    assert parse_expr(expr.serialize()) == expr


def test_expr_simplifies():
    x = Expr.input(0)
    assert x * 1.0 == x and 1.0 * x == x and x + 0.0 == x and x - 0.0 == x and x / 1.0 == x
    assert x * 0.0 == Expr.const(0.0)
    assert -(-x) == x
    assert Expr.apply("mul", Expr.const(2.0), Expr.const(3.0)) == Expr.const(6.0)
    assert x * (1.0 / Expr.input(1)) == Expr("div", (x, Expr.input(1)))


@pytest.mark.parametrize(
    "build,field",
    [
        (lambda: Expr("pow", (Expr.input(0),)), "Expr.fn"),
        (lambda: Expr("add", (Expr.input(0),)), "Expr.args"),
        (lambda: Expr("exp", ()), "Expr.args"),
        (lambda: Expr.input(-1), "Expr.value"),
        (lambda: Expr("input", (), 1.5), "Expr.value"),
        (lambda: Expr("leaky_relu", (Expr.input(0), Expr.input(1))), "Expr.args"),
        (lambda: Expr.const(1.0).index, "Expr.index"),
        (lambda: parse_expr("(add $0"), "expr"),
        (lambda: parse_expr("$0 $1"), "expr"),
        (lambda: parse_expr("(add $0 foo)"), "expr"),
    ],
)
def test_invalid_expr(build, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        build()


def test_expr_rejects_non_numbers():
    with pytest.raises(TypeError):
        Expr.input(0) + "x"
