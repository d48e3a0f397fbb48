from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import add_self_loops

from triton_kernels import read_as, uses_triton
from triton_kernels import unit_norm as unit_norm_kernels

from ..graph import OP_TAGS
from ..graph_argument import (
    Graph,
    adjacency,
    batch_first,
    check_features,
    derived,
    eager_with_torch_sparse,
    edge_tensor,
    endpoints,
    gather_op,
    graph_of,
    graph_with_loops,
    is_sparse,
    layer_graph,
    named,
    node_sizes,
    nodes_first,
    padded_looped_graph,
    plain_index,
    run,
    spare_row_looped_graph,
    sparse_edges,
    sparse_tensor_graph,
)
from ..ir import Expr, OpInfo
from ..message_passing import MessagePassing
from ._dense import add_bias
from .twins import ScriptedAsPyG


def normalize_op() -> OpInfo:
    """The normalised weight of edge ``(u, e, v)``: ``d[u]^-1/2 * w[e] * d[v]^-1/2``, one message op."""
    return OpInfo(Expr.input(0) * Expr.input(1) * Expr.input(2), None, operands=("src_v", "edge", "dst_v"))


def fixed_size_graph(edge_index: Tensor, flow: str, num_nodes: int, add_self_loops: bool, gather: str) -> Graph:
    """The graph of an index that a GCNConv propagates on, sized by shapes alone: with self loops, a
    sum keeps the stored ones in place at weight 0 (:func:`padded_looped_graph`), another gather
    sends them to a spare row (:func:`spare_row_looped_graph`); without, the index's own graph."""
    if add_self_loops and gather == "sum":
        return padded_looped_graph(edge_index, flow, num_nodes)
    if add_self_loops:
        return spare_row_looped_graph(edge_index, flow, num_nodes, num_nodes, num_nodes)
    return layer_graph(edge_index, flow, num_nodes, num_nodes)


def unit_norm(edge_index: Tensor, flow: str, num_nodes: int, add_self_loops: bool, dtype: torch.dtype) -> Tensor:
    r"""The normalised weights when every edge weighs 1, from node-level factors:
    :math:`\hat{d}_u^{-1/2} \hat{d}_v^{-1/2}` per edge, where :math:`\hat{d}_v` counts ``v``'s incoming
    edges that are not self loops, plus its own loop (or all of them, without ``add_self_loops``).

    Without loops the weights are in the index's edge order; with them, stored loops weigh 0 in
    place (the padded and spare-row graphs of :func:`fixed_size_graph`), then each node's loop
    :math:`1 / \hat{d}_v`. A sampler's mini-batch is a new graph every step: where Triton runs, two
    kernels (:mod:`triton_kernels.unit_norm`), else a dozen torch operations, instead of two graph
    operators over the graph. Degrees are summed in float32 (float64 for double weights), exact up to
    :math:`2^{24}` edges per node whatever ``dtype``."""
    index = plain_index(edge_index)
    j, i = endpoints(flow)
    src, dst = index[j], index[i]
    if uses_triton(index.device) and unit_norm_kernels.fits(index.size(1), num_nodes):
        return unit_norm_kernels.unit_norm_weights(src, dst, num_nodes, add_self_loops, dtype)
    return unit_norm_torch(src, dst, num_nodes, add_self_loops, dtype)


def unit_norm_torch(src: Tensor, dst: Tensor, num_nodes: int, add_self_loops: bool, dtype: torch.dtype) -> Tensor:
    """:func:`unit_norm` of the edges ``(src, dst)`` with torch operations."""
    acc = unit_norm_kernels.degree_dtype(dtype)
    if add_self_loops:
        weight = (src != dst).to(acc)
        factor = torch.ones(num_nodes, dtype=acc, device=src.device).index_add_(0, dst, weight).rsqrt_()
    else:
        degree = torch.zeros(num_nodes, dtype=acc, device=src.device).index_add_(
            0, dst, torch.ones(src.numel(), dtype=acc, device=src.device)
        )
        # A node without edges has degree 0 here: PyG's gcn_norm maps its inf to 0.
        factor = degree.rsqrt().masked_fill_(degree == 0, 0.0)
    norm = factor.index_select(0, src).mul_(factor.index_select(0, dst))
    if not add_self_loops:
        return norm.to(dtype)
    return torch.cat([norm.mul_(weight), factor.square()]).to(dtype)


