"""The design space: only valid schedules, every strategy an op has, and a sample of it runs."""
import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import OpInfo
from triton_kernels import space
from triton_kernels.codegen import edge_mode
from triton_kernels.space import MAX_TILE, PAIR_BLOCK_F, PAIR_GROUP, PAIR_TILE, feature_tiles, pair_schedule


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


@pytest.mark.parametrize("width,group", [(128, 128), (128, 32), (6, 3), (6, 1), (100, 100), (512, 512)])
def test_pair_schedules_hold_whole_sums_in_small_tiles(width, group):
    """Every gather schedule of the space becomes one that writes the edge output without atomics
    where a power-of-two tile can hold whole sums, in at most PAIR_TILE elements, and still valid."""
    op = OpInfo.from_name("u_mul_e_sum")
    for info in space(op, width):
        pair = pair_schedule(info, width, group)
        if info.strategy == "edge":
            assert pair == info
            continue
        assert pair.strategy == info.strategy and pair.validate_for("sum", width) is pair
        assert pair.block_v * pair.block_e * pair.block_f <= max(PAIR_TILE, 2 * pair.block_f)
        assert pair.block_f >= min(max(info.block_f, PAIR_BLOCK_F), 1 << max(width - 1, 0).bit_length())
        mode = edge_mode(width, group, pair.block_f)
        if group == 1:
            assert mode == "elementwise"
        elif group == width or group & (group - 1) == 0:
            assert mode in ("whole", "groups"), f"{info} -> {pair}: {mode}"
        if info.strategy == "group":
            assert pair.group_size <= PAIR_GROUP
