r"""PyG's aggregation modules on graph operators, part by part.

A ``MessagePassing`` layer aggregates its messages with an ``Aggregation`` module. Four of them
are IR gather ops (:data:`GATHER_OPS`), which the fused and staged runs compute directly;
``VarAggregation`` and ``StdAggregation`` are means of the messages and of their squares
(:data:`MOMENTS`). Two more combine others: ``MultiAggregation`` (SAGEConv's ``aggr=["mean", "max"]``) concatenates,
projects or attends over the results of several aggregations, and ``DegreeScalerAggregation``
(PNAConv) scales the result of one by functions of each receiver's degree. Such a module is
computed here as a tree: each part that is a gather op runs as one graph operator (on the
symbolic messages where ``message()`` was captured: no per-edge tensor is written), a variance or
standard deviation as two, finished as PyG finishes them; each
``MultiAggregation`` combines its parts' results with its own
:meth:`~torch_geometric.nn.aggr.MultiAggregation.combine`; each ``DegreeScalerAggregation``
scales its part's result with PyG's own code; and any other part (``StdAggregation``,
``LSTMAggregation``, a hooked module, ...) is PyG's module called on the per-edge messages as PyG
calls it, the messages computed once for all such parts.

The result is PyG's: the combinations and scalers are PyG's own code, whatever the version; the
variance's few lines follow PyG's ``VarAggregation`` and ``StdAggregation`` (the tests compare).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, List, Optional

import torch
from torch import Tensor
from torch_geometric.nn.aggr import (
    Aggregation,
    DegreeScalerAggregation,
    MaxAggregation,
    MeanAggregation,
    MinAggregation,
    MultiAggregation,
    StdAggregation,
    SumAggregation,
    VarAggregation,
)

#: PyG aggregation modules that are IR gather ops (exact types: a subclass may reduce differently).
GATHER_OPS = {SumAggregation: "sum", MeanAggregation: "mean", MaxAggregation: "max", MinAggregation: "min"}

#: Aggregations computed from the receivers' means of the messages and of their squares.
MOMENTS = (VarAggregation, StdAggregation)

#: The result of a gather op over the messages, or over their squares:
#: ``run_gather(gather_op, squared)``.
GatherRunner = Callable[[str, bool], Tensor]


def hooked(module: Aggregation) -> bool:
    """Whether ``module`` has forward hooks, which only a call of the module itself runs."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _combines(module: Aggregation) -> bool:
    """Whether ``module`` is computed from its parts here: an unhooked ``MultiAggregation`` or
    ``DegreeScalerAggregation`` (exact types: a subclass may combine otherwise)."""
    return type(module) in (MultiAggregation, DegreeScalerAggregation) and not hooked(module)


def _parts(module: Aggregation) -> List[Aggregation]:
    return list(module.aggrs) if type(module) is MultiAggregation else [module.aggr]


def on_graph_operators(module: Optional[Aggregation]) -> bool:
    """Whether some part of ``module`` runs as a graph operator (see the module docstring)."""
    if not isinstance(module, Aggregation) or hooked(module):
        return False
    if type(module) in GATHER_OPS or type(module) in MOMENTS:
        return True
    return _combines(module) and any(on_graph_operators(part) for part in _parts(module))


def in_pytorch(module: Aggregation) -> List[str]:
    """The class names of the parts of ``module`` that PyG computes on the messages, in order."""
    if (type(module) in GATHER_OPS or type(module) in MOMENTS) and not hooked(module):
        return []
    if _combines(module):
        return [name for part in _parts(module) for name in in_pytorch(part)]
    return [type(module).__name__]


class _Computed:
    """``module`` inside its own ``forward``, with its part ``aggr`` already computed: PyG's
    ``DegreeScalerAggregation.forward`` then scales ``result`` exactly as it would its own."""

    def __init__(self, module: Aggregation, result: Tensor) -> None:
        self._module, self._result = module, result

    def aggr(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def aggregate(
    module: Aggregation,
    run_gather: GatherRunner,
    messages: Callable[[], Tensor],
    index: Optional[Tensor],
    ptr: Optional[Tensor],
    dim_size: Optional[int],
    dim: int,
) -> Tensor:
    """``module(messages(), index, ptr=ptr, dim_size=dim_size, dim=dim)`` (what PyG's ``aggregate()``
    calls), its gather-op parts given by ``run_gather``; ``messages()`` (the per-edge messages) is
    called only for the parts PyG computes."""
    gather = GATHER_OPS.get(type(module))
    if gather is not None and not hooked(module):
        return run_gather(gather, False)
    if type(module) in MOMENTS and not hooked(module):
        return _moment(module, run_gather)
    if type(module) is MultiAggregation and not hooked(module):
        parts = [aggregate(part, run_gather, messages, index, ptr, dim_size, dim) for part in module.aggrs]
        return module.combine(parts)
    if type(module) is DegreeScalerAggregation and not hooked(module):
        result = aggregate(module.aggr, run_gather, messages, index, ptr, dim_size, dim)
        # PyG's forward reads the messages only through its part, computed already.
        return DegreeScalerAggregation.forward(_Computed(module, result), result, index, ptr, dim_size, dim)
    return module(messages(), index, ptr=ptr, dim_size=dim_size, dim=dim)


def _moment(module: Aggregation, run_gather: GatherRunner) -> Tensor:
    r"""``VarAggregation``'s :math:`\overline{m^2} - \bar m^2` (the mean of the squares without
    gradient for ``semi_grad``), and for ``StdAggregation`` its square root as PyG takes it: the
    variance clamped to :math:`10^{-5}` first, results at that floor set to 0."""
    variance = module if type(module) is VarAggregation else module.var_aggr
    mean = run_gather("mean", False)
    with torch.no_grad() if variance.semi_grad else contextlib.nullcontext():
        mean_of_squares = run_gather("mean", True)
    out = mean_of_squares - mean * mean
    if type(module) is StdAggregation:
        out = out.clamp(min=1e-5).sqrt()
        out = out.masked_fill(out <= math.sqrt(1e-5), 0.0)
    return out


__all__ = ["GATHER_OPS", "MOMENTS", "GatherRunner", "aggregate", "hooked", "in_pytorch", "on_graph_operators"]