def fixed_size_unit_norm(
    edge_index: Tensor, flow: str, num_nodes: int, add_self_loops: bool, gather: str, dtype: torch.dtype
) -> Tensor:
    """:func:`unit_norm` on :func:`fixed_size_graph`'s graph, cached on the index: one entry that eager
    and compiled layers share."""

    def build() -> Tensor:
        # The graph is built (and its index checked, cached) first: the weights index by the endpoints.
        fixed_size_graph(edge_index, flow, num_nodes, add_self_loops, gather)
        return unit_norm(edge_index, flow, num_nodes, add_self_loops, dtype)

    return derived(edge_index, ("gcn_unit_norm", flow, num_nodes, add_self_loops, gather, dtype), build)


@torch.library.custom_op("pyg_ugrapher::gcn_unit_norm", mutates_args=(), tags=OP_TAGS)
def _compiled_unit_norm(
    edge_index: Tensor, flow: str, num_nodes: int, add_self_loops: bool, gather: str, dtype: torch.dtype
) -> Tensor:
    """:func:`fixed_size_unit_norm` for a compiled GCNConv: traced, the normalisation would run
    every call (two graph operators, a few elementwise kernels), where an eager call reads it from
    the cache on the index. A copy, as the compiled graph owns its ops' outputs (Inductor may write
    into one once it is dead), which the kernels read as the cached weights
    (:func:`triton_kernels.read_as`): in CSR order from the second step on, as an eager layer's."""
    weights = fixed_size_unit_norm(edge_index, flow, num_nodes, add_self_loops, gather, dtype)
    copy = weights.clone()
    read_as(copy, weights)
    return copy


@_compiled_unit_norm.register_fake
def _(edge_index: Tensor, flow: str, num_nodes: int, add_self_loops: bool, gather: str, dtype: torch.dtype) -> Tensor:
    return edge_index.new_empty((edge_index.size(1) + (num_nodes if add_self_loops else 0),), dtype=dtype)


def gcn_norm_weights(graph: Graph, weight: Tensor) -> Tensor:
    r"""The weights of :math:`\mathbf{\hat{D}}^{-1/2} \mathbf{\hat{A}} \mathbf{\hat{D}}^{-1/2}`
    for a graph whose self loops are already in place: the in-degree is a ``copy_e_sum`` and the
    per-edge product one message-creation op, both differentiable in ``weight``."""
    deg = run(graph, named, ("copy_e_sum",), [weight])
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt = deg_inv_sqrt.masked_fill(deg_inv_sqrt == float("inf"), 0.0)
    source = deg_inv_sqrt[:-1] if graph.spare_row else deg_inv_sqrt
    return run(graph, normalize_op, (), [source, weight, deg_inv_sqrt])


