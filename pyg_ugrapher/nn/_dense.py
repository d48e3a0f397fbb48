r"""The dense steps around a layer's graph operator: its bias and its bias-carrying linear map.

A bias :math:`b` added to every row of an ``[N, F]`` output has the gradient
:math:`\partial L / \partial b = \sum_v G_v`. Eager PyTorch reduces over the rows with a generic
reduction kernel whose parallelism is its ``F`` outputs, which for a few hundred thousand rows
and ``F = 128`` runs far below the memory bandwidth; the same sum as a matrix-vector product
:math:`G^\top \mathbf{1}` runs near it, and in an eager layer step the difference is a visible
share of the step. Compiled graphs keep the plain sum: Inductor fuses it into a reduction of its
own.

Each of these autograd Functions costs host time that native nodes do not (its backward is Python
on autograd's device thread). The saving of the product grows with the bias gradient's elements
and the host cost does not, so the Functions apply from :data:`MIN_ELEMENTS` on: a sampler's
mini-batches (``~5e4 x 64``), whose steps are host time, keep the native nodes.

A layer that adds a root term to its aggregation, ``lin(aggr) + root(x)`` (SAGEConv, GraphConv),
runs as two GEMMs whose epilogues add the bias and the other product (``addmm``), instead of two
GEMMs and two ``[N, F]`` additions.

GAT's projection :math:`x = r W^\top` and its attention halves
:math:`\alpha = \langle x_{v,h}, a_h \rangle` (per head, for each attention vector :math:`a`) are
products of :math:`r` with :math:`W` and with :math:`W` folded into the vectors,
:math:`\tilde W_h = \sum_c a_{h,c} W_{h,c}`: as PyTorch ops a graph of eleven autograd nodes
(views, ``cat``, ``mul``, ``sum``, two ``mm``, ``unbind``), one node here
(:class:`_ProjectionAttention`).

GIN's network is the user's: where it is a ``Sequential``, :func:`network` calls its children in
order itself and its ``Linear`` maps through :func:`linear` with their own parameters, so their bias
gradients are matrix-vector products too. No module is ever changed for a call: a network runs in
several threads at once, and a hook on it or on one of its maps sees the call as ``net(x)`` makes it.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as module_hooks
from torch.nn.parameter import UninitializedTensorMixin, is_lazy
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
#: each backward, it would add its size to a step's peak memory.
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
    if (
        torch.compiler.is_compiling()
        or not torch.is_grad_enabled()
        or not bias.requires_grad
        or width == 0
        or out.numel() < MIN_ELEMENTS
        or out.dtype != bias.dtype
    ):
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
        return (
            grad.mm(weight) if needs[0] else None,
            grad.t().mm(x) if needs[1] else None,
            _row_sum(grad) if needs[2] else None,
            grad if needs[3] else None,
        )


def called_plainly(module: torch.nn.Module) -> bool:
    """Whether ``module(x)`` is its class's ``forward(x)`` and nothing else: no hooks (its own or
    global), no ``forward`` set on the instance, no compiled call (``Module.compile``), the
    ``__call__`` of ``torch.nn.Module``. Only then may a product of its parameters stand in for it."""
    return not (
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or module_hooks._global_forward_hooks
        or module_hooks._global_forward_pre_hooks
        or module_hooks._global_backward_hooks
        or module_hooks._global_backward_pre_hooks
        or "forward" in module.__dict__
        or module._compiled_call_impl is not None
        or type(module).__call__ is not torch.nn.Module.__call__
    )


def _eager(x: Tensor, *maps: torch.nn.Module) -> bool:
    """Whether the maps' own products may be replaced on ``x``: not traced (Dynamo cannot trace
    ``is_lazy``, so that comes first), no autocast (under it a map computes in the autocast dtype),
    initialised weights, each map a plain ``Linear`` (:func:`_replaceable`)."""
    return not torch.compiler.is_compiling() and _replaceable(x, maps, compiling=False)


def _fused(x: Tensor, *maps: torch.nn.Module) -> bool:
    """Whether :class:`_Linear` applies to ``x`` and :func:`_eager` maps: a two-dimensional input
    whose products have :data:`MIN_ELEMENTS` elements, one dtype throughout."""
    if x.dim() != 2 or x.shape[0] * maps[0].weight.shape[0] < MIN_ELEMENTS:
        return False
    dtypes = {x.dtype}.union(p.dtype for m in maps for p in (m.weight, m.bias) if p is not None)
    return len(dtypes) == 1


def _elements(x: Tensor, lin: torch.nn.Module) -> int:
    """Elements of ``lin(x)``, read from shapes alone: the first test of whether a product may
    replace the map (:data:`MIN_ELEMENTS`), cheaper than :func:`_eager`'s. 0 for an uninitialised
    (lazy) map or a scalar ``x``."""
    weight = lin.weight
    if x.ndim == 0 or isinstance(weight, UninitializedTensorMixin):
        return 0
    return x.numel() // (x.shape[-1] or 1) * weight.shape[0]


def linear_sum(lin: torch.nn.Module, x: Tensor, root: torch.nn.Module, root_x: Tensor) -> Tensor:
    """``lin(x) + root(root_x)`` for PyG or torch ``Linear`` maps, ``root`` without bias, as two
    :class:`_Linear` GEMMs where that applies (:func:`_eager`, :func:`_fused` for both inputs),
    else through the modules (any other module runs as itself): the root term with ``lin``'s
    bias, then ``x``'s product added in place. The backward runs the later node first and then
    frees ``x`` (the layer's aggregation), before the root term's weight gradient is allocated: as
    one node, both weight gradients would be allocated while it is alive, which puts a step's peak
    memory above compiled PyG's."""
    if (
        torch.compiler.is_compiling()
        or type(lin) not in _LINEARS
        or type(root) not in _LINEARS
        or _elements(x, lin) < MIN_ELEMENTS
    ):
        return lin(x) + root(root_x)  # what linear(lin, x) would call (the lazy check first: see linear)
    if (
        root.bias is not None
        or _elements(root_x, root) < MIN_ELEMENTS
        or not _eager(x, lin, root)
        or not _fused(x, lin, root)
        or not _fused(root_x, root)
    ):
        return linear(lin, x) + root(root_x)
    return _Linear.apply(x, lin.weight, None, _Linear.apply(root_x, root.weight, lin.bias, None))


def linear(lin: torch.nn.Module, x: Tensor) -> Tensor:
    """``lin(x)`` for a PyG or torch ``Linear`` (its parameters and initialisation untouched) whose
    bias needs a gradient: :class:`_Linear` where that applies, else :func:`add_bias`'s bias
    gradient for inputs of more dimensions; the module itself otherwise (any other module, and a
    ``Linear`` with hooks, see :func:`called_plainly`)."""
    # Dynamo cannot trace the lazy check of _elements.
    if not torch.is_grad_enabled() or torch.compiler.is_compiling() or type(lin) not in _LINEARS:
        return lin(x)
    return _eager_linear(lin, x)


def _eager_linear(lin: torch.nn.Module, x: Tensor) -> Tensor:
    """:func:`linear` with gradients enabled, outside ``torch.compile`` (what :func:`network` has
    checked once for all its maps)."""
    bias = lin.bias
    # Under autocast ``lin`` computes in the autocast dtype bias included; the sum of a half
    # product and a float32 bias would be float32. Below MIN_ELEMENTS neither product applies.
    if bias is None or not bias.requires_grad or _elements(x, lin) < MIN_ELEMENTS or not _eager(x, lin):
        return lin(x)
    if _fused(x, lin):
        return _Linear.apply(x, lin.weight, bias, None)
    if x.dim() > 2:
        return add_bias(F.linear(x, lin.weight), bias)
    return lin(x)


#: Module types whose forward is ``F.linear(x, weight, bias)`` and nothing else.
_LINEARS = (torch.nn.Linear, PygLinear)

#: Gathers that commute with a linear map: ``gather(x) @ W^T == gather(x @ W^T)`` (a sum or mean of
#: rows, weighted or not, an empty one included: both sides are zero).
LINEAR_GATHERS = frozenset(("sum", "mean"))


def projects_first(lin: torch.nn.Module, x: Tensor, root: Optional[torch.nn.Module] = None) -> bool:
    """Whether a layer's linear map ``lin`` of its aggregation of ``x`` by a gather of
    :data:`LINEAR_GATHERS` (SAGEConv, GraphConv: ``lin(aggregation(x)) + root(x_dst)``) runs first,
    as GCN's does: ``aggregation(x @ W^T)`` plus :func:`root_term`. The order changes only the
    rounding; what it changes is the width of the aggregations a step runs.

    Aggregation first, the forward aggregates ``in_channels`` features, and the backward does
    again where ``x`` needs a gradient. Map first, both aggregate ``out_channels`` features, and
    the backward aggregates wherever ``x`` or the weight needs a gradient (the weight's gradient
    then reads the aggregated output gradient instead of the aggregation kept from the forward).
    The map goes first where that aggregates fewer features in all: a model's last layer, which
    narrows to its classes, and a first layer on raw features many times wider than its output
    (bag-of-words inputs of thousands of features), but not a first layer of 128 -> 64 (one
    128-wide aggregation against two 64-wide ones). Only on an ``x`` of :data:`MIN_ELEMENTS`
    elements or more, where a graph operator's time grows with its width; small graphs' eager
    steps are host time, which the check would only add to. The maps must be plain ``Linear``
    modules, ``root`` without bias (:func:`_replaceable`); under ``torch.compile`` too, where the
    compiled graph then holds the same order."""
    maps = (lin,) if root is None else (lin, root)
    if (
        x.numel() < MIN_ELEMENTS
        or not _replaceable(x, maps, torch.compiler.is_compiling())
        or (root is not None and root.bias is not None)
    ):
        return False
    weight = lin.weight
    out_channels, in_channels = weight.shape
    if not torch.is_grad_enabled():
        return out_channels < in_channels
    # Aggregations of each width per step, forward and backward.
    after = 1 + (x.requires_grad or weight.requires_grad)
    before = 1 + x.requires_grad
    return out_channels * after < in_channels * before


def _replaceable(x: Tensor, maps: Sequence[torch.nn.Module], compiling: bool) -> bool:
    """Whether each of ``maps`` may be replaced by ``F.linear`` of its parameters on ``x``, also
    under ``torch.compile`` (``compiling``): a torch or PyG ``Linear`` :func:`called_plainly` (an
    uninitialised PyG ``Linear`` is not: its initialisation is a hook), with an initialised weight
    (checked outside ``torch.compile`` only: Dynamo cannot trace the check), no autocast (under it
    a map computes in the autocast dtype)."""
    if torch.is_autocast_enabled(x.device.type):
        return False
    for lin in maps:  # a loop, not any() of a generator: each generator step is a Python call
        if type(lin) not in _LINEARS or not called_plainly(lin) or (not compiling and is_lazy(lin.weight)):
            return False
    return True


def root_term(lin: torch.nn.Module, root: Optional[torch.nn.Module], root_x: Optional[Tensor], out: Tensor) -> Tensor:
    """``out`` (a projected aggregation, :func:`projects_first`) plus ``lin``'s bias and
    ``root(root_x)`` where both are given: the root term as :func:`linear_sum` computes it, one
    :class:`_Linear` GEMM with the bias in its epilogue where that applies."""
    bias = lin.bias
    if root is None or root_x is None:
        return out if bias is None else add_bias(out, bias)
    if (
        bias is not None
        and bias.requires_grad
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()  # Inductor fuses the bias gradient's reduction
        and _fused(root_x, root, lin)
    ):
        return out + _Linear.apply(root_x, root.weight, bias, None)
    return out + F.linear(root_x, root.weight, bias)


def network(net: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``net(x)`` for a user's network (GIN's), with the bias gradients of its torch and PyG
    ``Linear`` maps as matrix-vector products (:func:`linear`; ATen's eager reductions are slow, see
    above, and take a workspace above the step's live set) where the network is a ``Sequential``:
    its children are called in order, as ``Sequential.forward`` calls them, a ``Linear`` child
    through :func:`linear` with its own parameters and a ``Sequential`` child the same way. Nothing
    of the modules is changed or replaced, so one network may run in several threads at once. Any
    other module (PyG's ``MLP``, a ``Sequential`` subclass with a forward of its own, a module not
    :func:`called_plainly`: hooked, compiled) runs as ``module(x)``, and so does the whole network
    under ``torch.compile`` (Inductor fuses that reduction), JIT tracing, as a scripted module and in
    no-grad mode."""
    if (
        not isinstance(net, torch.nn.Module)
        or isinstance(net, torch.jit.ScriptModule)
        or torch.compiler.is_compiling()
        or not torch.is_grad_enabled()
        or torch.jit.is_tracing()
    ):
        return net(x)
    return _walk(net, x)


def _walk(module: torch.nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` as :func:`network` computes it."""
    if not called_plainly(module):
        return module(x)
    if type(module) in _LINEARS:
        return _eager_linear(module, x)
    if type(module).forward is torch.nn.Sequential.forward:
        for child in module:
            x = _walk(child, x)
        return x
    return module(x)


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
        ctx.project, ctx.fold = project, (att, folded)
        x = raw.mm(weight.t()).view(-1, heads, channels) if project else None
        return (x,) + alphas

    @staticmethod
    def backward(ctx, grad_x: Optional[Tensor], *grad_alphas: Tensor):
        # A double backward recomputes the fold from the saved inputs: folded in the forward, it has
        # no history, and through it every second-order term of the weight and the vectors was lost.
        # A first-order backward reads the forward's (three kernels fewer per call).
        raw, weight, *vectors = ctx.saved_tensors
        att, folded = _fold(weight, vectors) if torch.is_grad_enabled() else ctx.fold
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
                grad_vectors = tuple((weight.view(1, heads, channels, -1) * grad_folded).sum(-1).unsqueeze(1).unbind(0))
        return (grad_raw, grad_weight, None) + grad_vectors


def projection_attention(
    lin: torch.nn.Module, raw: Tensor, vectors: Sequence[Tensor], project: bool = True
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
