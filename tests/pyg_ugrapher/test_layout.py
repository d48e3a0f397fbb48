"""Operand layouts: broadcasting of feature shapes, the load pattern of each operand, and every
shape the kernels refuse."""

import pytest

from pyg_ugrapher.ir import Expr, OpInfo
from pyg_ugrapher.layout import infer_layout, slot_names

MUL = OpInfo.from_name("u_mul_e_sum")
DOT = OpInfo.from_name("u_dot_v")


@pytest.mark.parametrize(
    "op,shapes,message,out,patterns,inner,reduce_size",
    [
        (MUL, [(7, 5), (9, 5)], (5,), (5,), ("full", "full"), 5, 1),
        (MUL, [(7,), (9,)], (), (), ("full", "full"), 1, 1),
        (MUL, [(7, 5), (9,)], (5,), (5,), ("full", "scalar"), 5, 1),
        (MUL, [(7, 5), (9, 1)], (5,), (5,), ("full", "scalar"), 5, 1),
        (MUL, [(7, 2, 3), (9, 2, 1)], (2, 3), (2, 3), ("full", "head"), 3, 1),
        (MUL, [(7, 2, 1), (9, 2, 3)], (2, 3), (2, 3), ("head", "full"), 3, 1),
        (MUL, [(7, 2, 3), (9, 3)], (2, 3), (2, 3), ("full", "inner"), 3, 1),
        (MUL, [(7, 2, 3), (9, 1, 3)], (2, 3), (2, 3), ("full", "inner"), 3, 1),
        (MUL, [(7, 2, 3), (9,)], (2, 3), (2, 3), ("full", "scalar"), 3, 1),
        (DOT, [(7, 5), (9, 5)], (5,), (1,), ("full", "full"), 5, 5),
        (DOT, [(7, 2, 3), (9, 2, 3)], (2, 3), (2, 1), ("full", "full"), 3, 3),
        (DOT, [(7, 2, 3), (9, 3)], (2, 3), (2, 1), ("full", "inner"), 3, 3),
        (OpInfo.from_name("copy_u_max"), [(7, 4, 2)], (4, 2), (4, 2), ("full",), 2, 1),
    ],
)
def test_infer_layout(op, shapes, message, out, patterns, inner, reduce_size):
    layout = infer_layout(op, shapes)
    assert (layout.message_shape, layout.out_shape, layout.patterns) == (message, out, patterns)
    assert (layout.inner, layout.reduce_size) == (inner, reduce_size)
    assert layout.width == (out[0] * out[1] if len(out) == 2 else out[0] if out else 1)


def test_generated_reducing_op_reads_per_head_operands():
    # The gradient of GAT's [E, H, 1] attention reads per-head sums [N, H, 1] inside a reduction.
    op = OpInfo(Expr.input(0) * Expr.input(1), None, operands=("src_v", "dst_v"), reduce=True)
    layout = infer_layout(op, [(7, 2, 3), (9, 2, 1)])
    assert layout.patterns == ("full", "head") and layout.out_shape == (2, 1)


def test_slot_names():
    assert slot_names(MUL) == ("lhs", "rhs")
    assert slot_names(OpInfo("copy_rhs", "sum", rhs="edge")) == ("rhs",)
    assert slot_names(OpInfo(Expr.input(0), "sum", operands=("edge",))) == ("operands[0]",)


@pytest.mark.parametrize(
    "op,shapes,field",
    [
        (MUL, [(7, 5)], "operands"),
        (MUL, [(7, 5), (9, 4)], "rhs"),
        (MUL, [(7, 2, 3), (9, 3, 3)], "rhs"),
        (MUL, [(7, 2, 3, 4), (9, 3, 4)], "rhs"),
        (MUL, [(7, 2, 3, 4), (9, 2, 1, 4)], "rhs"),
        (DOT, [(7,), (9,)], "lhs"),
        (DOT, [(7, 5), (9,)], "rhs"),
        (DOT, [(7, 5), (9, 1)], "rhs"),
        (DOT, [(7, 2, 3), (9, 2, 1)], "rhs"),
    ],
)
def test_layout_errors(op, shapes, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        infer_layout(op, shapes)
