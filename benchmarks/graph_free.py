"""The layers of the step benchmark's models without their graph operators: the floor of a step.

Each stand-in takes its namesake's constructor arguments (those :func:`benchmarks.train_e2e.build_model`
passes) and is called as ``layer(x, edge_index)``, but never reads the graph: it applies the
layer's dense maps (its linear transforms, GIN's network) to every node's own features, with the
layer's output width. A training step of a model of these stand-ins costs what a step of the real
model costs besides its graph operators: feature dropout, linear maps and their backward, loss,
Adam, a mini-batch's copy to the GPU. So its time (``impl`` ``no-graph`` in ``steps.csv``) bounds
every implementation of the graph operators from below, and a step's time minus it is what that
step's graph operators cost, host time included.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["GATConv", "GATv2Conv", "GCNConv", "GINConv", "SAGEConv"]


class GCNConv(nn.Module):
    r"""GCN's :math:`\mathbf{x}_i \mathbf{\Theta} + \mathbf{b}` without the normalised sum over
    the neighbours."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs: object) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.lin(x) + self.bias


class GATConv(nn.Module):
    r"""GAT's projection :math:`\mathbf{\Theta}\mathbf{x}_i` per head (heads concatenated or
    averaged) plus the bias, without the attention over the neighbours."""

    def __init__(
        self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True, **kwargs: object
    ) -> None:
        super().__init__()
        self.heads, self.out_channels, self.concat = heads, out_channels, concat
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(heads * out_channels if concat else out_channels))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        out = self.lin(x)
        if not self.concat:
            out = out.view(-1, self.heads, self.out_channels).mean(dim=1)
        return out + self.bias


class GATv2Conv(GATConv):
    """GATv2's stand-in: its projection, as :class:`GATConv`'s."""


class SAGEConv(nn.Module):
    r"""GraphSAGE's :math:`\mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \mathbf{x}_i`: its two linear
    maps, the first on the node's own features instead of its neighbours' mean."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs: object) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_channels, out_channels)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.lin_l(x) + self.lin_r(x)


class GINConv(nn.Module):
    r"""GIN's :math:`h_{\mathbf{\Theta}}((1 + \epsilon) \mathbf{x}_i)` without the neighbours' sum."""

    def __init__(self, nn: nn.Module, eps: float = 0.0, train_eps: bool = False, **kwargs: object) -> None:
        super().__init__()
        self.nn = nn
        eps_tensor = torch.tensor([float(eps)])
        if train_eps:
            self.eps = torch.nn.Parameter(eps_tensor)
        else:
            self.register_buffer("eps", eps_tensor)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.nn((1 + self.eps) * x)
