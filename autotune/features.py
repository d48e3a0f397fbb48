r"""Features of one (operator, graph, width, dtype, GPU, candidate schedule): what the cost model reads.

A *case* is everything but the schedule: the graph's degree statistics (of the structure the
operator walks: the CSR for a forward op, the reversed graph's for a backward step), the
operator's fields, the message width :math:`F`, the features summed per output (``reduce_size``,
:math:`C` for ``dot``), the dtype and the GPU. A *candidate* is one
:class:`~pyg_ugrapher.parallel.ParallelInfo` of the design space.

Both are first written as *base columns* (:data:`CASE_COLUMNS`, :data:`KNOB_COLUMNS`): plain
numbers and names that the collector stores per measured row. :func:`derive` turns base columns
into the model's matrix (:data:`FEATURES`), adding what a schedule does on this graph:

* **programs** launched: :math:`\lceil \text{items} / b \rceil \cdot \lceil F / \text{tile}_F \rceil`
  with items = rows (vertex), edges (edge) or neighbour-group chunks (group, about
  :math:`N + E / G`), :math:`b` = ``block_v`` or ``block_e``;
* **steps**: edge-loop iterations of the slowest program (``ceil(max_degree / block_e)`` for
  vertex, ``ceil(min(max_degree, G) / block_e)`` for group, 1 for edge) and of a typical block,
  whose ``block_v`` rows run as long as the longest of them, about
  :math:`\mu + \sigma\sqrt{2 \ln b_v}` edges (group: the mean chunk, chunks being sorted by length);
* **waste**: the fraction of edge slots walked that hold no edge, :math:`1 - E / \text{slots}`.

The same function serves the collected table (one row per measurement, every column an array)
and runtime selection (the case columns are scalars, the knob columns the cached arrays of the
whole space), so training and selection can never disagree on a feature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import GraphStats
from triton_kernels.space import space

Column = Union[float, np.ndarray]

#: Graph statistics: sizes, then the degree distribution of rows (reduced into) and columns.
_DEGREE_FIELDS = ("mean", "std", "max", "skew", "top1_fraction", "isolated_fraction")
GRAPH_COLUMNS: Tuple[str, ...] = ("num_rows", "num_cols", "num_edges") + tuple(
    f"{side}_{name}" for side in ("row", "col") for name in _DEGREE_FIELDS
)
#: Operator fields: gather op (``none`` for message creation), operand kinds, reduction, size of
#: the edge function's expression tree.
OP_COLUMNS: Tuple[str, ...] = ("gather", "n_src", "n_dst", "n_edge", "reduces", "expr_size")
#: Shapes, dtype and GPU.
CALL_COLUMNS: Tuple[str, ...] = ("F", "reduce_size", "itemsize", "sm_count", "cc")
CASE_COLUMNS: Tuple[str, ...] = GRAPH_COLUMNS + OP_COLUMNS + CALL_COLUMNS
#: The schedule: strategy and knobs (0 where the strategy has no such knob).
KNOB_COLUMNS: Tuple[str, ...] = ("strategy", "block_v", "block_e", "block_f", "group_size", "num_warps")

GATHERS = ("none", "sum", "mean", "max", "min")

#: Columns of the model's matrix, in order.
FEATURES: Tuple[str, ...] = (
    # graph
    "log_rows",
    "log_cols",
    "log_edges",
    "log_row_mean",
    "log_row_std",
    "log_row_max",
    "row_skew",
    "row_top1",
    "row_isolated",
    "log_row_max_over_mean",
    "log_col_mean",
    "log_col_std",
    "log_col_max",
    "col_skew",
    "col_top1",
    "col_isolated",
    # operator, shapes, dtype, GPU
    "is_message",
    "gather_sum",
    "gather_mean",
    "gather_extreme",
    "n_src",
    "n_dst",
    "n_edge",
    "reduces",
    "expr_size",
    "log_F",
    "log_reduce_size",
    "log_out_width",
    "itemsize",
    "sm_count",
    "cc",
    "log_work",
    # schedule
    "s_vertex",
    "s_edge",
    "s_group",
    "log_block_v",
    "log_block_e",
    "log_block_f",
    "log_group_size",
    "log_num_warps",
    "log_tile",
    "log_elems_per_thread",
    # schedule on this graph
    "feature_tiles",
    "lane_use",
    "log_programs",
    "log_waves",
    "log_items_per_program",
    "log_max_steps",
    "log_mean_steps",
    "waste",
    "log_atomics",
    "splits_rows",
)


@dataclass(frozen=True)
class GpuInfo:
    """What the model knows of the device: its name (not a feature, kept for the table), number
    of multiprocessors and compute capability (``major * 10 + minor``; 0 on a CPU)."""

    name: str
    sm_count: int
    cc: int


@lru_cache(maxsize=None)
def gpu_info(device: Union[str, torch.device]) -> GpuInfo:
    """The :class:`GpuInfo` of ``device`` (a CPU reports its core count as ``sm_count``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return GpuInfo("cpu", os.cpu_count() or 1, 0)
    props = torch.cuda.get_device_properties(device)
    return GpuInfo(props.name, int(props.multi_processor_count), int(props.major * 10 + props.minor))


@lru_cache(maxsize=4096)
def graph_columns(stats: GraphStats) -> Dict[str, float]:
    """Base columns of a graph's statistics, cached per statistics (which are themselves cached on
    the graph's structure, see :func:`~pyg_ugrapher.structure.csr_stats`). Do not mutate the result."""
    values = {"num_rows": float(stats.num_rows), "num_cols": float(stats.num_cols), "num_edges": float(stats.num_edges)}
    for side, degrees in (("row", stats.rows), ("col", stats.cols)):
        for name in _DEGREE_FIELDS:
            values[f"{side}_{name}"] = float(getattr(degrees, name))
    return values


@lru_cache(maxsize=4096)
def op_columns(op: OpInfo) -> Dict[str, Union[str, float]]:
    """Base columns of an operator."""
    return {
        "gather": op.gather_op or "none",
        "n_src": float(op.inputs.count("src_v")),
        "n_dst": float(op.inputs.count("dst_v")),
        "n_edge": float(op.inputs.count("edge")),
        "reduces": float(op.reduces),
        "expr_size": float(sum(1 for _ in op.expr.walk())),
    }


def case_columns(
    stats: GraphStats, op: OpInfo, F: int, reduce_size: int, dtype: torch.dtype, gpu: GpuInfo
) -> Dict[str, Union[str, float]]:
    """Every base column of a case (everything but the schedule)."""
    columns: Dict[str, Union[str, float]] = dict(graph_columns(stats))
    columns.update(op_columns(op))
    columns.update(
        {
            "F": float(F),
            "reduce_size": float(reduce_size),
            "itemsize": float(dtype.itemsize),
            "sm_count": float(gpu.sm_count),
            "cc": float(gpu.cc),
        }
    )
    return columns


def knob_columns(infos: List[ParallelInfo]) -> Dict[str, np.ndarray]:
    """Base columns of candidate schedules, one entry per schedule."""
    columns: Dict[str, np.ndarray] = {"strategy": np.array([i.strategy for i in infos], dtype=object)}
    for name in KNOB_COLUMNS[1:]:
        columns[name] = np.array([getattr(i, name) or 0 for i in infos], dtype=np.float64)
    return columns


@lru_cache(maxsize=1024)
def candidates(message: bool, F: int) -> Tuple[Tuple[ParallelInfo, ...], Dict[str, np.ndarray], Dict[str, Column]]:
    """The design space for message creation (``message``) or a gather at width ``F``, its knob
    columns and their :func:`schedule_terms`; cached, since the space depends on nothing else."""
    op = OpInfo("copy_lhs", None if message else "sum", lhs="src_v")
    infos = tuple(space(op, F))
    knobs = knob_columns(list(infos))
    return infos, knobs, schedule_terms(knobs)


def _log2(x: Column) -> Column:
    return np.log2(np.maximum(x, 0.0) + 1.0)


def _next_pow2(x: Column) -> Column:
    return np.exp2(np.ceil(np.log2(np.maximum(x, 1.0))))


def schedule_terms(knobs: Mapping[str, Column]) -> Dict[str, Column]:
    """What the knob columns of schedules determine alone: knobs with the defaults the kernels
    apply, and the schedule-only features (among them the strategy indicators ``s_*``). :func:`candidates` keeps them
    per design space, so a selection derives only what depends on the graph."""
    strategy = knobs["strategy"]
    vertex = np.asarray(strategy == "vertex", dtype=np.float64)
    edge = np.asarray(strategy == "edge", dtype=np.float64)
    group = np.asarray(strategy == "group", dtype=np.float64)
    block_v = np.where(edge > 0, 1.0, np.maximum(knobs["block_v"], 1.0))
    block_e, block_f, warps = knobs["block_e"], knobs["block_f"], knobs["num_warps"]
    group_size = np.where(group > 0, np.maximum(knobs["group_size"], 1.0), 0.0)
    tile = block_v * block_e * block_f
    return {
        "block_v": block_v,
        "block_e": block_e,
        "block_f": block_f,
        "group_size": group_size,
        "safe_group": np.maximum(group_size, 1.0),
        "per_program": np.where(edge > 0, block_e, block_v),
        "sqrt_2_ln_block_v": np.sqrt(2 * np.log(block_v)),
        "s_vertex": vertex,
        "s_edge": edge,
        "s_group": group,
        "log_block_v": np.log2(block_v),
        "log_block_e": np.log2(block_e),
        "log_block_f": np.log2(block_f),
        "log_group_size": _log2(group_size),
        "log_num_warps": np.log2(warps),
        "log_tile": np.log2(tile),
        "log_elems_per_thread": np.log2(tile / (32 * warps)),
    }


#: Features that are ``log2(1 + column)`` of a graph column.
_LOGGED_GRAPH_COLUMNS = {
    "log_rows": "num_rows",
    "log_cols": "num_cols",
    "log_edges": "num_edges",
    "log_row_mean": "row_mean",
    "log_row_std": "row_std",
    "log_row_max": "row_max",
    "log_col_mean": "col_mean",
    "log_col_std": "col_std",
    "log_col_max": "col_max",
}
_SCHEDULE_FEATURES = (
    "s_vertex",
    "s_edge",
    "s_group",
    "log_block_v",
    "log_block_e",
    "log_block_f",
    "log_group_size",
    "log_num_warps",
    "log_tile",
    "log_elems_per_thread",
)


def derive(columns: Mapping[str, Column], schedule: Optional[Mapping[str, Column]] = None) -> np.ndarray:
    """The model's ``float32`` matrix (:data:`FEATURES`) from base columns.

    Every value of ``columns`` is a scalar or an array of one common length ``n`` (the number of
    rows returned); ``gather`` and ``strategy`` hold names, every other column numbers.
    ``schedule``: :func:`schedule_terms` of the knob columns, if already known.
    """
    c = columns
    s = schedule_terms(c) if schedule is None else schedule
    n = max((v.size for v in c.values() if isinstance(v, np.ndarray) and v.ndim > 0), default=1)
    E, rows, F = c["num_edges"], c["num_rows"], c["F"]
    mean, std, dmax = c["row_mean"], c["row_std"], c["row_max"]
    gather = c["gather"]
    edge, group = s["s_edge"], s["s_group"]
    block_v, block_e, block_f = s["block_v"], s["block_e"], s["block_f"]
    group_size, safe_group = s["group_size"], s["safe_group"]
    reduce_size = np.maximum(c["reduce_size"], 1.0)
    width = np.maximum(F / reduce_size, 1.0)

    # Feature tiles as the kernels split them (codegen.reduce_tiles): a reducing op spends part
    # of the tile on the summed features.
    block_r = np.where(reduce_size > 1, np.minimum(block_f, _next_pow2(reduce_size)), 1.0)
    block_out = np.minimum(np.maximum(block_f // block_r, 1.0), _next_pow2(width))
    feature_tiles = np.ceil(width / block_out)
    lane_use = width / (feature_tiles * block_out)

    # Work items along the first grid axis and the edges each program walks.
    chunks = rows + E / safe_group
    items = np.where(edge > 0, E, np.where(group > 0, chunks, rows))
    blocks = np.ceil(np.maximum(items, 1.0) / s["per_program"])
    programs = blocks * feature_tiles
    longest = np.where(group > 0, np.minimum(dmax, safe_group), dmax)
    max_steps = np.where(edge > 0, 1.0, np.ceil(longest / block_e))
    # A block of block_v rows runs as long as its longest row: about mean + std * sqrt(2 ln b).
    # Neighbour-group chunks are sorted by length, so the chunks of a block are alike.
    chunk_mean = np.where(group > 0, E / np.maximum(chunks, 1.0), mean)
    chunk_std = np.where(group > 0, 0.0, std)
    block_longest = np.minimum(chunk_mean + chunk_std * s["sqrt_2_ln_block_v"], longest)
    mean_steps = np.where(edge > 0, 1.0, np.ceil(np.maximum(block_longest, 1.0) / block_e))
    slots = np.where(edge > 0, blocks * block_e, blocks * block_v * mean_steps * block_e)
    waste = np.clip(1.0 - E / np.maximum(slots, 1.0), 0.0, 1.0)
    # Message creation writes each output once; gathers combine run ends (edge) or split rows (group).
    gathers = np.asarray(gather != "none", dtype=np.float64)
    atomics = gathers * np.where(edge > 0, 2 * blocks, np.where(group > 0, np.maximum(E / safe_group - rows, 0.0), 0.0))

    # The graph's log-sizes in one pass: at selection they are scalars, and numpy's cost is per call.
    logs = _log2(np.stack([np.asarray(c[column], dtype=np.float64) for column in _LOGGED_GRAPH_COLUMNS.values()]))
    values = {
        **dict(zip(_LOGGED_GRAPH_COLUMNS, logs)),
        "row_skew": np.arcsinh(c["row_skew"]),
        "row_top1": c["row_top1_fraction"],
        "row_isolated": c["row_isolated_fraction"],
        "log_row_max_over_mean": np.log2((dmax + 1.0) / (mean + 1.0)),
        "col_skew": np.arcsinh(c["col_skew"]),
        "col_top1": c["col_top1_fraction"],
        "col_isolated": c["col_isolated_fraction"],
        "is_message": np.asarray(gather == "none", dtype=np.float64),
        "gather_sum": np.asarray(gather == "sum", dtype=np.float64),
        "gather_mean": np.asarray(gather == "mean", dtype=np.float64),
        "gather_extreme": np.asarray((gather == "max") | (gather == "min"), dtype=np.float64),
        "n_src": c["n_src"],
        "n_dst": c["n_dst"],
        "n_edge": c["n_edge"],
        "reduces": c["reduces"],
        "expr_size": c["expr_size"],
        "log_F": np.log2(np.maximum(F, 1.0)),
        "log_reduce_size": np.log2(reduce_size),
        "log_out_width": np.log2(width),
        "itemsize": c["itemsize"],
        "sm_count": c["sm_count"],
        "cc": c["cc"],
        "log_work": _log2(E * F * c["itemsize"]),
        **{name: s[name] for name in _SCHEDULE_FEATURES},
        "feature_tiles": feature_tiles,
        "lane_use": lane_use,
        "log_programs": _log2(programs),
        "log_waves": np.log2(programs / np.maximum(c["sm_count"], 1.0) + 1.0),
        "log_items_per_program": _log2(E / blocks),
        "log_max_steps": _log2(max_steps),
        "log_mean_steps": _log2(mean_steps),
        "waste": waste,
        "log_atomics": _log2(atomics),
        "splits_rows": np.asarray((group > 0) & (dmax > group_size), dtype=np.float64),
    }
    # Filled feature by feature (contiguous rows; the per-case scalars in one assignment), then
    # laid out one candidate per row.
    out = np.empty((len(FEATURES), n), dtype=np.float32)
    per_case = []
    for index, name in enumerate(FEATURES):
        value = values[name]
        if isinstance(value, np.ndarray) and value.ndim > 0:
            out[index] = value
        else:
            per_case.append(index)
    out[per_case] = np.array([values[FEATURES[index]] for index in per_case], dtype=np.float32)[:, None]
    return np.ascontiguousarray(out.T)


def frame_features(table) -> np.ndarray:
    """The model's matrix for a collected table (a pandas DataFrame with every base column)."""
    missing = [name for name in CASE_COLUMNS + KNOB_COLUMNS if name not in table.columns]
    if missing:
        raise ValueError(f"table: missing columns {missing}")
    columns = {name: table[name].to_numpy() for name in CASE_COLUMNS + KNOB_COLUMNS}
    for name in ("gather", "strategy"):
        columns[name] = columns[name].astype(object)
    for name, value in columns.items():
        if name not in ("gather", "strategy"):
            columns[name] = value.astype(np.float64)
    return derive(columns)


def case_features(
    stats: GraphStats,
    op: OpInfo,
    F: int,
    reduce_size: int,
    dtype: torch.dtype,
    gpu: GpuInfo,
    infos: Optional[Sequence[ParallelInfo]] = None,
) -> Tuple[Tuple[ParallelInfo, ...], np.ndarray]:
    """Every candidate of the design space for one case (or the schedules ``infos``), and its
    feature matrix."""
    if infos is None:
        infos, knobs, schedule = candidates(op.gather_op is None, F)
    else:
        infos = tuple(infos)
        knobs = knob_columns(list(infos))
        schedule = schedule_terms(knobs)
    columns: Dict[str, Column] = dict(case_columns(stats, op, F, reduce_size, dtype, gpu))
    columns.update(knobs)
    return infos, derive(columns, schedule)
