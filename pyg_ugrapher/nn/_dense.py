r"""The dense steps around a layer's graph operator: its bias and its bias-carrying linear map.

A bias :math:`b` added to every row of an ``[N, F]`` output has the gradient
:math:`\partial L / \partial b = \sum_v G_v`. Eager PyTorch reduces over the rows with a generic
reduction kernel whose parallelism is its ``F`` outputs: on an H100 it took 196 us for
``N = 2e5, F = 128`` (0.5 TB/s), against 50 us for the same sum as a matrix-vector product
:math:`G^\top \mathbf{1}` (``benchmarks/results/h100-reuse/probes/probe35.txt``). Eager layer
steps of ~2 ms spent 0.2 ms on each bias. Compiled graphs keep the plain sum: Inductor fuses it
into a reduction of its own (~35 us there).

Each of these autograd Functions costs host time that native nodes do not (its backward is Python
on autograd's device thread): on an H200 host a SAGE or GIN step's backward issued 50-150 us faster
with native nodes, for 0.2-0.3 ms more GPU time on the layer suite's ``2e5 x 128`` outputs
(``benchmarks/results/h200-host-nodes``, probe 100). The saving of the product grows with the
bias gradient's elements and the host cost does not, so the Functions apply from
:data:`MIN_ELEMENTS` on: a sampler's mini-batches (``~5e4 x 64``), whose steps are host time,
keep the native nodes.

A layer that adds a root term to its aggregation, ``lin(aggr) + root(x)`` (SAGEConv, GraphConv),
runs as two GEMMs whose epilogues add the bias and the other product (``addmm``): eager, it was two
GEMMs and two ``[N, F]`` additions (0.15 ms of a 1.3 ms SAGE step on an H200,
``benchmarks/results/h200-compiled-overhead``, probe 60).

GAT's projection :math:`x = r W^\top` and its attention halves
:math:`\alpha = \langle x_{v,h}, a_h \rangle` (per head, for each attention vector :math:`a`) are
products of :math:`r` with :math:`W` and with :math:`W` folded into the vectors,
:math:`\tilde W_h = \sum_c a_{h,c} W_{h,c}`: as PyTorch ops a graph of eleven autograd nodes
(views, ``cat``, ``mul``, ``sum``, two ``mm``, ``unbind``), one node here
(:class:`_ProjectionAttention`).

GIN's network is the user's: its ``Linear`` submodules run as this module's own linear map for the
call (:func:`network`), so their bias gradients are matrix-vector products too.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import is_lazy
from torch_geometric.nn.dense.linear import Linear as PygLinear

#: Elements of a bias gradient (rows times width) from which the matrix-vector product saves more GPU
#: time than its autograd Function costs host time (see the module docstring).
MIN_ELEMENTS = 1 << 23


class _AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: Tensor, bias: Tensor) -> Tensor:
        return out + bias

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, _row_sum(grad.reshape(-1, grad.shape[-1])) if ctx.needs_input_grad[1] else None


#: A vector of ones per (device, dtype), as long as the most rows summed so far: allocated in
#: each backward, it added its size (0.8 MiB for 2e5 rows) to a step's peak memory.
_ONES: Dict[Tuple[torch.device, torch.dtype], Tensor] = {}


def _row_sum(rows: Tensor) -> Tensor:
    """The bias gradient ``rows^T 1`` as a matrix-vector product (see the module docstring)."""
    count, key = rows.shape[0], (rows.device, rows.dtype)
    ones = _ONES.get(key)
    if ones is None or ones.shape[0] < count:
        ones = _ONES[key] = rows.new_ones(count)
    return rows.t().mv(ones[:count])


def add_bias(out: Tensor, bias: Tensor) -> Tensor:
    """``out + bias`` (``bias`` of ``out``'s last size), its bias gradient a matrix-vector product
    on large eager outputs."""
    width = out.shape[-1] if out.dim() else 0
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not bias.requires_grad or width == 0 \
            or out.numel() < MIN_ELEMENTS or out.dtype != bias.dtype:
        return out + bias
    return _AddBias.apply(out, bias)


class _Linear(torch.autograd.Function):
    """``x @ W^T + b``, or ``addend += x @ W^T`` in place (a root term computed first): the bias
    and the other product in the GEMMs' epilogues; the bias gradient as :class:`_AddBias`'s."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], addend: Optional[Tensor]) -> Tensor:
        if addend is not None:
            ctx.mark_dirty(addend)
            out = addend.addmm_(x, weight.t())
        else:
            out = torch.mm(x, weight.t()) if bias is None else torch.addmm(bias, x, weight.t())
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (grad.mm(weight) if needs[0] else None, grad.t().mm(x) if needs[1] else None,
                _row_sum(grad) if needs[2] else None, grad if needs[3] else None)


def _eager(x: Tensor, *maps: torch.nn.Module) -> bool:
    """Whether the maps' own products may be replaced on ``x``: not traced (Dynamo cannot trace
    ``is_lazy``, so that comes first), no autocast (under it a map computes in the autocast dtype),
    initialised weights."""
    return not (torch.compiler.is_compiling() or torch.is_autocast_enabled(x.device.type) or
                any(is_lazy(m.weight) for m in maps))


def _fused(x: Tensor, *maps: torch.nn.Module) -> bool:
    """Whether :class:`_Linear` applies to ``x`` and :func:`_eager` maps: a two-dimensional input
    whose products have :data:`MIN_ELEMENTS` elements, one dtype throughout."""
    if x.dim() != 2 or x.shape[0] * maps[0].weight.shape[0] < MIN_ELEMENTS:
        return False
    dtypes = {x.dtype}.union(p.dtype for m in maps for p in (m.weight, m.bias) if p is not None)
    return len(dtypes) == 1


def linear_sum(lin: torch.nn.Module, x: Tensor, root: torch.nn.Module, root_x: Tensor) -> Tensor:
    """``lin(x) + root(root_x)`` for PyG or torch ``Linear`` maps, ``root`` without bias, as two
    :class:`_Linear` GEMMs where that applies (:func:`_eager`, :func:`_fused` for both inputs),
    else through the modules: the root term with ``lin``'s bias, then ``x``'s product added in
    place. The backward runs the later node first and then frees ``x`` (the layer's aggregation),
    before the root term's weight gradient is allocated: as one node, both weight gradients were
    allocated while it was alive, 64 KiB above compiled PyG's peak in SAGE's step on an H200
    (``benchmarks/results/h200-gin-mlp``, probe 71)."""
    if root.bias is not None or not _eager(x, lin, root) or not _fused(x, lin, root) or not _fused(root_x, root):
        return linear(lin, x) + root(root_x)
    return _Linear.apply(x, lin.weight, None, _Linear.apply(root_x, root.weight, lin.bias, None))


def linear(lin: torch.nn.Module, x: Tensor) -> Tensor:
    """``lin(x)`` for a PyG or torch ``Linear`` (its parameters and initialisation untouched) whose
    bias needs a gradient: :class:`_Linear` where that applies, else :func:`add_bias`'s bias
    gradient for inputs of more dimensions; the module itself otherwise."""
    return _linear(lin, x, lin)


def _linear(lin: torch.nn.Module, x: Tensor, plain: Callable[[Tensor], Tensor]) -> Tensor:
    """:func:`linear`, with ``plain`` for the module's own product (its class's forward, where
    :func:`network` has replaced the instance's)."""
    bias = lin.bias
    # Under autocast ``lin`` computes in the autocast dtype bias included; the sum of a half
    # product and a float32 bias would be float32.
    if bias is None or not bias.requires_grad or not torch.is_grad_enabled() or not _eager(x, lin):
        return plain(x)
    if _fused(x, lin):
        return _Linear.apply(x, lin.weight, bias, None)
    if x.dim() > 2:
        return add_bias(F.linear(x, lin.weight), bias)
    return plain(x)


#: Module types whose forward is ``F.linear(x, weight, bias)`` and nothing else.
_LINEARS = (torch.nn.Linear, PygLinear)


def _routed(module: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    own = type(module).forward.__get__(module)
    return lambda x: _linear(module, x, own)


def network(net: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``net(x)`` for a user's network (GIN's: a ``Sequential``, PyG's ``MLP``, any module), its
    torch and PyG ``Linear`` submodules computing through :func:`linear` for this call: their
    eager bias gradients were ATen's strided reductions (0.39 ms of a 1.84 ms GIN step on an H200,
    and 132 MiB of workspace above the step's live set, ``benchmarks/results/h200-gat-profile``,
    probe 51). Each such submodule gets an instance ``forward`` for the call's duration, so the
    network's own forward (norms, activations, dropout, residuals) and every hook run as they
    would. Left to ``net(x)``: ``torch.compile`` (Inductor fuses that reduction), JIT tracing and
    scripted modules, no-grad mode, lazy submodules, those whose instance already has a ``forward``
    of its own, and those whose bias gradient has fewer than :data:`MIN_ELEMENTS` elements for
    ``x``'s rows (a network that keeps its rows, as GIN's does). One network must not run in two
    threads at once."""
    if not isinstance(net, torch.nn.Module) or isinstance(net, torch.jit.ScriptModule) or \
            torch.compiler.is_compiling() or not torch.is_grad_enabled() or torch.jit.is_tracing():
        return net(x)
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    routed = [m for m in net.modules() if type(m) in _LINEARS and "forward" not in m.__dict__
              and not is_lazy(m.weight) and rows * m.weight.shape[0] >= MIN_ELEMENTS]
    if not routed:
        return net(x)
    for module in routed:
        # Set on the instance, past Module.__setattr__ (a plain attribute: nothing to register).
        object.__setattr__(module, "forward", _routed(module))
    try:
        return net(x)
    finally:
        for module in routed:
            del module.__dict__["forward"]


def _fold(weight: Tensor, vectors: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(att, folded)``: the ``k`` attention vectors ``[1, H, C]`` as ``[k, H, C, 1]``, and the
    weight ``[H * C, in]`` folded into each, ``[k * H, in]``."""
    heads, channels = vectors[0].shape[1:]
    att = torch.cat(tuple(vectors)).view(len(vectors), heads, channels, 1)
    return att, (weight.view(heads, channels, -1) * att).sum(2).view(len(vectors) * heads, -1)


class _ProjectionAttention(torch.autograd.Function):
    """``(raw @ W^T).view(N, H, C)`` (if ``project``) and each attention half as one node."""

    @staticmethod
    def forward(ctx, raw: Tensor, weight: Tensor, project: bool, *vectors: Tensor) -> Tuple[Optional[Tensor], ...]:
        att, folded = _fold(weight, vectors)
        heads, channels = att.shape[1:3]
        alphas = raw.mm(folded.t()).view(-1, len(vectors), heads).unbind(1)
        ctx.save_for_backward(raw, weight, *vectors)
        ctx.project = project
        x = raw.mm(weight.t()).view(-1, heads, channels) if project else None
        return (x,) + alphas

    @staticmethod
    def backward(ctx, grad_x: Optional[Tensor], *grad_alphas: Tensor):
        # The fold is recomputed from the saved inputs: folded in the forward, it had no history,
        # and a double backward lost every second-order term through the weight and the vectors.
        raw, weight, *vectors = ctx.saved_tensors
        att, folded = _fold(weight, vectors)
        k, heads, channels = att.shape[:3]
        needs = ctx.needs_input_grad
        grad_rows = torch.stack(grad_alphas, 1).view(-1, k * heads)
        grad_x = grad_x.reshape(-1, heads * channels) if ctx.project else None
        grad_raw = grad_weight = None
        grad_vectors: Tuple[Optional[Tensor], ...] = (None,) * k
        if needs[0]:
            grad_raw = grad_rows.mm(folded)
            if grad_x is not None:
                grad_raw.addmm_(grad_x, weight)
        if needs[1] or any(needs[3:]):
            grad_folded = grad_rows.t().mm(raw).view(k, heads, 1, -1)
            if needs[1]:
                grad_weight = (grad_folded * att).sum(0).view(heads * channels, -1)
                if grad_x is not None:
                    grad_weight.addmm_(grad_x.t(), raw)
            if any(needs[3:]):
                grad_vectors = tuple((weight.view(1, heads, channels, -1) * grad_folded).sum(-1).unsqueeze(1)
                                     .unbind(0))
        return (grad_raw, grad_weight, None) + grad_vectors


def projection_attention(lin: torch.nn.Module, raw: Tensor, vectors: Sequence[Tensor], project: bool = True
                         ) -> Tuple[Optional[Tensor], Tuple[Tensor, ...]]:
    """``(x, alphas)``: the projection ``x = lin(raw).view(N, H, C)`` of a bias-free PyG or torch
    ``Linear`` (``None`` without ``project``) and, for each attention vector ``a`` (``[1, H, C]``),
    ``(x * a).sum(-1)``, ``[N, H]``, computed from ``raw`` and ``lin``'s weight folded into ``a``:
    through ``x``, its gradient would add an ``[N, H * C]`` term to ``x``'s, and eager PyTorch would
    sum ``x * a`` over the nodes with strided reductions several times slower. Where it applies
    (eager, two-dimensional input of the weight's dtype, no autocast) one autograd node,
    :class:`_ProjectionAttention`; else PyTorch ops, a lazy ``lin`` initialised by one call."""
    heads, channels = vectors[0].shape[1:]
    if not _eager(raw, lin) or raw.dim() != 2 or raw.dtype != lin.weight.dtype:
        # Under autocast lin's product is half, as in PyG.
        x = lin(raw).view(-1, heads, channels) if project else None
        if not torch.compiler.is_compiling() and not project and is_lazy(lin.weight):
            lin(raw)  # an edge projection takes its shape here, the one time [E, H * C] is formed
        _, folded = _fold(lin.weight, vectors)
        return x, F.linear(raw, folded).view(-1, len(vectors), heads).unbind(1)
    x, *alphas = _ProjectionAttention.apply(raw, lin.weight, project, *vectors)
    return x, tuple(alphas)
