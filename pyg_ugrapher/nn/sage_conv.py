from typing import List, Optional, Tuple, Union

import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.aggr import Aggregation, MultiAggregation
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import SparseTensor

from ..graph_argument import GATHERS, aggregate, eager_with_torch_sparse, pair, sparse_tensor_graph
from ..message_passing import MessagePassing
from ._dense import LINEAR_GATHERS, linear, linear_sum, projects_first, root_term
from .twins import ScriptedAsPyG


class SAGEConv(MessagePassing, ScriptedAsPyG):
    r"""The GraphSAGE operator from the `"Inductive Representation Learning on
    Large Graphs" <https://arxiv.org/abs/1706.02216>`_ paper, on uGrapher's graph operators.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{mean}_{j \in \mathcal{N(i)}} \mathbf{x}_j

    If :obj:`project = True`, :math:`\mathbf{x}_j` is first projected via
    :math:`\mathbf{x}_j \leftarrow \sigma ( \mathbf{W}_3 \mathbf{x}_j + \mathbf{b})`.

    A drop-in replacement for :class:`torch_geometric.nn.conv.SAGEConv`: same arguments, same
    parameters (``lin_l``, ``lin_r``, ``lin``), so ``load_state_dict`` works both ways. The
    aggregation is **one** ``copy_u_<aggr>`` op (``u_mul_e_<aggr>`` for a ``torch.sparse`` adjacency,
    as PyG's ``spmm`` multiplies by its values; PyG drops a ``SparseTensor``'s values, and so does
    this layer). Any other aggregation PyG's layer takes (``"lstm"``, ``"softmax"``, an
    :class:`~torch_geometric.nn.aggr.Aggregation` module, a list of them) is built as PyG builds it,
    with PyG's parameters, and runs through PyG's propagation (:attr:`fallback_reason` says so).

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to derive it from the
            first input. A tuple gives the source and target sizes.
        out_channels (int): Size of each output sample.
        aggr (str or Aggregation or list, optional): :obj:`"mean"`, :obj:`"sum"` (or
            :obj:`"add"`), :obj:`"max"` or :obj:`"min"` run fused; any other aggregation of PyG's
            ``SAGEConv`` runs through PyG's path. (default: :obj:`"mean"`)
        normalize (bool, optional): :math:`\ell_2`-normalise the output features.
            (default: :obj:`False`)
        root_weight (bool, optional): Add the transformed root node features to the output.
            (default: :obj:`True`)
        project (bool, optional): Apply a linear transformation and a ReLU to the source features
            before aggregating. (default: :obj:`False`)
        bias (bool, optional): Learn an additive bias (in ``lin_l``). (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **inputs:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge indices
          :math:`(2, |\mathcal{E}|)` (a tensor, an ``EdgeIndex``, or a ``torch.sparse`` or
          ``torch_sparse.SparseTensor`` ``adj_t``)
        - **outputs:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(|\mathcal{V_t}|, F_{out})` if bipartite
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        aggr: Optional[Union[str, List[str], Aggregation]] = "mean",
        normalize: bool = False,
        root_weight: bool = True,
        project: bool = False,
        bias: bool = True,
        **kwargs,
    ) -> None:
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.normalize = normalize
        self.root_weight = root_weight
        self.project = project

        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)

        if not (aggr is None or isinstance(aggr, (str, list, tuple, Aggregation))):
            raise TypeError(
                f"aggr: expected a name, an Aggregation module or a list of them, got {type(aggr).__name__}"
            )
        gather = GATHERS.get(aggr) if isinstance(aggr, str) else None
        if aggr == "lstm":
            # PyG's SAGEConv gives the LSTM its channels; MessagePassing alone could not.
            kwargs.setdefault("aggr_kwargs", {})
            kwargs["aggr_kwargs"].setdefault("in_channels", in_channels[0])
            kwargs["aggr_kwargs"].setdefault("out_channels", in_channels[0])
        try:
            super().__init__(aggr, **kwargs)
        except ValueError as error:
            if "Could not resolve" not in str(error):
                raise
            raise ValueError(f"aggr: {error}") from None
        #: The IR gather op of a fused aggregation; None: PyG's aggregation module aggregates.
        self._gather: Optional[str] = gather

        if self.project:
            if in_channels[0] <= 0:
                raise ValueError(
                    f"in_channels: '{self.__class__.__name__}' does not support lazy initialization with `project=True`"
                )
            self.lin = Linear(in_channels[0], in_channels[0], bias=True)

        aggr_channels = in_channels[0]
        if isinstance(self.aggr_module, MultiAggregation):
            aggr_channels = self.aggr_module.get_out_channels(in_channels[0])
        self.lin_l = Linear(aggr_channels, out_channels, bias=bias)
        if self.root_weight:
            self.lin_r = Linear(in_channels[1], out_channels, bias=False)

        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    @eager_with_torch_sparse
    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Union[Tensor, SparseTensor],
        size: Optional[Tuple[int, int]] = None,
    ) -> Tensor:
        x_src, x_dst = pair(x)
        edge_index, size, _ = sparse_tensor_graph(self, edge_index, size)
        if self.project:
            x_src = self.lin(x_src).relu()

        root = self.lin_r if self.root_weight and x_dst is not None else None
        fused = self._gather is not None and self.unfused_reason() is None
        if fused and self._gather in LINEAR_GATHERS and projects_first(self.lin_l, x_src, root):
            x_l = F.linear(x_src, self.lin_l.weight)
            out = root_term(self.lin_l, root, x_dst, aggregate(self, self._gather, x_l, x_dst, edge_index, size))
        else:
            if fused:
                out = aggregate(self, self._gather, x_src, x_dst, edge_index, size)
            else:
                out = self.propagate(edge_index, x=(x_src, x_dst), size=size)
            out = linear(self.lin_l, out) if root is None else linear_sum(self.lin_l, out, root, x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"
