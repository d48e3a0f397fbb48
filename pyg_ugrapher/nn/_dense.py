r"""The dense steps around a layer's graph operator: its bias and its bias-carrying linear map.

A bias :math:`b` added to every row of an ``[N, F]`` output has the gradient
:math:`\partial L / \partial b = \sum_v G_v`. Eager PyTorch reduces over the rows with a generic
reduction kernel whose parallelism is its ``F`` outputs: on an H100 it took 196 us for
``N = 2e5, F = 128`` (0.5 TB/s), against 50 us for the same sum as a matrix-vector product
:math:`G^\top \mathbf{1}` (``benchmarks/results/h100-reuse/probes/probe35.txt``). Eager layer
steps of ~2 ms spent 0.2 ms on each bias. Compiled graphs keep the plain sum: Inductor fuses it
into a reduction of its own (~35 us there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import is_lazy

#: Rows from which the matrix-vector product pays for its extra launch and autograd node.
MIN_ROWS = 1 << 15


class _AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: Tensor, bias: Tensor) -> Tensor:
        return out + bias

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows = grad.reshape(-1, grad.shape[-1])
        grad_bias = rows.t().mv(rows.new_ones(rows.shape[0])) if ctx.needs_input_grad[1] else None
        return grad, grad_bias


def add_bias(out: Tensor, bias: Tensor) -> Tensor:
    """``out + bias`` (``bias`` of ``out``'s last size), its bias gradient a matrix-vector product
    on large eager outputs."""
    width = out.shape[-1] if out.dim() else 0
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not bias.requires_grad or width == 0 \
            or out.numel() < MIN_ROWS * width or out.dtype != bias.dtype:
        return out + bias
    return _AddBias.apply(out, bias)


def linear(lin: torch.nn.Module, x: Tensor) -> Tensor:
    """``lin(x)`` for a PyG or torch ``Linear`` (its parameters and initialisation untouched),
    with :func:`add_bias`'s bias gradient."""
    bias = lin.bias
    # Under autocast ``lin`` computes in the autocast dtype bias included; the sum of a half
    # product and a float32 bias would be float32.
    if torch.compiler.is_compiling() or bias is None or is_lazy(lin.weight) or \
            torch.is_autocast_enabled(x.device.type):
        return lin(x)
    return add_bias(F.linear(x, lin.weight), bias)
