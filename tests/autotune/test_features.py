import math

import numpy as np
import pandas as pd
import pytest
import torch

from autotune import features as ft
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo
from triton_kernels.space import space

GPU = ft.GpuInfo("test-gpu", 132, 90)


@pytest.fixture(scope="module")
def skewed():
    return GraphTensor.from_edge_index(power_law_graph(300, 3000, exponent=1.0, seed=1), 300)


def _column(matrix: np.ndarray, name: str) -> np.ndarray:
    return matrix[:, ft.FEATURES.index(name)]


@pytest.mark.parametrize(
    "name,F,reduce_size", [("copy_u_sum", 128, 1), ("copy_u_max", 16, 1), ("u_add_v", 64, 1), ("u_dot_v", 512, 512)]
)
def test_case_features_cover_the_space(skewed, name, F, reduce_size):
    op = OpInfo.from_name(name)
    infos, matrix = ft.case_features(skewed.stats(), op, F, reduce_size, torch.float32, GPU)
    assert list(infos) == space(op, F)
    assert matrix.shape == (len(infos), len(ft.FEATURES))
    assert matrix.dtype == np.float32
    assert np.isfinite(matrix).all()
    # The strategy one-hot marks exactly one strategy per candidate, the right one.
    onehot = matrix[:, [ft.FEATURES.index(f"s_{s}") for s in ("vertex", "edge", "group")]]
    assert (onehot.sum(1) == 1).all()
    assert all(onehot[i, ("vertex", "edge", "group").index(info.strategy)] == 1 for i, info in enumerate(infos))
    assert ((_column(matrix, "waste") >= 0) & (_column(matrix, "waste") <= 1)).all()


def test_derived_counts(skewed):
    stats = skewed.stats()
    op = OpInfo.from_name("copy_u_sum")
    infos, matrix = ft.case_features(stats, op, 64, 1, torch.float32, GPU)
    for i, info in enumerate(infos):
        tiles = math.ceil(64 / info.block_f)
        if info.strategy == "vertex":
            programs = math.ceil(stats.num_rows / info.block_v) * tiles
            steps = math.ceil(stats.rows.max / info.block_e)
        elif info.strategy == "edge":
            programs = math.ceil(stats.num_edges / info.block_e) * tiles
            steps = 1
        else:
            programs = math.ceil((stats.num_rows + stats.num_edges / info.group_size) / info.block_v) * tiles
            steps = math.ceil(min(stats.rows.max, info.group_size) / info.block_e)
        assert _column(matrix, "feature_tiles")[i] == tiles
        assert _column(matrix, "log_programs")[i] == pytest.approx(math.log2(programs + 1), rel=1e-5)
        assert _column(matrix, "log_max_steps")[i] == pytest.approx(math.log2(steps + 1), rel=1e-5)


def test_only_gathers_count_atomics(skewed):
    """Message creation writes each output once under every strategy; a gather's edge-parallel
    schedules combine run ends with atomics."""
    stats = skewed.stats()
    _, message = ft.case_features(stats, OpInfo.from_name("u_add_v"), 64, 1, torch.float32, GPU)
    assert (_column(message, "log_atomics") == 0).all()
    infos, gather = ft.case_features(stats, OpInfo.from_name("copy_u_sum"), 64, 1, torch.float32, GPU)
    atomics = _column(gather, "log_atomics")
    assert all(atomics[i] > 0 for i, info in enumerate(infos) if info.strategy == "edge")


def test_reducing_op_tiles():
    """u_dot_v with C = 64 summed features per output: a 32-wide tile holds one output."""
    stats = GraphTensor.from_edge_index(uniform_graph(50, 200), 50).stats()
    infos, matrix = ft.case_features(stats, OpInfo.from_name("u_dot_v"), 256, 64, torch.float32, GPU)
    for i, info in enumerate(infos):
        outputs = max(1, info.block_f // min(info.block_f, 64))
        assert _column(matrix, "feature_tiles")[i] == math.ceil(4 / min(outputs, 4))


def test_cached_per_structure_and_space(skewed):
    stats = skewed.stats()
    assert skewed.stats() is stats
    assert ft.graph_columns(stats) is ft.graph_columns(stats)
    assert ft.candidates(False, 128) is ft.candidates(False, 128)
    assert ft.gpu_info("cpu") is ft.gpu_info("cpu")


def test_table_and_runtime_paths_agree(skewed):
    """The collected table's rows give the same matrix as runtime selection."""
    op = OpInfo.from_name("u_add_v")
    stats = skewed.reverse().stats()
    infos, matrix = ft.case_features(stats, op, 32, 1, torch.float16, GPU)
    columns = ft.case_columns(stats, op, 32, 1, torch.float16, GPU)
    table = pd.DataFrame(
        [{**columns, **{k: v[i] for k, v in ft.knob_columns(list(infos)).items()}} for i in range(len(infos))]
    )
    np.testing.assert_array_equal(ft.frame_features(table), matrix)
    assert columns["itemsize"] == 2 and columns["num_rows"] == skewed.num_src


def test_frame_features_names_missing_columns():
    with pytest.raises(ValueError, match="table: missing columns"):
        ft.frame_features(pd.DataFrame({"num_rows": [1.0]}))
