"""The benchmark graph corpus: real graphs from :mod:`pyg_ugrapher.datasets` and seeded synthetic ones.

Synthetic graphs are generated on the benchmark device (uniform endpoints, or Chung-Lu power-law
degrees with weights ``rank^-0.8``), so a graph of 1.6e7 edges takes well under a second on a GPU.
Edges stay in the generator's (random) order: that is what a user hands to PyG, and our side
builds its structures from it once, outside the timed calls (sorted, or kept in that order on the
small GPU graphs whose kernels read it so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
from torch import Tensor

import pyg_ugrapher as ug
from pyg_ugrapher.structure import recording_steps

#: Real graphs timed first (small, and PyG's classic benchmarks); the other shared datasets follow.
PLANETOID = ("cora", "citeseer", "pubmed")


def _short(count: int) -> str:
    for unit, scale in (("M", 10**6), ("k", 10**3)):
        if count >= scale:
            return f"{count / scale:g}{unit}"
    return str(count)


@dataclass(frozen=True)
class GraphSpec:
    """How to obtain one benchmark graph: a dataset name (``kind="real"``) or generator arguments."""

    kind: str  #: "real", "uniform" or "power_law"
    dataset: str = ""  #: for real graphs, the name :func:`pyg_ugrapher.datasets.load_dataset` takes
    num_nodes: int = 0  #: for synthetic graphs
    num_edges: int = 0  #: for synthetic graphs
    seed: int = 0

    @property
    def name(self) -> str:
        if self.kind == "real":
            return self.dataset
        return f"{self.kind}-{_short(self.num_edges)}"

    def load(self, device: torch.device) -> "LoadedGraph":
        from pyg_ugrapher import datasets

        if self.kind == "real":
            data = datasets.load_dataset(self.dataset)
            return LoadedGraph(self, data.edge_index.to(device), int(data.num_nodes))
        generate = datasets.uniform_graph if self.kind == "uniform" else datasets.power_law_graph
        edge_index = generate(self.num_nodes, self.num_edges, seed=self.seed, device=device)
        return LoadedGraph(self, edge_index, self.num_nodes)


@dataclass
class LoadedGraph:
    """A graph on the benchmark device, and our :class:`~pyg_ugrapher.GraphTensor` of it."""

    spec: GraphSpec
    edge_index: Tensor
    num_nodes: int
    _graph: Optional[ug.GraphTensor] = field(default=None, repr=False)
    _recorded_graph: Optional[ug.GraphTensor] = field(default=None, repr=False)

    @property
    def num_edges(self) -> int:
        return self.edge_index.size(1)

    @property
    def graph(self) -> ug.GraphTensor:
        """Built once per graph, so its CSR/CSC and statistics are shared by every op and F."""
        if self._graph is None:
            self._graph = ug.GraphTensor.from_edge_index(self.edge_index, self.num_nodes)
        return self._graph

    @property
    def recorded_graph(self) -> ug.GraphTensor:
        """Another :class:`~pyg_ugrapher.GraphTensor` of the edges, its structure built as a
        recorded step builds it (:func:`~pyg_ugrapher.structure.recording_steps`): sorted and marked
        as read by recorded steps, so that its operators run the schedules every replay of such a
        step runs (the cost model's, on small graphs too). Built once per graph."""
        if self._recorded_graph is None:
            graph = ug.GraphTensor.from_edge_index(self.edge_index, self.num_nodes)
            with recording_steps():
                # eager_structure: it replaces a structure in the user's order that construction
                # built (a small GPU graph's) by the sorted one.
                graph.eager_structure(self.edge_index.device)
            self._recorded_graph = graph
        return self._recorded_graph

    def columns(self) -> dict:
        return {
            "graph": self.spec.name,
            "graph_kind": self.spec.kind,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
        }


def _synthetic(num_nodes: int, num_edges: int) -> List[GraphSpec]:
    return [GraphSpec(kind, num_nodes=num_nodes, num_edges=num_edges) for kind in ("uniform", "power_law")]


def headline_graphs(tiny: bool = False) -> List[GraphSpec]:
    """The project issue's setting: 1e6 vertices, 1.6e7 edges, uniform and power-law."""
    return _synthetic(300, 4_800) if tiny else _synthetic(1_000_000, 16_000_000)


def layer_graphs(tiny: bool = False) -> List[GraphSpec]:
    """One training step of one layer: 2e5 vertices, 4e6 edges, uniform and power-law; and PubMed,
    a graph of the size most users train on (8.9e4 edges), where host time counts."""
    return _synthetic(200, 3_200) if tiny else _synthetic(200_000, 4_000_000) + [GraphSpec("real", "pubmed")]


def ops_graphs(tiny: bool = False) -> List[GraphSpec]:
    """Operator-level corpus: Planetoid, synthetic graphs of 1e5, 4e6 (mean degree 16) and 1.6e7
    edges (the headline graphs), then every other shared dataset, in the loader's order."""
    if tiny:
        return [GraphSpec("real", "cora")] + _synthetic(100, 1_600)
    from pyg_ugrapher.datasets import available_datasets

    specs = [GraphSpec("real", name) for name in PLANETOID]
    for num_edges in (100_000, 4_000_000):
        specs += _synthetic(num_edges // 16, num_edges)
    specs += headline_graphs()
    specs += [GraphSpec("real", name) for name in available_datasets() if name not in PLANETOID]
    return specs


def select(specs: Sequence[GraphSpec], names: Optional[Sequence[str]]) -> List[GraphSpec]:
    """The specs named in ``names`` (all when ``None``), in corpus order."""
    return [spec for spec in specs if names is None or spec.name in names]
