from functools import lru_cache
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.conv.gat_conv import GATConv as PyGGATConv
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import add_self_loops, remove_self_loops, to_edge_index
from torch_geometric.utils.sparse import set_sparse_value

from ..attention import EPSILON, call_softmax_aggregate, softmax_aggregate_unchecked
from ..graph_argument import (
    Graph,
    adjacency,
    check_features,
    derived,
    eager_with_torch_sparse,
    edge_tensor,
    gather_op,
    graph_of,
    host_bound,
    is_sparse,
    looped_edge_attr,
    looped_graph,
    named,
    node_sizes,
    op_text,
    run,
    spare_row_loop_attr,
    spare_row_looped_graph,
    sparse_tensor_graph,
    unequal_sides_under_target_to_source,
)
from ..ir import Expr, OpInfo
from ..message_passing import MessagePassing
from ._dense import add_bias, projection_attention
from .twins import ScriptedAsPyG, pyg_twin


def exp_shifted() -> OpInfo:
    """``exp(score[e] - max[v])``: the max-stabilised numerator of the softmax, one message op."""
    return OpInfo(Expr.apply("exp", Expr.input(0) - Expr.input(1)), None, operands=("edge", "dst_v"))


def weighted_source(gather: str) -> OpInfo:
    """``x[u] * (p[e] * (1 / s)[v])``: normalisation and message in one expression, aggregated by
    ``gather``, so neither the attention coefficients nor an ``[E, H, C]`` message is ever written.
    The sum enters as its reciprocal: the gradient of ``p`` is then a reducing op without a
    division, whose padded lanes (loaded as 0) stay 0 instead of becoming 0 / 0."""
    return OpInfo(Expr.input(0) * (Expr.input(1) * Expr.input(2)), gather, operands=("src_v", "edge", "dst_v"))


def score_op(kinds: Tuple[str, ...], negative_slope: float) -> OpInfo:
    """``leaky_relu(sum of the operands)``: the attention logit of every edge, one message op."""
    total = Expr.input(0)
    for slot in range(1, len(kinds)):
        total = total + Expr.input(slot)
    return OpInfo(Expr.apply("leaky_relu", total, float(negative_slope)), None, operands=kinds)


@lru_cache(maxsize=1024)
def score_text(kinds: Tuple[str, ...], negative_slope: str) -> str:
    """:func:`score_op` serialised, once per argument pair: what an eager call passes."""
    return score_op(kinds, negative_slope).serialize()


