from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import reset
from torch_geometric.typing import SparseTensor

from ..graph_argument import (
    adjacency,
    aggregate,
    batch_first,
    eager_with_torch_sparse,
    edge_tensor,
    gather_op,
    is_sparse,
    named,
    node_sizes,
    nodes_first,
    padded_looped_graph,
    pair,
    run,
    sparse_tensor_graph,
)
from ..ir import Expr, OpInfo
from ..message_passing import MessagePassing
from ..structure import version
from ._dense import network
from .twins import ScriptedAsPyG


def relu_sum(gather: str) -> OpInfo:
    """GINE's message ``relu(x[u] + edge_attr[e])``, aggregated by ``gather``: one fused op."""
    return OpInfo(Expr.apply("relu", Expr.input(0) + Expr.input(1)), gather, operands=("src_v", "edge"))


class GINConv(MessagePassing, ScriptedAsPyG):
    r"""The graph isomorphism operator from the `"How Powerful are
    Graph Neural Networks?" <https://arxiv.org/abs/1810.00826>`_ paper, on uGrapher's graph
    operators.

    .. math::
        \mathbf{x}^{\prime}_i = h_{\mathbf{\Theta}} \left( (1 + \epsilon) \cdot
        \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathbf{x}_j \right)

    or :math:`\mathbf{X}^{\prime} = h_{\mathbf{\Theta}} \left( \left( \mathbf{A} + (1 + \epsilon)
    \cdot \mathbf{I} \right) \cdot \mathbf{X} \right)`, where :math:`h_{\mathbf{\Theta}}` is a
    neural network, *e.g.* an MLP.

    A drop-in replacement for :class:`torch_geometric.nn.conv.GINConv`: same arguments, same
    parameters (``nn.*``, ``eps``), so ``load_state_dict`` works both ways. The neighbourhood sum
    is **one** ``copy_u_sum`` op (``u_mul_e_sum`` for a ``torch.sparse`` adjacency, as PyG's ``spmm``
    multiplies by its values; PyG drops a ``SparseTensor``'s values, and so does this layer); with a
    fixed :math:`\epsilon = 0` (the default) that op also adds :math:`\mathbf{x}_i`, summing over the
    graph with a self loop added to every node. Where the network is a ``Sequential``, its torch and
    PyG ``Linear`` children compute their bias gradient as a matrix-vector product
    (``nn._dense.network``: the same values, faster than ATen's eager reduction; the modules
    themselves are never changed); any other network runs as ``nn(x)``.

    Args:
        nn (torch.nn.Module): The network :math:`h_{\mathbf{\Theta}}` mapping ``[-1, in_channels]``
            to ``[-1, out_channels]``.
        eps (float, optional): (Initial) :math:`\epsilon`. (default: :obj:`0.`)
        train_eps (bool, optional): Make :math:`\epsilon` a trainable parameter.
            (default: :obj:`False`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor, an ``EdgeIndex``, or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` ``adj_t``)
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(|\mathcal{V}_t|, F_{out})` if bipartite
    """

    def __init__(self, nn: Callable, eps: float = 0.0, train_eps: bool = False, **kwargs) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        self._gather = gather_op(self.aggr)
        self.nn = nn
        self.initial_eps = eps
        #: (the eps buffer, its version, whether it holds 0) when last read.
        self._eps_read: Optional[Tuple[Tensor, Optional[int], bool]] = None
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        reset(self.nn)
        # In place under no_grad, not through ``.data``: the write bumps the buffer's version, which
        # _with_loops reads.
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    @eager_with_torch_sparse
    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Union[Tensor, SparseTensor],
        size: Optional[Tuple[int, int]] = None,
    ) -> Tensor:
        x_src, x_dst = pair(x, static=True)
        if self.unfused_reason() is not None:
            edge_index, size, _ = sparse_tensor_graph(self, edge_index, size)
            out = self.propagate(edge_index, x=(x_src, x_dst), size=size)
            return self.nn(out if x_dst is None else out + (1 + self.eps) * x_dst)
        static = x_src.dim() == 3
        same = x_dst is x_src
        x_src = nodes_first(x_src)
        x_dst = x_src if same else None if x_dst is None else nodes_first(x_dst)
        edge_index, size, _ = sparse_tensor_graph(self, edge_index, size)
        if x_dst is x_src and self._with_loops(edge_index):
            num_nodes, num_dst = node_sizes(self, edge_index, size, x_src, x_dst)
            if num_nodes == num_dst:
                # (A + I) X as one sum over the edges and a self loop per node: no [N, F] pass
                # to add x (a sum over N more edges reads less memory than that pass).
                graph = padded_looped_graph(edge_index, self.flow, num_nodes)
                return network(self.nn, batch_first(run(graph, named, ("copy_u_sum",), [x_src]), static))
        out = aggregate(self, self._gather, x_src, x_dst, edge_index, size)
        if x_dst is not None:
            # One pass over [N, F] instead of a product and a sum.
            out = torch.addcmul(out, x_dst, 1 + self.eps)
        return network(self.nn, batch_first(out, static))

    def _with_loops(self, edge_index: Tensor) -> bool:
        """Whether the sum may run on the graph with self loops: sum aggregation of an index (not
        a sparse adjacency), eager, and a fixed epsilon of 0 (PyG's default), which is read once per
        change of the buffer (a device sync), not per call. Writes through ``eps.data`` keep its
        version, and are not seen: assign in place under ``torch.no_grad()`` or load a state dict."""
        if self._gather != "sum" or is_sparse(edge_index) or torch.compiler.is_compiling() or self.eps.requires_grad:
            return False
        read = self._eps_read
        if read is None or read[0] is not self.eps or read[1] != version(self.eps) or read[1] is None:
            read = self._eps_read = (self.eps, version(self.eps), bool(self.eps.item() == 0))
        return read[2]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"


