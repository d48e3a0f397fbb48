r"""Vertex partitions of a graph: which rank owns which vertex.

:func:`partition_graph` splits the vertices into ``num_parts`` parts and returns a
:class:`Partition`: the part of every vertex, its row on that part, and the number of edges cut.
Three methods:

* ``"metis"``: METIS (through ``pymetis``, when importable) on the symmetrised graph without self
  loops or duplicate edges, balanced vertex counts, fewest cut edges;
* ``"contiguous"``: equal ranges of vertex ids, which keeps the locality of a graph whose ids
  already cluster (a block-diagonal collection of graphs, a reordered graph);
* ``"random"``: a seeded random balanced assignment, the baseline every other method must beat.

``"auto"`` picks METIS when ``pymetis`` imports and the contiguous split otherwise.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch
from torch import Tensor

try:  # optional: METIS partitions
    import pymetis
except ImportError:
    pymetis = None

METHODS = ("auto", "metis", "contiguous", "random")


@dataclass(frozen=True)
class Partition:
    r"""The parts of a graph's vertices.

    Args:
        assignment: ``[N]`` int64, the part of every vertex.
        local_index: ``[N]`` int64, every vertex's row on its part (vertices of a part are numbered
            in increasing global id).
        sizes: the number of vertices of every part.
        method: the method that made it (``"metis"``, ``"contiguous"`` or ``"random"``).
        cut_edges: the number of edges whose endpoints lie in different parts: every one of them
            makes its source a halo vertex of its destination's part.
    """

    assignment: Tensor
    local_index: Tensor
    sizes: Tuple[int, ...]
    method: str
    cut_edges: int

    @property
    def num_parts(self) -> int:
        return len(self.sizes)

    @property
    def num_nodes(self) -> int:
        return self.assignment.numel()

    def nodes(self, part: int) -> Tensor:
        """The global ids of the vertices of ``part``, increasing (row ``i`` of the part is vertex
        ``nodes(part)[i]``)."""
        if isinstance(part, bool) or not isinstance(part, numbers.Integral) or not 0 <= part < self.num_parts:
            raise ValueError(f"part: expected an int in [0, {self.num_parts}), got {part!r}")
        return (self.assignment == part).nonzero().flatten()


def metis_available() -> bool:
    """Whether ``pymetis`` can be imported (``method="metis"`` needs it)."""
    return pymetis is not None


def partition_graph(
    edge_index: Tensor, num_nodes: int, num_parts: int, method: str = "auto", *, seed: int = 0
) -> Partition:
    r"""Split the vertices of a graph into ``num_parts`` parts.

    Args:
        edge_index (Tensor): ``[2, E]`` integer edges, source row first, on any device (the
            partition is returned on the CPU).
        num_nodes (int): Number of vertices.
        num_parts (int): Number of parts (one per rank), at most ``num_nodes``.
        method (str, optional): ``"metis"``, ``"contiguous"``, ``"random"`` or ``"auto"`` (METIS if
            ``pymetis`` is importable, else contiguous). (default: :obj:`"auto"`)
        seed (int, optional): Seed of the random split and of METIS. (default: :obj:`0`)

    Returns:
        A :class:`Partition`.
    """
    num_nodes = _positive("num_nodes", num_nodes)
    num_parts = _positive("num_parts", num_parts)
    if num_parts > num_nodes:
        raise ValueError(f"num_parts: at most num_nodes={num_nodes} parts, got {num_parts}")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError("edge_index: expected a tensor of shape [2, E]")
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index: expected integer indices, got {edge_index.dtype}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index: vertex ids must lie in [0, {num_nodes})")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    if method == "auto":
        method = "metis" if metis_available() else "contiguous"
    if method == "metis" and not metis_available():
        raise ValueError(
            "method: 'metis' needs the pymetis package (pip install pymetis); use 'contiguous' or 'random' without it"
        )

    if num_parts == 1:
        assignment = torch.zeros(num_nodes, dtype=torch.int64)
    elif method == "contiguous":
        # Part p holds ids [p * N / K, (p + 1) * N / K): sizes differ by at most one.
        assignment = torch.arange(num_nodes, dtype=torch.int64) * num_parts // num_nodes
    elif method == "random":
        generator = torch.Generator().manual_seed(int(seed))
        order = torch.randperm(num_nodes, generator=generator)
        assignment = torch.empty(num_nodes, dtype=torch.int64)
        assignment[order] = torch.arange(num_nodes, dtype=torch.int64) * num_parts // num_nodes
    else:
        assignment = _metis(edge_index.detach().to("cpu", torch.int64), num_nodes, num_parts, int(seed))

    sizes = torch.bincount(assignment, minlength=num_parts)
    if int(sizes.min()) == 0:
        raise ValueError(f"num_parts: the {method} split left a part without vertices; use fewer parts")
    # Row of every vertex on its part: its rank among the part's vertices in increasing id.
    order = torch.argsort(assignment, stable=True)
    starts = torch.cumsum(sizes, 0) - sizes
    local_index = torch.empty(num_nodes, dtype=torch.int64)
    local_index[order] = torch.arange(num_nodes, dtype=torch.int64) - starts.repeat_interleave(sizes)
    # Counted where the edges are: a graph of 1e8+ edges stays on its GPU.
    on_edges = assignment.to(edge_index.device)
    cut = int((on_edges[edge_index[0]] != on_edges[edge_index[1]]).sum())
    return Partition(assignment, local_index, tuple(sizes.tolist()), method, cut)


def _metis(edges: Tensor, num_nodes: int, num_parts: int, seed: int) -> Tensor:
    """METIS's k-way partition of the symmetrised simple graph."""
    src = torch.cat([edges[0], edges[1]])
    dst = torch.cat([edges[1], edges[0]])
    keep = src != dst
    keys = torch.unique(src[keep] * num_nodes + dst[keep])  # sorted: rows in order, no duplicates
    rows, cols = keys // num_nodes, keys % num_nodes
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    xadj[1:] = np.cumsum(np.bincount(rows.numpy(), minlength=num_nodes))
    options = pymetis.Options(seed=seed)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2; older ones take the arrays as they are
        graph = {"adjacency": pymetis.CSRAdjacency(xadj, cols.numpy())}
    else:
        graph = {"xadj": xadj, "adjncy": cols.numpy()}
    _, parts = pymetis.part_graph(num_parts, options=options, **graph)
    return torch.as_tensor(np.asarray(parts), dtype=torch.int64)


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: must be positive, got {value}")
    return int(value)
