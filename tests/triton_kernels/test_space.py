"""The design space: only valid schedules, every strategy an op has, and a sample of it runs."""

import pytest

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from triton_kernels import space
from triton_kernels.codegen import edge_mode
from triton_kernels.space import (
    MAX_TILE,
    PAIR_BLOCK_F,
    PAIR_GROUP,
    PAIR_TILE,
    TILE_KNOBS,
    feature_tiles,
    neighbours,
    pair_schedule,
)


@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_max", "e_div_v_mean", "u_add_v", "u_dot_v"])
@pytest.mark.parametrize("width", [1, 5, 64, 256, 1000])
def test_space_is_valid(name, width):
    op = OpInfo.from_name(name)
    found = space(op, width)
    assert found and len(set(found)) == len(found)
    for info in found:
        assert info.is_complete and info.validate_for(width) is info
        assert (info.block_v or 1) * info.block_e * info.block_f <= 2 * MAX_TILE
    assert {info.strategy for info in found} == {"vertex", "edge", "group"}
    if op.gather_op is None:  # a vertex-parallel message program walks one row
        assert all(info.block_v == 1 for info in found if info.strategy == "vertex")
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
        assert pair.strategy == info.strategy and pair.validate_for(width) is pair
        assert pair.block_v * pair.block_e * pair.block_f <= max(PAIR_TILE, 2 * pair.block_f)
        assert pair.block_f >= min(max(info.block_f, PAIR_BLOCK_F), 1 << max(width - 1, 0).bit_length())
        mode = edge_mode(width, group, pair.block_f)
        if group == 1:
            assert mode == "elementwise"
        elif group == width or group & (group - 1) == 0:
            assert mode in ("whole", "groups"), f"{info} -> {pair}: {mode}"
        if info.strategy == "group":
            assert pair.group_size <= PAIR_GROUP


@pytest.mark.parametrize("name,width", [("copy_u_sum", 128), ("u_mul_e_max", 5), ("u_dot_v", 128), ("u_add_v", 64)])
def test_neighbours_differ_in_one_knob_by_one_step(name, width):
    """One knob one step away, or a tile knob and the warps one step in the same direction."""
    op = OpInfo.from_name(name)
    for info in space(op, width)[::7]:
        found = neighbours(info, op, width)
        assert found and len(set(found)) == len(found) and info not in found
        for other in found:
            assert other.strategy == info.strategy and other.validate_for(width) is other
            changed = {k: (v, other.knobs[k]) for k, v in info.knobs.items() if other.knobs[k] != v}
            if len(changed) == 2:
                (knob, (before, after)), (warps, (fewer, more)) = changed.items()
                assert knob in TILE_KNOBS and warps == "num_warps" and after * fewer == before * more, (info, other)
            assert len(changed) in (1, 2), (info, other)
            (knob, (before, after)) = next(iter(changed.items()))
            assert max(before, after) // min(before, after) == (4 if knob == "group_size" else 2)
            assert knob != "num_stages" and other.num_warps <= 8
            assert (other.block_v or 1) * other.block_e * other.block_f <= 2 * MAX_TILE
            assert op.gather_op is not None or other.strategy != "vertex" or other.block_v == 1


def test_neighbours_reach_off_grid_schedules_within_limits():
    op = OpInfo.from_name("copy_u_sum")
    start = ParallelInfo("vertex", block_v=1, block_e=64, block_f=128, num_warps=8)
    found = set(neighbours(start, op, 128))
    # 2 x 64 x 128 spills, and 16 warps are too many
    assert found == {
        start.with_knobs(block_e=32),
        start.with_knobs(block_f=64),
        start.with_knobs(num_warps=4),
        start.with_knobs(block_e=32, num_warps=4),
        start.with_knobs(block_f=64, num_warps=4),
    }
    assert start.with_knobs(num_warps=4) not in space(op, 128)  # 64 tile elements per thread
    assert neighbours(ParallelInfo("edge", block_e=512, block_f=32, num_warps=8), op, 32) == [
        ParallelInfo("edge", block_e=256, block_f=32, num_warps=8),
        ParallelInfo("edge", block_e=256, block_f=32, num_warps=4),
        ParallelInfo("edge", block_e=512, block_f=16, num_warps=8),
        ParallelInfo("edge", block_e=512, block_f=16, num_warps=4),
        ParallelInfo("edge", block_e=512, block_f=32, num_warps=4),
    ]
