"""The schedule rules used without a model: each GPU rule fires on the graphs it is written for,
and every schedule they give is valid for its operator and width."""

import pytest
import triton

from autotune.heuristic import heuristic, small_graph_schedule, small_graph_softmax_schedule
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo
from triton_kernels.space import space


@pytest.fixture(scope="module")
def stats():
    return {
        "skewed": GraphTensor.from_edge_index(power_law_graph(2000, 40_000, exponent=1.0, seed=1), 2000).stats(),
        "regular": GraphTensor.from_edge_index(uniform_graph(2000, 40_000, seed=1), 2000).stats(),
    }


@pytest.mark.parametrize(
    "name,width,graph,strategy",
    [
        ("u_add_v", 128, "skewed", "group"),  # a hub's edges split over programs, destinations loaded per chunk
        ("u_dot_v", 128, "skewed", "group"),
        ("u_add_v", 128, "regular", "vertex"),  # destinations loaded once per row
        ("u_add_v", 4, "skewed", "edge"),  # narrow messages: contiguous output in user order
        ("u_add_v", 4, "regular", "edge"),
        ("copy_u", 128, "skewed", "edge"),  # no destination operand to reuse
        ("copy_u_sum", 128, "skewed", "group"),
        ("copy_u_sum", 128, "regular", "vertex"),
    ],
)
def test_gpu_rules(stats, name, width, graph, strategy):
    op = OpInfo.from_name(name)
    info = heuristic(stats[graph], op, width, on_gpu=True)
    assert info.strategy == strategy
    assert info.validate_for(width) is info
    assert info in space(op, width) or info.strategy == "vertex"


@pytest.mark.parametrize("name", ["u_add_v", "copy_u_sum"])
@pytest.mark.parametrize("width", [1, 16, 128, 512])
def test_cpu_and_small_graph_schedules_are_valid(stats, name, width):
    op = OpInfo.from_name(name)
    for info in (heuristic(stats["skewed"], op, width, on_gpu=False), small_graph_schedule(op, width)):
        assert info.validate_for(width) is info


@pytest.mark.parametrize("width", [1, 7, 16, 64, 128, 512])
def test_small_graph_softmax_schedule_is_a_valid_one_pass(width):
    """A vertex-parallel schedule of the design space's knobs, valid for its width."""
    info = small_graph_softmax_schedule(width)
    assert info.strategy == "vertex" and info.is_complete
    assert info.validate_for(width) is info
    assert info.block_f <= 64 and info.block_f >= min(width, 64)


@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_sum", "copy_u_max"])
@pytest.mark.parametrize("width", [1, 7, 16, 32, 64, 128, 512])
def test_small_graph_gathers_are_short_edge_programs_of_the_space(name, width):
    """Programs of 32 edges and at most 32 features, a schedule of the design space (so that an
    exhaustive collection times it and ``evaluate``'s ``runtime`` column finds it)."""
    op = OpInfo.from_name(name)
    info = small_graph_schedule(op, width)
    assert (info.strategy, info.block_e) == ("edge", 32) and info.block_f == min(triton.next_power_of_2(width), 32)
    assert info in space(op, width)
