r"""One rank's share of a partitioned graph.

A rank owns the vertices of its part (*local* rows, numbered as :attr:`Partition.local_index`
says) and every edge whose destination it owns. Its local graph has ``num_local`` destinations and
``num_local + num_halo`` sources: first its own rows, then its *halo*, the remote sources of its
edges, grouped by owner rank. A layer reads the halo's rows through :func:`halo_exchange` and then
runs our operators on the local graph, so the whole graph's features never meet on one device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..graph import GraphTensor
from .halo import HaloPlan, with_halo
from .partition import Partition


class NormalizedGraph(NamedTuple):
    r"""The graph a GCN layer propagates on and its edge weights
    :math:`\hat{d}_u^{-1/2} \hat{d}_v^{-1/2}`, from the whole graph's degrees."""

    graph: GraphTensor
    weight: Tensor


@dataclass(frozen=True)
class DistributedGraph:
    r"""One rank's local graph and halo plan (build it with :meth:`from_partition`).

    Args:
        rank: this rank (its part of the partition).
        world_size: the number of ranks (parts).
        num_nodes: the number of vertices of the whole graph.
        nodes: ``[num_local]`` the whole graph's id of every local row.
        halo_nodes: ``[num_halo]`` the whole graph's id of every halo row, grouped by owner rank,
            increasing within a rank.
        edge_index: ``[2, E_local]`` the local edges (the whole graph's edges into local vertices,
            in their order); sources in ``[0, num_local + num_halo)`` (local rows, then halo rows),
            destinations in ``[0, num_local)``.
        plan: the halo exchange (:class:`HaloPlan`).
        edge_ids: ``[E_local]`` the position of every local edge in the edge index it was built
            from (:meth:`from_partition`'s ``edge_index``): ``edge_attr[graph.edge_ids]`` gives the
            local edges' features. ``None`` where the graph was built otherwise.
    """

    rank: int
    world_size: int
    num_nodes: int
    nodes: Tensor
    halo_nodes: Tensor
    edge_index: Tensor
    plan: HaloPlan
    edge_ids: Optional[Tensor] = None
    _cache: Dict[object, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_local(self) -> int:
        return self.nodes.numel()

    @property
    def num_halo(self) -> int:
        return self.halo_nodes.numel()

    @property
    def num_sources(self) -> int:
        """Rows a layer reads: the local ones, then the halo."""
        return self.num_local + self.num_halo

    @property
    def num_edges(self) -> int:
        """Edges into local vertices."""
        return self.edge_index.size(1)

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    @property
    def graph(self) -> GraphTensor:
        """The local graph as a :class:`GraphTensor` (``num_sources`` sources, ``num_local``
        destinations), for :func:`pyg_ugrapher.compute`."""
        if "graph" not in self._cache:
            src, dst = self.edge_index
            self._cache["graph"] = GraphTensor(src, dst, self.num_sources, self.num_local, validate=False)
        return self._cache["graph"]

    @classmethod
    def from_partition(
        cls,
        edge_index: Tensor,
        partition: Partition,
        *,
        group: Optional[ProcessGroup] = None,
        device: Optional[torch.device] = None,
    ) -> "DistributedGraph":
        r"""This rank's share of a graph (a collective: every rank of ``group`` calls it).

        Args:
            edge_index (Tensor): ``[2, E]`` edges of the whole graph, or any subset holding at least
                every edge into this rank's vertices (the others are dropped).
            partition (Partition): the vertex partition, one part per rank, the same on every rank.
            group (ProcessGroup, optional): the process group; ``None``: the default one, or one
                process when ``torch.distributed`` is not initialised.
            device (torch.device, optional): where the local graph lives (NCCL needs the rank's
                GPU). (default: ``edge_index``'s device)
        """
        if not isinstance(partition, Partition):
            raise TypeError(f"partition: expected a Partition, got {type(partition).__name__}")
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError("edge_index: expected a tensor of shape [2, E]")
        if edge_index.is_floating_point() or edge_index.dtype == torch.bool:
            raise TypeError(f"edge_index: expected integer indices, got {edge_index.dtype}")
        initialized = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank(group) if initialized else 0
        world_size = dist.get_world_size(group) if initialized else 1
        if partition.num_parts != world_size:
            raise ValueError(f"partition: {partition.num_parts} parts for {world_size} ranks")
        num_nodes = partition.num_nodes
        if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
            raise ValueError(f"edge_index: vertex ids must lie in [0, {num_nodes}) (the partition's vertices)")
        device = edge_index.device if device is None else torch.device(device)

        assignment = partition.assignment.to(device)
        local_index = partition.local_index.to(device)
        edges = edge_index.to(device=device, dtype=torch.int64)
        edge_ids = (assignment[edges[1]] == rank).nonzero().flatten()
        edges = edges[:, edge_ids]
        src, dst = edges[0], edges[1]
        owner = assignment[src]
        remote = owner != rank
        # Halo keys sort by owner rank, then id: the order in which the halo arrives.
        remote_keys = owner[remote] * num_nodes + src[remote]
        halo_keys = torch.unique(remote_keys)
        halo_nodes = halo_keys % num_nodes
        recv_counts = torch.bincount(halo_keys // num_nodes, minlength=world_size).tolist()

        num_local = partition.sizes[rank]
        local_src = local_index[src]
        local_src[remote] = num_local + torch.searchsorted(halo_keys, remote_keys)
        local_edges = torch.stack([local_src, local_index[dst]])
        plan = HaloPlan.exchange_requests(local_index[halo_nodes], recv_counts, num_local, group)
        nodes = (assignment == rank).nonzero().flatten()
        return cls(rank, world_size, num_nodes, nodes, halo_nodes, local_edges, plan, edge_ids)

    @property
    def looped_graph(self) -> GraphTensor:
        """The local graph with a self loop of every local vertex after its edges (stored loops
        kept in their places), as :class:`pyg_ugrapher.nn.GCNConv` propagates weighted edges."""
        if "looped" not in self._cache:
            src, dst = self.edge_index
            loops = torch.arange(self.num_local, device=self.device)
            src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
            self._cache["looped"] = GraphTensor(src, dst, self.num_sources, self.num_local, validate=False)
        return self._cache["looped"]

    def gcn_norm(self, add_self_loops: bool = True, dtype: torch.dtype = torch.float32) -> NormalizedGraph:
        r"""The local graph of a GCN layer and its symmetric normalisation by the **whole graph's**
        degrees, as :class:`pyg_ugrapher.nn.GCNConv` computes it on one device: with
        ``add_self_loops``, stored self loops are dropped, every local vertex gets one loop and
        :math:`\hat{d}_v` counts ``v``'s other incoming edges plus 1; without, :math:`\hat{d}_v` is
        the in-degree and a vertex without edges weighs 0.

        A collective the first time (every rank calls it): the degrees of halo vertices come from
        their owners. Cached per ``(add_self_loops, dtype)``.
        """
        key = ("gcn_norm", bool(add_self_loops), dtype)
        if key not in self._cache:
            src, dst = self.edge_index
            if add_self_loops:
                keep = src != dst
                loops = torch.arange(self.num_local, device=self.device)
                src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
            accumulate = torch.float64 if dtype == torch.float64 else torch.float32
            degree = torch.bincount(dst, minlength=self.num_local).to(accumulate)
            factor = degree.rsqrt().masked_fill_(degree == 0, 0.0)
            weight = with_halo(factor, self.plan).index_select(0, src).mul_(factor.index_select(0, dst))
            graph = GraphTensor(src, dst, self.num_sources, self.num_local, validate=False)
            self._cache[key] = NormalizedGraph(graph, weight.to(dtype))
        return self._cache[key]
