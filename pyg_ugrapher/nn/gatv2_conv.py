from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv.gatv2_conv import GATv2Conv as PyGGATv2Conv
from torch_geometric.typing import SparseTensor

from ..graph_argument import (
    built_in_recording,
    check_features,
    is_sparse,
    looped_edge_attr,
    looped_graph,
    spare_row_index,
    spare_row_loop_attr,
    unequal_sides_under_target_to_source,
)
from ..message_passing import MessagePassing
from .twins import ScriptedAsPyG, pyg_twin


class GATv2Conv(MessagePassing, PyGGATv2Conv, ScriptedAsPyG):
    r"""The GATv2 operator of `"How Attentive are Graph Attention Networks?"
    <https://arxiv.org/abs/2105.14491>`_, PyG's :class:`~torch_geometric.nn.conv.GATv2Conv` on
    uGrapher's graph operators:

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},
        \qquad
        \alpha_{i,j} = \frac{\exp\left(\mathbf{a}^{\top}\mathrm{LeakyReLU}\left(
        \mathbf{\Theta}_{s} \mathbf{x}_j + \mathbf{\Theta}_{t} \mathbf{x}_{i}
        \left[ + \mathbf{\Theta}_{e} \mathbf{e}_{j,i} \right] \right)\right)}
        {\sum_{k \in \mathcal{N}(i) \cup \{ i \}}
        \exp\left(\mathbf{a}^{\top}\mathrm{LeakyReLU}\left(
        \mathbf{\Theta}_{s} \mathbf{x}_k + \mathbf{\Theta}_{t} \mathbf{x}_{i}
        \left[ + \mathbf{\Theta}_{e} \mathbf{e}_{k,i} \right] \right)\right)}.

    Same constructor arguments, parameters, ``state_dict`` keys and results as PyG's layer, whose
    ``message()`` and ``edge_update()`` it runs through :class:`pyg_ugrapher.MessagePassing`: the
    attention logits and their segment softmax become graph operators, the weighted sum one fused
    operator. What the drop-in adds is the self-loop handling of a ``[2, E]`` edge index: PyG's
    ``forward`` removes and re-adds the self loops on every call (a new edge index whose graph
    structure must be built again, and host synchronisations); here the graph with the loops is
    built once per edge index and reused while the index is unchanged. Its stored self loops keep
    their places but go to a spare destination row whose output is dropped
    (:func:`~pyg_ugrapher.graph_argument.spare_row_index`), so its sizes follow from shapes alone
    and a new index (a mini-batch's) costs no host sync; with attention dropout, the mask is drawn
    over that graph's edges, the same as PyG's on a graph without stored loops. Only
    ``return_attention_weights``, which returns PyG's looped index, runs on the graph whose stored
    loops are removed (:func:`~pyg_ugrapher.graph_argument.looped_graph`); under ``torch.compile``
    it runs so on the graph cached on the index, outside the compiled graph. Every other compiled
    call reads the spare-row index cached on the index, in the compiled graph, also with
    ``dynamic=True`` (PyG's ``forward`` there breaks the graph at the self-loop removal, a size
    read from the index). On a graph of at least
    :attr:`~pyg_ugrapher.MessagePassing.staged_min_edges` edges with its loops, where the attention
    (``edge_update()`` and its softmax) runs on graph operators, the layer runs as in eager mode
    outside the compiled graph (a graph break); on a smaller one Inductor compiles PyG's code for
    the attention. Sparse adjacencies,
    recordings that rebuild the graph, explain mode and hooks run PyG's ``forward`` on this layer,
    and PyG's layer on this layer's parameters runs a bipartite call under
    ``flow="target_to_source"`` whose sides differ in size (PyG sizes its output by ``x[0]`` there).
    """

    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Tensor]],
        edge_index: Union[Tensor, SparseTensor],
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The input node features.
            edge_index (torch.Tensor or SparseTensor): The graph: ``[2, E]`` indices, or a
                ``torch.sparse`` or ``torch_sparse.SparseTensor`` adjacency.
            edge_attr (torch.Tensor, optional): The edge features. (default: :obj:`None`)
            return_attention_weights (bool, optional): If set, also return
                ``(edge_index, alpha)``: the graph with its self loops and the attention
                coefficients ``[E, H]``. (default: :obj:`None`)
        """
        if unequal_sides_under_target_to_source(self.flow, x):
            # PyG's sizes there follow no graph of the kernels' (see the helper): PyG's layer runs.
            return pyg_twin(self)(x, edge_index, edge_attr, return_attention_weights)
        if not self._loops_cached(edge_index):
            return PyGGATv2Conv.forward(self, x, edge_index, edge_attr, return_attention_weights)
        if torch.compiler.is_compiling() and (return_attention_weights or self._attention_staged(x, edge_index)):
            return _looped_forward_outside_compile(self, x, edge_index, edge_attr, return_attention_weights)
        return self._looped_forward(x, edge_index, edge_attr, return_attention_weights)

    def _attention_staged(self, x: Union[Tensor, Tuple[Tensor, Tensor]], edge_index: Tensor) -> bool:
        """Whether an eager call computes the attention staged on graph operators: its graph, the
        index with a loop per node of the smaller side, has at least
        :attr:`~pyg_ugrapher.MessagePassing.staged_min_edges` edges. Compiled, such a call runs
        eagerly outside the compiled graph: traced, ``edge_update()`` is PyG's code, whose softmax
        over every edge Inductor compiles to several times the staged run's time. Under
        ``dynamic=True`` the comparison guards on the sizes."""
        sizes = _side_sizes(x)
        if sizes is None:
            return False  # _looped_forward refuses it
        return edge_index.size(1) + min(sizes) >= self.staged_min_edges

    def _looped_forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Tensor]],
        edge_index: Tensor,
        edge_attr: Optional[Tensor],
        return_attention_weights: Optional[bool],
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
        """:meth:`forward` on the graph with self loops cached on ``edge_index``."""
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        if isinstance(x, Tensor):
            check_features("x", x)
            if self.res is not None:
                res = self.res(x)
            x_l = self.lin_l(x).view(-1, H, C)
            x_r = x_l if self.share_weights else self.lin_r(x).view(-1, H, C)
        else:
            if not isinstance(x, (tuple, list)) or len(x) != 2 or x[1] is None:
                raise TypeError("x: expected a tensor or a pair (x_src, x_dst) of tensors")
            check_features("x[0]", x[0])
            check_features("x[1]", x[1])
            if self.res is not None:
                res = self.res(x[1])
            x_l = self.lin_l(x[0]).view(-1, H, C)
            x_r = self.lin_r(x[1]).view(-1, H, C)

        num_src, num_dst = _side_sizes(x)
        num_loops = min(num_src, num_dst)
        # Sides of different sizes under flow="target_to_source" ran PyG's layer (forward), so the
        # spare row serves every call but one returning PyG's looped index.
        spare_row = not return_attention_weights
        if not spare_row:
            looped = looped_graph(edge_index, self.flow, num_src, num_dst, num_loops)
            index = looped.index
            if edge_attr is not None:
                edge_attr = looped_edge_attr(looped, edge_attr, num_loops, self.fill_value)
        else:
            # Stored self loops go to a spare destination row, whose output is dropped: the graph's
            # sizes follow from shapes alone, so a new index costs no host sync. x_r (read as x_i)
            # gets that row, and x_l too where it sizes the destinations' row of the index.
            index = spare_row_index(
                edge_index, self.flow, num_src, num_dst, num_loops, spare_src_row=self.flow == "target_to_source"
            )
            if edge_attr is not None:
                edge_attr = spare_row_loop_attr(edge_index, edge_attr, num_loops, self.fill_value)
            x_r = F.pad(x_r, (0, 0, 0, 0, 0, 1))
            if self.flow == "target_to_source":
                x_l = F.pad(x_l, (0, 0, 0, 0, 0, 1))
        alpha = self.edge_updater(index, x=(x_l, x_r), edge_attr=edge_attr)
        out = self.propagate(index, x=(x_l, x_r), alpha=alpha)
        if spare_row:
            out = out[:-1]

        out = out.view(-1, H * C) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        bias = self.bias  # each read of a parameter is a Python call (Module.__getattr__)
        if bias is not None:
            out = out + bias
        if return_attention_weights:
            # The looped index is cached with the graph: the caller gets its own, as PyG's is new
            # every call.
            return out, (looped.index.clone(), alpha)
        return out

    def _loops_cached(self, edge_index: object) -> bool:
        """Whether this call adds self loops to a ``[2, E]`` index through the looped graph cached
        on it (not while a CUDA graph capture builds the index's structures, whose sizes must follow
        from shapes alone); elsewhere PyG's ``forward`` runs."""
        return (
            self.add_self_loops
            and isinstance(edge_index, Tensor)
            and not is_sparse(edge_index)
            and (torch.compiler.is_compiling() or not built_in_recording(edge_index))
            and self.unfused_reason() is None
        )


def _side_sizes(x: object) -> Optional[Tuple[int, int]]:
    """``(sources, destinations)`` of the node features ``x`` (a tensor, or a pair of tensors), the
    loops of the looped graph being the smaller; ``None`` for anything else."""
    if isinstance(x, Tensor):
        return x.size(0), x.size(0)
    if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], Tensor) and isinstance(x[1], Tensor):
        return x[0].size(0), x[1].size(0)
    return None


#: :meth:`GATv2Conv._looped_forward` run eagerly from a compiled model (a graph break) where it
#: returns the attention weights (PyG's looped index, whose size depends on the count of stored self
#: loops, is cached on the index, looked up by the index's identity, which a compiled graph does not
#: keep) or computes the attention staged (:meth:`GATv2Conv._attention_staged`).
_looped_forward_outside_compile = torch.compiler.disable(GATv2Conv._looped_forward)
