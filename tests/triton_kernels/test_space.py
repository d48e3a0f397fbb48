"""The design space: only valid schedules, every strategy an op has, and a sample of it runs."""
import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import OpInfo
from triton_kernels import space
from triton_kernels.space import MAX_TILE, feature_tiles


@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_max", "e_div_v_mean", "u_add_v", "u_dot_v"])
@pytest.mark.parametrize("width", [1, 5, 64, 256, 1000])
def test_space_is_valid(name, width):
    op = OpInfo.from_name(name)
    found = space(op, width)
    assert found and len(set(found)) == len(found)
    for info in found:
        assert info.validate_for(op.gather_op, width) is info
        assert (info.block_v or 1) * info.block_e * info.block_f <= 2 * MAX_TILE
    strategies = {info.strategy for info in found}
    assert strategies == ({"vertex", "edge", "group"} if op.gather_op else {"vertex", "edge"})
    assert {info.block_f for info in found} == set(feature_tiles(width))


def test_sample_of_the_space_runs(device, graph_factory, operand_factory, check_close):
    graph = graph_factory("hub")
    for name in ("u_mul_e_max", "u_dot_v"):
        op = OpInfo.from_name(name)
        operands = operand_factory(graph, op, "vector", device=device)
        expected = reference.execute(graph, op, operands)
        found = space(op, 5)
        for strategy in ("vertex", "edge", "group"):
            picks = [info for info in found if info.strategy == strategy][:2]
            for info in picks:
                check_close(ug.compute(graph, op, *operands, parallel_info=info), expected, context=str(info))
