"""What a PyG user runs for each benchmarked operator, and cuSPARSE for the SpMMs.

The gather ops are the ``MessagePassing`` modules a user writes (PyG materialises one ``[E, F]``
message per edge, then scatter-reduces). The message-creation ops have no ``MessagePassing`` form
(their output lives on the edges): users write them with ``index_select``, and so do we.
Every module is called PyG-style, ``module(x, edge_index, *other_operands)``, with the operands
in our slot order.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing


class CopyUSum(MessagePassing):
    """``copy_u_sum``: out[v] = sum of x[u] over the edges (u, v)."""

    def __init__(self) -> None:
        super().__init__(aggr="sum")

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.propagate(edge_index, x=x)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j


class UMulESum(MessagePassing):
    """``u_mul_e_sum``: out[v] = sum of x[u] * w[e] (one weight per edge, as GCN's)."""

    def __init__(self) -> None:
        super().__init__(aggr="sum")

    def forward(self, x: Tensor, edge_index: Tensor, w: Tensor) -> Tensor:
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_j: Tensor, w: Tensor) -> Tensor:
        return x_j * w.view(-1, 1)


class CopyUMax(MessagePassing):
    """``copy_u_max``: out[v] = max of x[u] over the edges (u, v); 0 for isolated v."""

    def __init__(self) -> None:
        super().__init__(aggr="max")

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.propagate(edge_index, x=x)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j


class UDotV(nn.Module):
    """``u_dot_v``: out[e] = <x[u], y[v]>, shape ``[E, 1]`` (attention logits, link scores)."""

    def forward(self, x: Tensor, edge_index: Tensor, y: Tensor) -> Tensor:
        return (x.index_select(0, edge_index[0]) * y.index_select(0, edge_index[1])).sum(-1, keepdim=True)


class UAddV(nn.Module):
    """``u_add_v``: out[e] = x[u] + y[v], shape ``[E, F]``."""

    def forward(self, x: Tensor, edge_index: Tensor, y: Tensor) -> Tensor:
        return x.index_select(0, edge_index[0]) + y.index_select(0, edge_index[1])


PYG_MODULES: Dict[str, Callable[[], nn.Module]] = {
    "copy_u_sum": CopyUSum,
    "u_mul_e_sum": UMulESum,
    "copy_u_max": CopyUMax,
    "u_dot_v": UDotV,
    "u_add_v": UAddV,
}


def sparse_adjacency(edge_index: Tensor, num_nodes: int, values: Optional[Tensor]) -> Tensor:
    """The transposed adjacency ``A[v, u] = w(u -> v)`` as a ``torch.sparse`` CSR matrix.

    Rows sorted by destination, columns by source within a row; duplicate edges stay separate
    entries (cuSPARSE sums them), so the matrix has exactly the graph's E non-zeros. int32
    indices where they fit, as cuSPARSE prefers.
    """
    src, dst = edge_index[0], edge_index[1]
    order = torch.argsort(dst * num_nodes + src)
    fits = max(num_nodes, src.numel()) < 2**31
    index_dtype = torch.int32 if fits else torch.int64
    crow = torch.zeros(num_nodes + 1, dtype=torch.int64, device=src.device)
    torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0, out=crow[1:])
    if values is None:
        values = torch.ones(src.numel(), device=src.device)
    # Valid by construction: skip the O(E) invariant check (it would also warn when left implicit).
    return torch.sparse_csr_tensor(
        crow.to(index_dtype),
        src[order].to(index_dtype),
        values[order],
        size=(num_nodes, num_nodes),
        check_invariants=False,
    )
