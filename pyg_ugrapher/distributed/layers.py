r"""Our layers on a partitioned graph, and the gradient sum that keeps the replicas equal.

:func:`layer_forward` runs one layer of :mod:`pyg_ugrapher.nn` on a rank's
:class:`DistributedGraph`: it fetches the halo rows the layer reads (:func:`halo_exchange`), then
calls our operators on the local graph. Every rank holds a replica of the model; its loss covers
its own vertices, and :func:`all_reduce_gradients` sums the parameter gradients over the ranks, so
that every replica takes the step that training on the whole graph on one device takes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from .. import ops
from ..nn import GCNConv, GINConv, GraphConv, SAGEConv
from .graph import DistributedGraph
from .halo import with_halo

#: Layers that take ``(x_src, x_dst)`` and ``size``: they run on the local graph as they are.
BIPARTITE_LAYERS = (SAGEConv, GraphConv, GINConv)


def layer_forward(conv: nn.Module, x: Tensor, graph: DistributedGraph) -> Tensor:
    r"""``conv`` on this rank's vertices: the rows of ``conv(x_whole, edge_index_whole)`` that
    belong to ``graph.nodes``.

    A collective: every rank calls it with its own ``x`` (and takes part in the backward pass).

    * :class:`~pyg_ugrapher.nn.GCNConv` (sum aggregation, no edge weights): the linear map on the
      local rows, its halo rows fetched, then one ``u_mul_e_sum`` over the local graph with the
      whole graph's normalisation (:meth:`DistributedGraph.gcn_norm`); without ``normalize``, a
      ``copy_u_sum``.
    * :class:`~pyg_ugrapher.nn.SAGEConv`, :class:`~pyg_ugrapher.nn.GraphConv`,
      :class:`~pyg_ugrapher.nn.GINConv`: the layer itself on ``(x with its halo, x)`` and the
      local graph, as a bipartite call.

    Args:
        conv (nn.Module): one of the layers above.
        x (Tensor): ``[graph.num_local, F]`` features of the local vertices.
        graph (DistributedGraph): this rank's share of the graph.
    """
    if not isinstance(graph, DistributedGraph):
        raise TypeError(f"graph: expected a DistributedGraph, got {type(graph).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError("x: expected a [num_local, F] tensor of the local vertices' features")
    if x.size(0) != graph.num_local:
        raise ValueError(f"x: expected {graph.num_local} rows (the local vertices), got {x.size(0)}")
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        raise ValueError(
            "conv: a partitioned graph holds the incoming edges of its vertices; use flow='source_to_target'"
        )
    if isinstance(conv, GCNConv):
        return _gcn(conv, x, graph)
    if isinstance(conv, BIPARTITE_LAYERS):
        return conv((with_halo(x, graph.plan), x), graph.edge_index, size=(graph.num_sources, graph.num_local))
    names = ", ".join(layer.__name__ for layer in (GCNConv, *BIPARTITE_LAYERS))
    raise TypeError(f"conv: expected one of pyg_ugrapher.nn's {names}, got {type(conv).__name__}")


def _gcn(conv: GCNConv, x: Tensor, graph: DistributedGraph) -> Tensor:
    if conv.aggr not in ("add", "sum"):
        raise ValueError(f"conv: a partitioned GCNConv sums its messages, got aggr={conv.aggr!r}")
    h = with_halo(conv.lin(x), graph.plan)
    if conv.normalize:
        norm = graph.gcn_norm(conv.add_self_loops, h.dtype)
        out = ops.compute(norm.graph, "u_mul_e_sum", h, norm.weight)
    else:
        out = ops.compute(graph.graph, "copy_u_sum", h)
    return out if conv.bias is None else out + conv.bias


def all_reduce_gradients(module: nn.Module, group: Optional[ProcessGroup] = None) -> None:
    r"""Sum the gradients of ``module``'s parameters over the ranks, in place (one
    ``all_reduce`` per dtype and device). With each rank's loss the sum over its own vertices
    divided by the whole graph's count, the sums are the gradient of the whole graph's mean loss.

    A collective: every rank calls it after its backward pass, with the same parameters holding
    gradients.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected an nn.Module, got {type(module).__name__}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    groups: Dict[tuple, List[Tensor]] = defaultdict(list)
    for parameter in module.parameters():
        if parameter.grad is not None:
            groups[(parameter.grad.dtype, parameter.grad.device)].append(parameter.grad)
    for grads in groups.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for grad, total in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(total.view_as(grad))