class GCNConv(MessagePassing, ScriptedAsPyG):
    r"""The graph convolutional operator from the `"Semi-supervised
    Classification with Graph Convolutional Networks"
    <https://arxiv.org/abs/1609.02907>`_ paper, on uGrapher's graph operators.

    .. math::
        \mathbf{X}^{\prime} = \mathbf{\hat{D}}^{-1/2} \mathbf{\hat{A}}
        \mathbf{\hat{D}}^{-1/2} \mathbf{X} \mathbf{\Theta},

    where :math:`\mathbf{\hat{A}} = \mathbf{A} + \mathbf{I}` denotes the adjacency matrix with
    inserted self-loops and :math:`\hat{D}_{ii} = \sum_{j=0} \hat{A}_{ij}` its diagonal degree
    matrix. Node-wise:

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in
        \mathcal{N}(i) \cup \{ i \}} \frac{e_{j,i}}{\sqrt{\hat{d}_j
        \hat{d}_i}} \mathbf{x}_j

    with :math:`\hat{d}_i = 1 + \sum_{j \in \mathcal{N}(i)} e_{j,i}` and :math:`e_{j,i}` the edge
    weight (default :obj:`1`).

    A drop-in replacement for :class:`torch_geometric.nn.conv.GCNConv`: same arguments, same
    parameters (``lin.weight``, ``bias``), so ``load_state_dict`` works both ways. The
    normalisation is computed as one weight per edge (with ``edge_weight``: the degrees by a
    ``copy_e_sum`` op, the weights by one message-creation op; without: from node-level degree
    factors, :func:`unit_norm`); the propagation is **one** ``u_mul_e_sum`` op. Without
    ``edge_weight`` the normalised weights depend on the graph alone and are cached with it (on
    the ``edge_index`` object), so a forward then runs that single op; ``cached=True`` also keeps
    weighted normalisations, as PyG does. Self loops are added as PyG's ``add_remaining_self_loops``
    does (a stored loop's weight moves to its node's loop); for sums the stored loops stay in the
    graph at weight 0, so its size depends on shapes alone and ``torch.compile`` keeps the layer in
    one graph. Other aggregations, which would read the zero-weight messages, point them to a spare
    destination row (:func:`~pyg_ugrapher.graph_argument.spare_row_looped_graph`): again no host
    synchronisation for a new graph, and one compiled graph. A ``SparseTensor`` ``adj_t`` is
    normalised as PyG's ``gcn_norm`` normalises one: its values (or ones) are the edge weights and
    its stored diagonal is replaced by self loops of weight ``2`` (``improved``) or ``1``.

    Args:
        in_channels (int): Size of each input sample, or :obj:`-1` to derive it from the first
            input.
        out_channels (int): Size of each output sample.
        improved (bool, optional): If :obj:`True`, :math:`\mathbf{\hat{A}} = \mathbf{A} +
            2\mathbf{I}`. (default: :obj:`False`)
        cached (bool, optional): Cache the normalised graph and weights of the first call and
            reuse them afterwards (transductive learning only). (default: :obj:`False`)
        add_self_loops (bool, optional): Add self loops; defaults to :obj:`normalize`.
            (default: :obj:`None`)
        normalize (bool, optional): Add self loops and normalise symmetrically on the fly.
            (default: :obj:`True`)
        bias (bool, optional): Learn an additive bias. (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing` (``aggr`` may be ``"add"``,
            ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor or an ``EdgeIndex``) or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` adjacency ``adj_t`` :math:`(|\mathcal{V}|, |\mathcal{V}|)`
          whose values are the edge weights, edge weights :math:`(|\mathcal{E}|)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})`
    """

    _cached_edge_index: Optional[Tuple[Graph, Optional[Tensor]]]
    #: A SparseTensor's normalisation, cached apart from the others' as PyG caches it.
    _cached_adj_t: Optional[Tuple[Graph, Optional[Tensor]]]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: Optional[bool] = None,
        normalize: bool = True,
        bias: bool = True,
        **kwargs,
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        self._gather = gather_op(self.aggr)

        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError(
                f"add_self_loops: '{self.__class__.__name__}' does not support adding "
                f"self-loops to the graph when no on-the-fly normalization is applied"
            )

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.improved = improved
        self.cached = cached
        self.add_self_loops = add_self_loops
        self.normalize = normalize

        self._cached_edge_index = None
        self._cached_adj_t = None

        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)

        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin.reset_parameters()
        zeros(self.bias)
        self._cached_edge_index = None
        self._cached_adj_t = None

    @eager_with_torch_sparse
    def forward(
        self, x: Tensor, edge_index: Union[Tensor, SparseTensor], edge_weight: Optional[Tensor] = None
    ) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise ValueError(
                f"x: '{self.__class__.__name__}' received a tuple of node features as "
                f"input while this layer does not support bipartite message passing. "
                f"Please try other layers such as 'SAGEConv' or 'GraphConv' instead"
            )
        x = check_features("x", x, static=True)
        if self.unfused_reason() is not None:
            return self._propagated(x, edge_index, edge_weight)
        static = x.dim() == 3

        slot = "_cached_adj_t" if isinstance(edge_index, SparseTensor) else "_cached_edge_index"
        cache = getattr(self, slot)
        if cache is not None:
            graph, weight = cache
        else:
            graph, weight = self._graph(nodes_first(x), edge_index, edge_weight)
            if self.cached and self.normalize:
                setattr(self, slot, (graph, weight))

        x = nodes_first(self.lin(x))
        if weight is None:
            out = run(graph, named, (f"copy_u_{self._gather}",), [x])
        else:
            out = run(graph, named, (f"u_mul_e_{self._gather}",), [x, weight])
        if graph.spare_row:
            out = out[:-1]
        out = batch_first(out, static)

        if self.bias is not None:
            out = add_bias(out, self.bias)
        return out

    def _propagated(self, x: Tensor, edge_index: Union[Tensor, SparseTensor], edge_weight: Optional[Tensor]) -> Tensor:
        """PyG's algorithm through :meth:`propagate` (PyG's normalisation, messages and aggregation),
        for the calls :meth:`unfused_reason` keeps off the fused path; it leaves the caches alone."""
        if self.normalize:
            edge_index, edge_weight = gcn_norm(
                edge_index, edge_weight, x.size(self.node_dim), self.improved, self.add_self_loops, self.flow, x.dtype
            )
        out = self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight)
        return out if self.bias is None else out + self.bias

    def message(self, x_j: Tensor, edge_weight: Optional[Tensor]) -> Tensor:
        """PyG's message, for the calls that run PyG's propagation (:meth:`unfused_reason`)."""
        return x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j

    def _graph(
        self, x: Tensor, edge_index: Union[Tensor, SparseTensor], edge_weight: Optional[Tensor]
    ) -> Tuple[Graph, Optional[Tensor]]:
        """The graph to propagate on and its edge weights (``None``: all ones)."""
        # PyG's gcn_norm replaces a SparseTensor's stored diagonal (fill_diag): with the diagonal left
        # out, the index path's add_remaining_self_loops adds loops that weigh the fill value alone.
        from_sparse_tensor = isinstance(edge_index, SparseTensor)
        edge_index, size, edge_weight = sparse_tensor_graph(
            self, edge_index, None, edge_weight, "weights", remove_loops=self.add_self_loops
        )
        if from_sparse_tensor and edge_weight is None and self.add_self_loops and self.improved:
            # PyG weighs a SparseTensor without values 1 before it fills the diagonal, so improved's
            # loops weigh 2 (on an index without edge weights they weigh 1, see below).
            edge_weight = x.new_ones(edge_index.size(1))
        num_nodes, _ = node_sizes(self, edge_index, size, x, x)
        if is_sparse(edge_index):
            if edge_weight is not None:
                raise ValueError(
                    "edge_weight: a sparse adjacency carries its edge weights as its values; pass edge_weight=None"
                )
            if not self.normalize:
                return adjacency(self, edge_index, num_nodes, num_nodes)
            fill = 2.0 if self.improved else 1.0
            if self.add_self_loops and self._gather != "sum":
                # PyG's gcn_norm merges each stored loop with the loop it adds into one entry, which
                # mean, max and min read as one message: its own helper builds that adjacency.
                merged, _ = add_self_loops(edge_index, fill_value=fill, num_nodes=num_nodes)
                index, values = sparse_edges(merged)
                key, build = (
                    ("gcn_merged", num_nodes),
                    lambda: graph_of(index, "source_to_target", num_nodes, num_nodes),
                )
            else:
                # A loop added to every node on top of any stored one: their values add up, which a
                # sum cannot tell from PyG's one merged entry, and the structure is cached.
                index, values = sparse_edges(edge_index)
                key, build = ("gcn", num_nodes, self.add_self_loops), lambda: self._looped_sparse(index, num_nodes)
                if self.add_self_loops:
                    values = torch.cat([values, values.new_full((num_nodes,), fill)])
            looped = derived(edge_index, key, build)
            graph = Graph(looped, None, looped.num_edges)
            return graph, gcn_norm_weights(graph, values)

        edge_weight = edge_tensor("edge_weight", edge_weight, edge_index.size(1))
        if edge_weight is not None and edge_weight.dim() != 1:
            raise ValueError(f"edge_weight: expected shape [E], got {list(edge_weight.shape)}")
        # Stored self loops stay in a graph of fixed size: at weight 0 for sums, in a spare row for
        # the other aggregations (which would read zero-weight messages). No host synchronisation
        # for a new graph, and no graph break when compiled.
        graph = fixed_size_graph(edge_index, self.flow, num_nodes, self.add_self_loops, self._gather)
        if not self.normalize:
            return graph, edge_weight
        if edge_weight is None:
            # Without weights the normalisation is a function of the graph alone: cache it there.
            # Every edge, self loops included, weighs 1: PyG 2.8's gcn_norm fills self loops
            # with 2 (improved=True) only when edge weights are given, and this matches it.
            if graph.edges is not None:
                # Traced with the graph's ops (traced_graph): a few fused kernels, no custom op.
                index = plain_index(edge_index)
                j, i = endpoints(self.flow)
                return graph, unit_norm_torch(index[j], index[i], num_nodes, self.add_self_loops, x.dtype)
            norm = _compiled_unit_norm if torch.compiler.is_compiling() else fixed_size_unit_norm
            return graph, norm(edge_index, self.flow, num_nodes, self.add_self_loops, self._gather, x.dtype)
        fill = 2.0 if self.improved else 1.0
        return graph, gcn_norm_weights(
            graph, self.loop_weights(edge_index, self.add_self_loops, edge_weight, num_nodes, fill)
        )

    def _looped_sparse(self, index: Tensor, num_nodes: int):
        if self.add_self_loops:
            return graph_with_loops(index, "source_to_target", num_nodes)
        return graph_of(index, "source_to_target", num_nodes, num_nodes)

    @staticmethod
    def loop_weights(edge_index: Tensor, add_self_loops: bool, weight: Tensor, num_nodes: int, fill: float) -> Tensor:
        """Edge weights in the order of :func:`fixed_size_graph`'s graph: with ``add_self_loops``, a
        stored self loop keeps its place at weight 0 (in the padded graph, or the spare-row one,
        which sends it to the spare row) and lends its weight to its node's loop, other loops get
        ``fill``. Of a node's duplicate stored loops the last one lends its weight, on every
        device: the assignment PyG indexes with leaves the winner unspecified on a GPU."""
        if not add_self_loops:
            return weight
        index = plain_index(edge_index)
        is_loop = index[0] == index[1]
        # Edges that are not loops go to a spare slot past the last node, which is dropped.
        slot = torch.where(is_loop, index[0], num_nodes)
        loop_weight = _last_loop_weights(slot, weight, num_nodes + 1, fill)[:num_nodes]
        return torch.cat([weight.masked_fill(is_loop, 0.0), loop_weight])

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"


def _last_loop_weights(loop_nodes: Tensor, weights: Tensor, num_nodes: int, fill: float) -> Tensor:
    """``[num_nodes]``: the weight of each node's last loop in ``loop_nodes`` (by position), or
    ``fill`` for a node without one. Deterministic, without a host synchronisation. Each of a
    node's loops takes that node's gradient, as autograd's indexed assignment (PyG's) gives it."""
    positions = torch.arange(loop_nodes.numel(), device=loop_nodes.device)
    last = torch.full((num_nodes,), -1, dtype=positions.dtype, device=positions.device)
    last = last.scatter_reduce(0, loop_nodes, positions, "amax")
    # The fill value sits past the weights, where a node without a loop points.
    candidates = torch.cat([weights.detach(), weights.new_full((1,), fill)])
    chosen = candidates.index_select(0, torch.where(last < 0, weights.numel(), last))
    # Zero in value; in the backward pass every loop's own share of its node's gradient.
    return chosen + weights.new_zeros(num_nodes).index_add(0, loop_nodes, weights - weights.detach())
