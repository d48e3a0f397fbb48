"""Runtime selection: the schedule for one (graph, operator, width, dtype, device).

Decisions are cached per (graph statistics, op, width, dtype, device): the statistics are cached
on the graph's structure, so a repeated call costs one dictionary lookup.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from pyg_ugrapher.graph import CSR, GraphStats, csr_stats
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo

from .heuristic import heuristic

_CACHE: Dict[Tuple, ParallelInfo] = {}


def _stats(graph) -> GraphStats:
    if isinstance(graph, GraphStats):
        return graph
    if isinstance(graph, CSR):
        return csr_stats(graph)
    return graph.stats()


def select(graph: Union[CSR, GraphStats, "GraphTensor"], op: OpInfo, F: int,  # noqa: F821
           dtype: torch.dtype = torch.float32, *, reduce_size: int = 1,
           device: Optional[Union[str, torch.device]] = None) -> ParallelInfo:
    """The schedule for ``op`` with ``F`` message features (flat) on ``graph``.

    Args:
        graph: a GraphTensor, one of its CSRs, or precomputed statistics.
        op: the operator.
        F: message features per edge (for ``dot``, the summed features times the outputs).
        dtype: the operands' dtype.
        reduce_size: features summed into one output (``C`` for ``dot``, else 1).
        device: where it runs; default: the graph's device (CUDA if the statistics are given).
    """
    stats = _stats(graph)
    if device is None:
        device = getattr(graph, "device", "cuda")
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    key = (stats, op, F, reduce_size, dtype, device.type)
    choice = _CACHE.get(key)
    if choice is None:
        choice = heuristic(stats, op, F, on_gpu)
        _CACHE[key] = choice
    return choice