class GINEConv(MessagePassing, ScriptedAsPyG):
    r"""The modified :class:`GINConv` operator from the `"Strategies for
    Pre-training Graph Neural Networks" <https://arxiv.org/abs/1905.12265>`_ paper, on uGrapher's
    graph operators.

    .. math::
        \mathbf{x}^{\prime}_i = h_{\mathbf{\Theta}} \left( (1 + \epsilon) \cdot
        \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathrm{ReLU}
        ( \mathbf{x}_j + \mathbf{e}_{j,i} ) \right)

    A drop-in replacement for :class:`torch_geometric.nn.conv.GINEConv`: same arguments, same
    parameters (``nn.*``, ``eps``, ``lin``), so ``load_state_dict`` works both ways. The message
    and its sum are **one** fused gather op, ``sum relu(x[u] + e[e])``: the ``[E, F]`` messages
    are never written.

    Args:
        nn (torch.nn.Module): The network :math:`h_{\mathbf{\Theta}}`.
        eps (float, optional): (Initial) :math:`\epsilon`. (default: :obj:`0.`)
        train_eps (bool, optional): Make :math:`\epsilon` a trainable parameter.
            (default: :obj:`False`)
        edge_dim (int, optional): Edge feature dimensionality. If :obj:`None`, node and edge
            features must have the same width; otherwise edge features are linearly transformed
            to the input width of ``nn``. (default: :obj:`None`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor, an ``EdgeIndex``, or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` ``adj_t`` whose stored entries are the edges), edge features
          :math:`(|\mathcal{E}|, D)` (for a ``SparseTensor``, in its storage order; without them,
          its values if they have more than one dimension, as in PyG)
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(|\mathcal{V}_t|, F_{out})` if bipartite
    """

    def __init__(
        self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False, edge_dim: Optional[int] = None, **kwargs
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(**kwargs)
        self._gather = gather_op(self.aggr)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        if edge_dim is not None:
            first = self.nn[0] if isinstance(self.nn, torch.nn.Sequential) else self.nn
            if hasattr(first, "in_features"):
                in_channels = first.in_features
            elif hasattr(first, "in_channels"):
                in_channels = first.in_channels
            else:
                raise ValueError("nn: could not infer its input channels (needed for edge_dim)")
            self.lin = Linear(edge_dim, in_channels)
        else:
            self.lin = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset(self.nn)
        self.eps.data.fill_(self.initial_eps)
        if self.lin is not None:
            self.lin.reset_parameters()

    @eager_with_torch_sparse
    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Union[Tensor, SparseTensor],
        edge_attr: Optional[Tensor] = None,
        size: Optional[Tuple[int, int]] = None,
    ) -> Tensor:
        x_src, x_dst = pair(x, static=True)
        static = x_src.dim() == 3
        x_src, x_dst = nodes_first(x_src), None if x_dst is None else nodes_first(x_dst)
        edge_index, size, edge_attr = sparse_tensor_graph(self, edge_index, size, edge_attr, "features")
        num_src, num_dst = node_sizes(self, edge_index, size, x_src, x_dst)
        graph, _ = adjacency(self, edge_index, num_src, num_dst)
        if edge_attr is None:
            raise ValueError("edge_attr: GINEConv needs edge features")
        edge_attr = edge_tensor("edge_attr", edge_attr, graph.num_edges)
        if self.lin is None and x_src.size(-1) != edge_attr.size(-1):
            raise ValueError(
                "edge_attr: node and edge feature dimensionalities do not match. "
                "Consider setting the 'edge_dim' attribute of 'GINEConv'"
            )
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        if self.unfused_reason() is not None:
            x_src, x_dst = batch_first(x_src, static), None if x_dst is None else batch_first(x_dst, static)
            out = self.propagate(edge_index, x=(x_src, x_dst), edge_attr=edge_attr, size=size)
            return self.nn(out if x_dst is None else out + (1 + self.eps) * x_dst)

        # A static graph's edge features are shared by its feature matrices: one row per head.
        out = run(graph, relu_sum, (self._gather,), [x_src, edge_attr.unsqueeze(1) if static else edge_attr])
        if x_dst is not None:
            out = torch.addcmul(out, x_dst, 1 + self.eps)
        return network(self.nn, batch_first(out, static))

    def message(self, x_j: Tensor, edge_attr: Tensor) -> Tensor:
        """PyG's message (edge features already mapped by ``lin``), for the calls that run PyG's
        propagation (:meth:`unfused_reason`)."""
        return (x_j + edge_attr).relu()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"