class GATConv(MessagePassing, ScriptedAsPyG):
    r"""The graph attentional operator from the `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_ paper, on uGrapher's graph operators.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_t\mathbf{x}_{j},

    where the attention coefficients :math:`\alpha_{i,j}` are computed as

    .. math::
        \alpha_{i,j} =
        \frac{
        \exp\left(\mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_i
        + \mathbf{a}^{\top}_{t} \mathbf{\Theta}_{t}\mathbf{x}_j
        + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e} \mathbf{e}_{i,j}
        \right)\right)}
        {\sum_{k \in \mathcal{N}(i) \cup \{ i \}}
        \exp\left(\mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_i
        + \mathbf{a}^{\top}_{t}\mathbf{\Theta}_{t}\mathbf{x}_k
        + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e} \mathbf{e}_{i,k}
        \right)\right)}

    (the edge term only with ``edge_dim``; :math:`\mathbf{\Theta}_{s} = \mathbf{\Theta}_{t}`
    unless the graph is bipartite).

    A drop-in replacement for :class:`torch_geometric.nn.conv.GATConv`: same arguments, same
    parameters, so ``load_state_dict`` works both ways. The edge softmax runs as IR operators and
    never builds an ``[E, H, C]`` tensor:

    1. the node halves ``a_src . x[u]`` and ``a_dst . x[v]``, one batched product over the heads;
    2. the logits are ``leaky_relu(a_src[u] + a_dst[v] (+ a_edge[e]))``, a message op (the score);
    3. with sum aggregation, :func:`~pyg_ugrapher.attention.softmax_aggregate` (under
       ``torch.compile`` its custom op) recomputes the score inside each of its passes, so no
       ``[E, H]`` logit tensor exists: softmax over each destination's edges times the source
       features in three operators, and a closed-form backward whose gradients go straight to the
       node halves (attention dropout is a per-edge scale there);
    4. otherwise (other aggregations, ``return_attention_weights``) the logits as an ``[E, H]``
       tensor, then separate differentiable operators: ``copy_e_max`` of the detached logits (the
       softmax is shift-invariant, as in PyG), ``p = exp(logit[e] - max[v])``, ``copy_e_sum``,
       then ``out[v] = sum x[u] * p[e] / s[v]`` as one fused gather op, or ``alpha = p / s[v]``
       (``e_div_v``), dropout and ``u_mul_e_sum`` where the coefficients are needed.

    Stored self loops are replaced as PyG replaces them: they point to a spare destination row
    instead of being removed (:func:`~pyg_ugrapher.graph_argument.spare_row_looped_graph`), so the
    graph's sizes depend on shapes alone, a new graph costs no host synchronisation and the layer
    compiles into one graph. Only ``return_attention_weights``, which returns the looped index,
    removes them (one synchronisation per new graph). A
    ``SparseTensor`` ``adj_t`` gets PyG's ``set_diag``: its stored diagonal is replaced by loops on
    the first ``min(adj_t.size(0), adj_t.size(1))`` nodes. As in PyG, edge features (``edge_dim``)
    then need ``add_self_loops=False``, and its values of more than one dimension stand in for a
    missing ``edge_attr``.

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to derive it from the
            first input. A tuple gives the source and target sizes of a bipartite graph.
        out_channels (int): Size of each output sample.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        concat (bool, optional): Concatenate the heads; if :obj:`False`, average them.
            (default: :obj:`True`)
        negative_slope (float, optional): LeakyReLU angle of the negative slope.
            (default: :obj:`0.2`)
        dropout (float, optional): Dropout probability of the normalised attention coefficients.
            (default: :obj:`0`)
        add_self_loops (bool, optional): Replace the self loops of the graph by one per node.
            (default: :obj:`True`)
        edge_dim (int, optional): Edge feature dimensionality, if any. (default: :obj:`None`)
        fill_value (float or torch.Tensor or str, optional): Edge features of the added self
            loops: a value, or how to aggregate the edges pointing to the node (:obj:`"add"`,
            :obj:`"mean"`, :obj:`"min"`, :obj:`"max"`, :obj:`"mul"`). (default: :obj:`"mean"`)
        bias (bool, optional): Learn an additive bias. (default: :obj:`True`)
        residual (bool, optional): Add a learnable skip connection. (default: :obj:`False`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor, an ``EdgeIndex``, or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` adjacency), edge features :math:`(|\mathcal{E}|, D)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}_t|, H * F_{out})`, and with
          ``return_attention_weights`` also :math:`((2, |\mathcal{E}|), (|\mathcal{E}|, H))`
          (for a ``torch.sparse`` adjacency: the adjacency holding the coefficients, and them; not
          for a ``SparseTensor``)
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: Union[float, Tensor, str] = "mean",
        bias: bool = True,
        residual: bool = False,
        **kwargs,
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        self._gather = gather_op(self.aggr)
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1], got {dropout}")

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = negative_slope
        self.dropout = dropout
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual

        # Bipartite graphs transform source and target nodes separately (lin_src / lin_dst).
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, heads * out_channels, bias=False, weight_initializer="glorot")
        else:
            self.lin_src = Linear(in_channels[0], heads * out_channels, False, weight_initializer="glorot")
            self.lin_dst = Linear(in_channels[1], heads * out_channels, False, weight_initializer="glorot")

        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))

        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False, weight_initializer="glorot")
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)

        total_out_channels = out_channels * (heads if concat else 1)
        if residual:
            self.res = Linear(
                in_channels if isinstance(in_channels, int) else in_channels[1],
                total_out_channels,
                bias=False,
                weight_initializer="glorot",
            )
        else:
            self.register_parameter("res", None)

        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter("bias", None)

        self.reset_parameters()

    # PyG's per-edge functions, which its propagation calls when a call runs PyG's forward (see
    # forward()): the same parameters under the same names make them this layer's.
    message = PyGGATConv.message
    edge_update = PyGGATConv.edge_update

    @property
    def negative_slope(self) -> float:
        return float(self._negative_slope)

    @negative_slope.setter
    def negative_slope(self, value: float) -> None:
        # Kept as text: torch.compile reads a str attribute as a constant of the graph, where a
        # float one may become a symbolic input (dynamic=True) that an op's source cannot hold.
        self._negative_slope = repr(float(value))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
        zeros(self.bias)

    @eager_with_torch_sparse
    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Union[Tensor, SparseTensor],
        edge_attr: Optional[Tensor] = None,
        size: Optional[Tuple[int, int]] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The input node features.
            edge_index (torch.Tensor or SparseTensor): The graph: ``[2, E]`` indices, an
                ``EdgeIndex``, or a ``torch.sparse`` or ``torch_sparse.SparseTensor`` adjacency
                ``adj_t``, whose sizes then override ``size``.
            edge_attr (torch.Tensor, optional): The edge features (for a ``SparseTensor``, in its
                storage order). (default: :obj:`None`)
            size ((int, int), optional): The shape of the adjacency matrix. (default: :obj:`None`)
            return_attention_weights (bool, optional): If truthy, also return
                ``(edge_index, alpha)``: the graph with its self loops and the attention
                coefficients ``[E, H]`` (after dropout); not for a ``SparseTensor``, for which PyG
                returns a ``SparseTensor`` of them that this layer cannot build.
                (default: :obj:`None`)

        In explain mode, with hooks on ``message()`` or ``aggregate()`` or with
        ``decomposed_layers > 1`` (:meth:`unfused_reason`), the call runs PyG's ``GATConv.forward``
        on this layer: its edge masks weigh the per-edge messages, its hooks see them. A bipartite
        call under ``flow="target_to_source"`` whose sides differ in size runs PyG's layer on this
        layer's parameters
        (:func:`~pyg_ugrapher.graph_argument.unequal_sides_under_target_to_source`).
        """
        if unequal_sides_under_target_to_source(self.flow, x, size):
            return pyg_twin(self)(x, edge_index, edge_attr, size, return_attention_weights)
        if self.unfused_reason() is not None:
            # Explain mode, hooks, decomposed layers: PyG's algorithm on this layer's parameters,
            # through PyG's propagation (which honours them).
            return PyGGATConv.forward(self, x, edge_index, edge_attr, size, return_attention_weights)
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        if isinstance(edge_index, SparseTensor):
            if return_attention_weights:
                raise NotImplementedError(
                    "return_attention_weights: not supported with a SparseTensor adj_t "
                    "(PyG returns the coefficients as a SparseTensor); pass an edge "
                    "index or a torch.sparse adjacency"
                )
            if self.add_self_loops and self.edge_dim is not None:
                raise NotImplementedError(
                    "edge_dim: as in PyG, edge features and add_self_loops=True are not "
                    "supported together with a SparseTensor adj_t"
                )
            edge_index, size, edge_attr = sparse_tensor_graph(self, edge_index, size, edge_attr, "features")

        if isinstance(x, Tensor):
            raw_src = raw_dst = check_features("x", x)
        else:
            if not isinstance(x, (tuple, list)) or len(x) != 2:
                raise TypeError(f"x: expected a tensor or a pair (x_src, x_dst), got {type(x).__name__}")
            raw_src = check_features("x[0]", x[0])
            raw_dst = None if x[1] is None else check_features("x[1]", x[1])
        if raw_dst is not None and self.res is not None:
            res = self.res(raw_dst)
        lin = self.lin  # each read of a submodule or parameter is a Python call (Module.__getattr__)
        lin_src = lin if lin is not None else self.lin_src
        lin_dst = lin if lin is not None else self.lin_dst
        shared = lin_dst is lin_src and raw_dst is raw_src
        # The projections and the node-level halves of the attention logits.
        alpha_dst: Optional[Tensor] = None
        x_dst: Optional[Tensor] = None
        if shared:
            x_src, (alpha_src, alpha_dst) = projection_attention(lin_src, raw_src, (self.att_src, self.att_dst))
            x_dst = x_src
        else:
            x_src, (alpha_src,) = projection_attention(lin_src, raw_src, (self.att_src,))
            if raw_dst is not None:
                x_dst, (alpha_dst,) = projection_attention(lin_dst, raw_dst, (self.att_dst,))

        num_src, num_dst = node_sizes(self, edge_index, size, x_src, x_dst)
        graph, returned_index, edge_attr = self._graph(
            edge_index,
            edge_attr,
            size,
            num_src,
            num_dst,
            x_src.shape[0] if x_dst is None else min(x_src.shape[0], x_dst.shape[0]),
            bool(return_attention_weights),
        )
        if graph.spare_row and alpha_dst is not None:
            alpha_dst = F.pad(alpha_dst, (0, 0, 0, 1))

        operands = [alpha_src] if alpha_dst is None else [alpha_src, alpha_dst]
        kinds: Tuple[str, ...] = ("src_v",) if alpha_dst is None else ("src_v", "dst_v")
        if edge_attr is not None and self.lin_edge is not None:
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            _, (alpha_edge,) = projection_attention(self.lin_edge, edge_attr, (self.att_edge,), project=False)
            operands.append(alpha_edge)
            kinds += ("edge",)

        score = (kinds, self._negative_slope)
        dropping = self.training and self.dropout > 0
        alpha: Optional[Tensor] = None
        # Returned coefficients come from their own ops, and the output from the plain call's
        # fused op (the same numbers as a call without them), unless dropout must drop both alike.
        # A compiled small graph's edges (traced_graph) take the separate ops, as torch operations.
        if (
            self._gather == "sum"
            and not (return_attention_weights and dropping)
            and graph.edges is None
            and (graph.structure is not None or not host_bound(graph.num_edges, x_src))
        ):
            keep = None
            if dropping:
                keep = F.dropout(alpha_src.new_ones(graph.num_edges, H), p=self.dropout, training=True)
            if graph.structure is None:  # the operands' rows follow from the graph's sizes (node_sizes)
                out = softmax_aggregate_unchecked(graph.tensor, operands, x_src, keep, score_text(*score))
            else:
                out = call_softmax_aggregate(graph.structure, operands, x_src, keep, op_text(score_op, *score))
            if return_attention_weights:
                numer, denom = self._softmax(graph, run(graph, score_op, score, operands))
                alpha = run(graph, named, ("e_div_v",), [numer, denom])
        else:
            logits = run(graph, score_op, score, operands)
            out, alpha = self._attend(graph, logits, x_src, return_attention_weights)
        if graph.spare_row:
            out = out[:-1]

        if self.concat:
            out = out.view(-1, H * C)
        else:
            out = out.mean(dim=1)
        if res is not None:
            out = out + res
        bias = self.bias
        if bias is not None:
            out = add_bias(out, bias)

        if return_attention_weights:
            if is_sparse(returned_index):
                return out, (set_sparse_value(returned_index, alpha), alpha)
            return out, (returned_index, alpha)
        return out

    def _attend(
        self, graph: Graph, logits: Tensor, x_src: Tensor, return_attention_weights: Optional[bool]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Softmax and aggregation as separate ops: where the attention coefficients are returned
        with dropout, the aggregation is not a sum, or the graph's operators run as torch
        operations (a compiled small graph, an eager host-bound one). Without dropout the output
        comes from the same op whether the coefficients are returned or not, so it is the same."""
        numer, denom = self._softmax(graph, logits)
        if self.training and self.dropout > 0:
            alpha = run(graph, named, ("e_div_v",), [numer, denom])
            alpha = F.dropout(alpha, p=self.dropout, training=True)
            return run(graph, named, (f"u_mul_e_{self._gather}",), [x_src, alpha.unsqueeze(-1)]), alpha
        out = run(
            graph, weighted_source, (self._gather,), [x_src, numer.unsqueeze(-1), denom.reciprocal().unsqueeze(-1)]
        )
        alpha = run(graph, named, ("e_div_v",), [numer, denom]) if return_attention_weights else None
        return out, alpha

    @staticmethod
    def _softmax(graph: Graph, logits: Tensor) -> Tuple[Tensor, Tensor]:
        """The edge softmax of ``logits`` over each destination's edges, as ``numer / denom[v]``."""
        shift = run(graph, named, ("copy_e_max",), [logits.detach()])
        numer = run(graph, exp_shifted, (), [logits, shift])
        # PyG's 1e-16 keeps destinations without edges finite (and their gradients 0).
        return numer, run(graph, named, ("copy_e_sum",), [numer]) + EPSILON

    def _graph(
        self,
        edge_index: Tensor,
        edge_attr: Optional[Tensor],
        size: Optional[Tuple[int, int]],
        num_src: int,
        num_dst: int,
        num_loops: int,
        return_attention_weights: bool,
    ) -> Tuple[Graph, Optional[Tensor], Optional[Tensor]]:
        """The graph to attend over, the graph argument PyG would return with the coefficients
        (``None`` where they are not returned), and the edge features in the graph's edge order."""
        if size is not None:
            num_loops = min(size)
        if is_sparse(edge_index):
            if not self.add_self_loops:
                graph, _ = adjacency(self, edge_index, num_src, num_dst)
                return graph, edge_index, edge_tensor("edge_attr", edge_attr, graph.num_edges)
            if edge_attr is not None:
                raise ValueError(
                    "edge_attr: edge features with add_self_loops=True need an edge index, not a sparse adjacency"
                )
            graph, looped = derived(
                edge_index, ("gat", num_src, num_dst), lambda: self._looped_sparse(edge_index, num_src, num_dst)
            )
            return Graph(graph, None, graph.num_edges), looped, None

        if edge_attr is not None:
            edge_attr = edge_tensor("edge_attr", edge_attr, edge_index.size(1))
        if not self.add_self_loops:
            graph, _ = adjacency(self, edge_index, num_src, num_dst)
            return graph, edge_index, edge_attr
        if not return_attention_weights:
            # Fixed sizes: no host sync for a new graph, one compiled graph without fullgraph (where
            # the kept edges would break it), and a recording that serves every graph of its size.
            graph = spare_row_looped_graph(edge_index, self.flow, num_src, num_dst, num_loops)
            if edge_attr is not None:
                edge_attr = spare_row_loop_attr(edge_index, edge_attr, num_loops, self.fill_value)
            return graph, None, edge_attr
        looped = looped_graph(edge_index, self.flow, num_src, num_dst, num_loops)
        if edge_attr is not None:
            edge_attr = looped_edge_attr(looped, edge_attr, num_loops, self.fill_value)
        # The looped index is cached with the graph: the caller gets its own, as PyG's are new
        # every call (one the caller changed in place was the next call's returned index).
        return looped.graph, looped.index.clone() if return_attention_weights else None, edge_attr

    def _looped_sparse(self, adj_t: Tensor, num_src: int, num_dst: int):
        """PyG's own self-loop helpers on the adjacency (their result is what PyG returns), and
        its graph in that adjacency's edge order."""
        looped, _ = remove_self_loops(adj_t.detach())
        looped, _ = add_self_loops(looped, fill_value=self.fill_value)
        index, _ = to_edge_index(looped)
        return graph_of(index.flip(0), "source_to_target", num_src, num_dst), looped

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
