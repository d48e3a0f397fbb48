from typing import Optional, Tuple, Union

import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor

from ..graph_argument import aggregate, eager_with_torch_sparse, gather_op, pair, sparse_tensor_graph
from ..message_passing import MessagePassing
from ._dense import LINEAR_GATHERS, linear, linear_sum, projects_first, root_term
from .twins import ScriptedAsPyG


class GraphConv(MessagePassing, ScriptedAsPyG):
    r"""The graph neural network operator from the `"Weisfeiler and Leman Go
    Neural: Higher-order Graph Neural Networks" <https://arxiv.org/abs/1810.02244>`_ paper, on
    uGrapher's graph operators.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2
        \sum_{j \in \mathcal{N}(i)} e_{j,i} \cdot \mathbf{x}_j

    where :math:`e_{j,i}` denotes the edge weight from source node :obj:`j` to target node
    :obj:`i` (default: :obj:`1`).

    A drop-in replacement for :class:`torch_geometric.nn.conv.GraphConv`: same arguments, same
    parameters (``lin_rel``, ``lin_root``), so ``load_state_dict`` works both ways. The
    aggregation is **one** op: ``u_mul_e_<aggr>`` with edge weights, ``copy_u_<aggr>`` without.

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to derive it from the
            first input. A tuple gives the source and target sizes.
        out_channels (int): Size of each output sample.
        aggr (str, optional): :obj:`"add"` (or :obj:`"sum"`), :obj:`"mean"`, :obj:`"max"` or
            :obj:`"min"`. (default: :obj:`"add"`)
        bias (bool, optional): Learn an additive bias (in ``lin_rel``). (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor, an ``EdgeIndex``, or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` ``adj_t`` whose values are the edge weights), edge weights
          :math:`(|\mathcal{E}|)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(|\mathcal{V}_t|, F_{out})` if bipartite
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        aggr: str = "add",
        bias: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(aggr=aggr, **kwargs)
        self._gather = gather_op(self.aggr)

        self.in_channels = in_channels
        self.out_channels = out_channels

        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)

        self.lin_rel = Linear(in_channels[0], out_channels, bias=bias)
        self.lin_root = Linear(in_channels[1], out_channels, bias=False)

        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()

    @eager_with_torch_sparse
    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Union[Tensor, SparseTensor],
        edge_weight: Optional[Tensor] = None,
        size: Optional[Tuple[int, int]] = None,
    ) -> Tensor:
        x_src, x_dst = pair(x)
        edge_index, size, edge_weight = sparse_tensor_graph(self, edge_index, size, edge_weight, "weights")
        root = None if x_dst is None else self.lin_root
        fused = self.unfused_reason() is None
        if fused and self._gather in LINEAR_GATHERS and projects_first(self.lin_rel, x_src, root):
            x_rel = F.linear(x_src, self.lin_rel.weight)
            out = aggregate(self, self._gather, x_rel, x_dst, edge_index, size, edge_weight)
            return root_term(self.lin_rel, root, x_dst, out)
        if fused:
            out = aggregate(self, self._gather, x_src, x_dst, edge_index, size, edge_weight)
        else:
            out = self.propagate(edge_index, x=(x_src, x_dst), edge_weight=edge_weight, size=size)
        return linear(self.lin_rel, out) if root is None else linear_sum(self.lin_rel, out, root, x_dst)

    def message(self, x_j: Tensor, edge_weight: Optional[Tensor]) -> Tensor:
        """PyG's message, for the calls that run PyG's propagation (:meth:`unfused_reason`)."""
        return x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"
