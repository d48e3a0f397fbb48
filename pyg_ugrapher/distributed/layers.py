r"""Our layers on a partitioned graph, and the gradient sum that keeps the replicas equal.

:func:`layer_forward` runs one layer of :mod:`pyg_ugrapher.nn` on a rank's
:class:`DistributedGraph`: it fetches the halo rows the layer reads (:func:`halo_exchange`), then
calls our operators on the local graph. Every rank holds a replica of the model; its loss covers
its own vertices, and :func:`all_reduce_gradients` sums the parameter gradients over the ranks, so
that every replica takes the step that training on the whole graph on one device takes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.nn.parameter import is_lazy

from .. import ops
from ..graph import GraphTensor
from ..graph_argument import edge_tensor
from ..nn import GATConv, GATv2Conv, GCNConv, GINConv, GINEConv, GraphConv, SAGEConv
from .graph import DistributedGraph
from .halo import with_halo

#: Layers that take ``(x_src, x_dst)``: they run on the local graph as they are. Its sources are
#: the local rows first, so an attention layer's self loops (of the first ``num_local`` sources)
#: are the local vertices' own.
BIPARTITE_LAYERS = (SAGEConv, GraphConv, GINConv, GINEConv, GATConv, GATv2Conv)
#: Of those, the ones that read the sizes from the pair alone (no ``size`` argument).
SIZED_BY_PAIR = (GATv2Conv,)
#: Of those, the ones that take edge features (``edge_attr``).
EDGE_FEATURE_LAYERS = (GINEConv, GATConv, GATv2Conv)
#: The layers that take edge weights (``edge_weight``) on a partitioned graph.
EDGE_WEIGHT_LAYERS = (GCNConv, GraphConv)
#: Layers whose output is ``lin(aggregate(x_j)) + root(x_i)``, by the names of ``lin`` and ``root``:
#: with a sum or mean aggregation, ``lin``'s product may come before the aggregation.
LINEAR_THEN_ROOT = {SAGEConv: ("lin_l", "lin_r"), GraphConv: ("lin_rel", "lin_root")}


def layer_forward(
    conv: nn.Module,
    x: Tensor,
    graph: DistributedGraph,
    edge_attr: Optional[Tensor] = None,
    edge_weight: Optional[Tensor] = None,
) -> Tensor:
    r"""``conv`` on this rank's vertices: the rows of ``conv(x_whole, edge_index_whole)`` that
    belong to ``graph.nodes``.

    A collective: every rank calls it with its own ``x`` (and takes part in the backward pass).
    ``x`` holds the local rows (``[graph.num_local, F]``), whose halo the layer fetches, or the
    local rows followed by their halo (``[graph.num_sources, F]``, from :func:`with_halo`): the
    features of the data, which need no gradient, are fetched once that way and every epoch's
    first layer then exchanges nothing.

    * :class:`~pyg_ugrapher.nn.GCNConv` (sum aggregation): one ``u_mul_e_sum`` over the local
      graph with the whole graph's normalisation (:meth:`DistributedGraph.gcn_norm`; with
      ``edge_weight``, of the weighted degrees, computed per call); without ``normalize``, a
      ``copy_u_sum`` (or the weighted sum).
    * :class:`~pyg_ugrapher.nn.SAGEConv` and :class:`~pyg_ugrapher.nn.GraphConv` with a sum or
      mean aggregation: the aggregation of the sources (GraphConv's weighted by ``edge_weight``),
      the root term of the local rows.
    * Both multiply by a weight and aggregate linearly, so either may come first; the narrower
      side is aggregated and exchanged (:func:`aggregate_first`).
    * :class:`~pyg_ugrapher.nn.GINConv`, :class:`~pyg_ugrapher.nn.GINEConv`,
      :class:`~pyg_ugrapher.nn.GATConv`, :class:`~pyg_ugrapher.nn.GATv2Conv`, and SAGEConv and
      GraphConv with any other aggregation: the layer itself on ``(x with its halo, x)`` and the
      local graph, as a bipartite call (the halo is exchanged at the input's width), with the
      local edges' features for the layers that take them. Every edge into a vertex is local, so
      a self loop's features filled from its incoming edges (GAT's ``fill_value``) are the whole
      graph's.

    Args:
        conv (nn.Module): one of the layers above.
        x (Tensor): ``[graph.num_local, F]`` features of the local vertices, or
            ``[graph.num_sources, F]`` with their halo.
        graph (DistributedGraph): this rank's share of the graph.
        edge_attr (Tensor, optional): ``[graph.num_edges, ...]`` features of the local edges
            (``edge_attr_whole[graph.edge_ids]``), for GINEConv, GATConv and GATv2Conv.
        edge_weight (Tensor, optional): ``[graph.num_edges]`` weights of the local edges
            (``edge_weight_whole[graph.edge_ids]``), for GCNConv and GraphConv.
    """
    if not isinstance(graph, DistributedGraph):
        raise TypeError(f"graph: expected a DistributedGraph, got {type(graph).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError("x: expected a [num_local, F] tensor of the local vertices' features")
    if x.size(0) not in (graph.num_local, graph.num_sources):
        raise ValueError(
            f"x: expected {graph.num_local} rows (the local vertices) or {graph.num_sources} (with their "
            f"halo), got {x.size(0)}"
        )
    if graph.num_halo and x.size(0) == graph.num_sources and x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "x: its halo rows were fetched ahead, so their gradients cannot reach their owners; pass the "
            "local rows of an input that needs a gradient"
        )
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        raise ValueError(
            "conv: a partitioned graph holds the incoming edges of its vertices; use flow='source_to_target'"
        )
    _check_edge_tensor("edge_attr", edge_attr, conv, EDGE_FEATURE_LAYERS, graph)
    _check_edge_tensor("edge_weight", edge_weight, conv, EDGE_WEIGHT_LAYERS, graph)
    if edge_weight is not None and edge_weight.dim() != 1:
        raise ValueError(f"edge_weight: expected shape [{graph.num_edges}], got {list(edge_weight.shape)}")
    if isinstance(conv, GCNConv):
        return _gcn(conv, x, graph, edge_weight)
    names = LINEAR_THEN_ROOT.get(type(conv))
    if names is not None and _sums_its_sources(conv):
        return _linear_then_root(conv, *names, x, graph, edge_weight)
    if isinstance(conv, BIPARTITE_LAYERS):
        pair = (_sources(x, graph), x[: graph.num_local])
        edges = {}
        if isinstance(conv, EDGE_FEATURE_LAYERS):
            edges["edge_attr"] = edge_attr
        if isinstance(conv, EDGE_WEIGHT_LAYERS):
            edges["edge_weight"] = edge_weight
        if isinstance(conv, SIZED_BY_PAIR):
            return conv(pair, graph.edge_index, **edges)
        return conv(pair, graph.edge_index, size=(graph.num_sources, graph.num_local), **edges)
    names = ", ".join(layer.__name__ for layer in (GCNConv, *BIPARTITE_LAYERS))
    raise TypeError(f"conv: expected one of pyg_ugrapher.nn's {names}, got {type(conv).__name__}")


def _check_edge_tensor(
    name: str, tensor: Optional[Tensor], conv: nn.Module, layers: Tuple[type, ...], graph: DistributedGraph
) -> None:
    """A clear error for a per-edge tensor that ``conv`` does not take here or that has no row
    per local edge."""
    if tensor is None:
        return
    if not isinstance(conv, layers):
        names = ", ".join(layer.__name__ for layer in layers)
        raise ValueError(f"{name}: on a partitioned graph only {names} take it, not {type(conv).__name__}")
    edge_tensor(name, tensor, graph.num_edges)
    if tensor.device != graph.device:
        raise ValueError(f"{name}: on {tensor.device}, but the local graph is on {graph.device}")


def aggregate_first(x: Tensor, weight: Tensor) -> bool:
    r"""Whether ``aggregate(x) @ weight.T`` runs cheaper than ``aggregate(x @ weight.T)`` for a
    linear aggregation (both are the same).

    A pass over the edges and an exchange cost the width of what they carry: ``x``'s width
    (``weight.size(1)``) aggregated first, the output width (``weight.size(0)``) multiplied first.
    Aggregated first, the backward passes over the edges only where ``x`` needs a gradient; the
    product first, also for the weight's gradient. Ties keep PyG's order (the product first).
    """
    grad = torch.is_grad_enabled()
    passes_aggregated = 2 if grad and x.requires_grad else 1
    passes_multiplied = 2 if grad and (x.requires_grad or weight.requires_grad) else 1
    return weight.size(1) * passes_aggregated < weight.size(0) * passes_multiplied


def _sums_its_sources(conv: nn.Module) -> bool:
    """Whether ``conv`` aggregates its unprojected source rows by a fused sum or mean (not PyG's
    path: explain mode, hooks; not a projection of the sources first)."""
    return conv._gather in ("sum", "mean") and conv.unfused_reason() is None and not getattr(conv, "project", False)


def _sources(x: Tensor, graph: DistributedGraph) -> Tensor:
    """The source rows of the local graph: ``x`` where it holds its halo already."""
    return x if x.size(0) == graph.num_sources else with_halo(x, graph.plan)


def _weight(lin: nn.Module, x: Tensor) -> Tensor:
    """``lin``'s weight; a lazy PyG ``Linear`` (``in_channels=-1``) takes its shape from ``x``."""
    if is_lazy(lin.weight):
        lin(x[:0])
    return lin.weight


def _multiplied_aggregate(x: Tensor, graph: DistributedGraph, weight: Tensor, aggregate) -> Tensor:
    """``aggregate(sources) @ weight.T`` for a linear ``aggregate`` of the source rows, in the
    order :func:`aggregate_first` picks."""
    if aggregate_first(x, weight):
        return F.linear(aggregate(_sources(x, graph)), weight)
    return aggregate(_sources(F.linear(x, weight), graph))


def _gcn(conv: GCNConv, x: Tensor, graph: DistributedGraph, edge_weight: Optional[Tensor] = None) -> Tensor:
    if conv.aggr not in ("add", "sum"):
        raise ValueError(f"conv: a partitioned GCNConv sums its messages, got aggr={conv.aggr!r}")
    if not conv.normalize:
        propagated = graph.graph, edge_weight
    elif edge_weight is None:
        propagated = graph.gcn_norm(conv.add_self_loops, x.dtype)
    else:
        propagated = _weighted_gcn_norm(conv, graph, edge_weight.to(x.dtype))
    on, weight = propagated

    def aggregate(h: Tensor) -> Tensor:
        if weight is None:
            return ops.compute(on, "copy_u_sum", h)
        return ops.compute(on, "u_mul_e_sum", h, weight)

    out = _multiplied_aggregate(x, graph, _weight(conv.lin, x), aggregate)
    return out if conv.bias is None else out + conv.bias


def _weighted_gcn_norm(conv: GCNConv, graph: DistributedGraph, edge_weight: Tensor) -> Tuple[GraphTensor, Tensor]:
    r"""The graph and weights :math:`\hat{d}_u^{-1/2} w_{uv} \hat{d}_v^{-1/2}` of a GCN layer on
    weighted local edges, as :class:`~pyg_ugrapher.nn.GCNConv` computes them on the whole graph:
    a vertex's stored self loop lends its weight to the loop added to it (``fill`` otherwise) and
    keeps its place at weight 0. Every edge into a vertex is local, and so is its weighted
    degree; a halo source's comes from its owner (a collective, differentiable in the weights)."""
    on = graph.graph
    if conv.add_self_loops:
        fill = 2.0 if conv.improved else 1.0
        edge_weight = GCNConv.loop_weights(graph.edge_index, True, edge_weight, graph.num_local, fill)
        on = graph.looped_graph
    src, dst = on.src, on.dst
    degree = edge_weight.new_zeros(graph.num_local).index_add(0, dst, edge_weight)
    factor = degree.pow(-0.5)
    factor = factor.masked_fill(factor == float("inf"), 0.0)
    return on, with_halo(factor, graph.plan).index_select(0, src) * edge_weight * factor.index_select(0, dst)


def _linear_then_root(
    conv: nn.Module,
    lin_name: str,
    root_name: str,
    x: Tensor,
    graph: DistributedGraph,
    edge_weight: Optional[Tensor] = None,
) -> Tensor:
    lin, root = getattr(conv, lin_name), getattr(conv, root_name, None)
    op = f"copy_u_{conv._gather}" if edge_weight is None else f"u_mul_e_{conv._gather}"
    weights = () if edge_weight is None else (edge_weight,)

    def aggregate(h: Tensor) -> Tensor:
        return ops.compute(graph.graph, op, h, *weights)

    out = _multiplied_aggregate(x, graph, _weight(lin, x), aggregate)
    if lin.bias is not None:
        out = out + lin.bias
    if root is not None and getattr(conv, "root_weight", True):
        out = out + root(x[: graph.num_local])
    if getattr(conv, "normalize", False):
        out = F.normalize(out, p=2.0, dim=-1)
    return out


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
