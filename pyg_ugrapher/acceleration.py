r"""``ug.accelerate``: a PyG model's message passing moved onto pyg_ugrapher, layer by layer.

(The module is not named ``accelerate``: importing a submodule of that name would replace the
function ``pyg_ugrapher.accelerate`` by the module.)

:func:`accelerate` walks a model's module tree and converts every
:class:`torch_geometric.nn.MessagePassing` it finds, in the manner of Liger-Kernel's
``apply_liger_kernel_to_*`` functions, but on a model that already exists:

* **swapped**: a layer of a class that :mod:`pyg_ugrapher.nn` has a drop-in for (``GCNConv``,
  ``GATConv``, ``GATv2Conv``, ``SAGEConv``, ``GINConv``, ``GINEConv``, ``GraphConv``; the exact
  classes, not subclasses) is replaced in its parent by the drop-in, built with the layer's constructor
  arguments (read back from its attributes). The drop-in takes over the layer's very submodules,
  parameters and buffers (the same objects, not copies): an optimizer built before the call still
  holds the model's parameters, tied weights stay tied, and devices, dtypes and ``requires_grad``
  flags are kept. A layer whose configuration the drop-in does not reproduce (an aggregation other
  than sum/mean/max/min, hooks on the layer, explain mode, ...) is routed instead.
* **routed**: any other ``MessagePassing`` keeps its identity and its own ``forward()``,
  ``message()`` and ``update()``; its class becomes ``Accelerated<Class>``, a subclass of
  :class:`pyg_ugrapher.MessagePassing` and of its own class, in that order, so that its propagations
  run through the capture of ``message()`` (one fused graph operator, see
  :mod:`pyg_ugrapher.message_passing`); a ``message()`` or ``edge_update()`` that is not one
  elementwise operator runs staged (graph operators around what it computes in PyTorch, see
  :mod:`pyg_ugrapher.staging`), and PyG's own ``propagate()`` runs where neither can. The order
  matters: PyG installs a ``propagate()`` generated for each class on that class itself, which
  would come first in the other order.
* **kept**: a class that defines its own ``propagate()`` (or an instance given one) keeps it;
  routing would bypass it.

Every conversion is recorded in an :class:`AccelerationReport`, attached to the returned model as
``model.ugrapher_report``: per layer, what was done, why not more, and how the layer ran since
(fused, or PyG's path and why; :meth:`AccelerationReport.observe` runs the model once to find out).

Example::

    >>> model = torch_geometric.nn.models.GAT(16, 32, num_layers=2, v2=True)
    >>> model = ug.accelerate(model)
    >>> print(model.ugrapher_report.observe(x, edge_index))
    ug.accelerate: 0 swapped, 2 routed, 0 kept, 0 already pyg_ugrapher; runs as: 2 fused
    layer    PyG class  conversion  runs as  ops  reason
    convs.0  GATv2Conv  routed      fused    5
    convs.1  GATv2Conv  routed      fused    5

``benchmarks/pyg_coverage.py`` runs every ``MessagePassing`` class of ``torch_geometric.nn.conv``
through it (``benchmarks/results/cpu/pyg_coverage.md``).
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

from torch.nn import Module
from torch_geometric.nn.conv import MessagePassing as PyGMessagePassing

from . import nn as drop_ins
from .aggregation import GATHER_OPS
from .graph_argument import KEPT_ON_THE_GRAPH
from .inspect import plan
from .message_passing import MessagePassing, adopt
from .nn.twins import ARGUMENTS, BASE_SETTINGS, PYG_CLASSES, transplant
from .rebinding import with_globals_replaced

#: Module methods a swapped layer implements itself: set on an instance, they would be dropped.
_METHODS = (
    "forward",
    "message",
    "aggregate",
    "update",
    "message_and_aggregate",
    "edge_update",
    "edge_updater",
    "explain_message",
)


# -- swapping known layers ---------------------------------------------------------------------------
#: PyG class -> (its drop-in, the drop-in's constructor arguments read from a layer).
SWAPS: Dict[Type[PyGMessagePassing], Tuple[Type[MessagePassing], Callable[[Any], Dict[str, Any]]]] = {
    PYG_CLASSES[name]: (getattr(drop_ins, name), arguments) for name, arguments in ARGUMENTS.items()
}

_DROP_INS = tuple(cls for cls, _ in SWAPS.values())


def _hooks(module: Module) -> List[str]:
    """The names of the module's non-empty hook tables (torch's and PyG's)."""
    return sorted(
        name.strip("_") for name, value in vars(module).items() if "hooks" in name and isinstance(value, dict) and value
    )


def _swap(layer: PyGMessagePassing) -> Tuple[Optional[MessagePassing], Optional[str]]:
    """``(drop-in, None)`` for a layer its drop-in reproduces, else ``(None, why not)``; ``(None, None)``
    for a class without a drop-in."""
    if type(layer) not in SWAPS:
        return None, None
    name = type(layer).__name__
    hooks = _hooks(layer)
    if hooks:
        return None, f"hooks on the layer ({', '.join(hooks)}) belong to the PyG instance"
    if layer.aggr_module is not None and _hooks(layer.aggr_module):
        return None, "hooks on the layer's aggregation module would not run in the drop-in, which has none"
    if layer.explain:
        return None, "explain mode is on"
    overridden = [method for method in _METHODS if method in vars(layer)]
    if overridden:
        return None, f"the instance overrides {', '.join(overridden)}()"
    if _own_propagate(layer):
        return None, "the instance has a propagate() of its own"
    aggr = GATHER_OPS.get(type(layer.aggr_module)) if isinstance(layer.aggr, str) else None
    if aggr is None:
        return None, f"the drop-in {name} takes sum, mean, max or min aggregation, not {layer.aggr!r}"
    cls, arguments = SWAPS[type(layer)]
    try:
        new = cls(**arguments(layer), aggr=aggr, flow=layer.flow)
    except (AttributeError, TypeError, ValueError) as error:  # a PyG version storing other arguments
        return None, f"the drop-in {name} cannot be built with the layer's arguments: {error}"
    differing = [
        f"{setting}={getattr(layer, setting)!r}"
        for setting in BASE_SETTINGS
        if getattr(new, setting) != getattr(layer, setting)
    ]
    if differing:
        return None, f"the drop-in {name} does not take {', '.join(differing)}"
    why = transplant(layer, new)
    if why is not None:
        return None, f"the drop-in {name} {why}"
    new.training = layer.training  # not train(): the moved submodules keep their own modes
    return new, None


# -- routing other layers ------------------------------------------------------------------------------
_ROUTED: Dict[type, type] = {}


def routed_class(cls: Type[PyGMessagePassing]) -> Type[MessagePassing]:
    """``Accelerated<cls>``: ``cls`` with :class:`pyg_ugrapher.MessagePassing` first in its MRO, made
    once per class. Its ``propagate`` is ours, also where PyG's explain mode and
    ``decomposed_layers`` setters rebind it on an instance (they read ``_orig_propagate`` and
    ``_jinja_propagate``; ours falls back to PyG's path in those modes itself). Its ``forward`` is
    ``cls``'s, reading PyG's self-loop helpers in the forms that keep their results on the graph
    (:func:`~pyg_ugrapher.graph_argument.kept_on_the_graph`)."""
    routed = _ROUTED.get(cls)
    if routed is None:
        name = f"Accelerated{cls.__name__}"
        body = {
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": f"{cls.__qualname__}, its propagations run by :class:`pyg_ugrapher.MessagePassing`.",
            "_orig_propagate": MessagePassing.propagate,
            "_jinja_propagate": MessagePassing.propagate,
            "__reduce_ex__": _reduce_routed,
            "accelerated_from": cls,
        }
        # PyG's self-loop helpers in its forward() keep their results on the graph (built once)
        forward = cls.forward
        if isinstance(forward, types.FunctionType):
            kept = with_globals_replaced(forward, KEPT_ON_THE_GRAPH)
            if kept is not forward:
                body["forward"] = kept
        routed = type(name, (MessagePassing, cls), body)
        # Of two threads that make one at once, both keep the first: one class per original.
        routed = _ROUTED.setdefault(cls, routed)
    return routed


def _reduce_routed(self: MessagePassing, protocol: int) -> Tuple[Any, ...]:
    # A routed class is made at run time and cannot be pickled by name: its instances pickle (and
    # deep-copy) as a call that makes it again from the original class.
    reduced = object.__reduce_ex__(self, protocol)
    return (_new_routed, (type(self).accelerated_from,)) + tuple(reduced[2:])


def _new_routed(cls: Type[PyGMessagePassing]) -> MessagePassing:
    """An empty instance of ``routed_class(cls)``, for unpickling (its state follows)."""
    routed = routed_class(cls)
    return routed.__new__(routed)


def _own_propagate(layer: PyGMessagePassing) -> bool:
    """Whether the instance holds a ``propagate`` other than the ones PyG's setters bind to it."""
    bound = vars(layer).get("propagate")
    if bound is None:
        return False
    cls = type(layer)
    generated = (getattr(cls, "_orig_propagate", None), getattr(cls, "_jinja_propagate", None))
    return getattr(bound, "__func__", None) not in generated


def _custom_propagate(cls: type) -> Optional[type]:
    """The class in ``cls``'s MRO below PyG's base that defines ``propagate()`` itself, if any (the
    ``propagate()`` PyG generates for a class and sets on it does not count)."""
    for klass in cls.__mro__:
        if klass is PyGMessagePassing:
            return None
        method = vars(klass).get("propagate")
        if method is not None and not getattr(method, "__module__", "").startswith(
            f"{klass.__module__}_{klass.__name__}"
        ):
            return klass
    return None


def _route(layer: PyGMessagePassing) -> Optional[str]:
    """Give ``layer`` its routed class; why not, as a sentence."""
    defining = _custom_propagate(type(layer))
    if defining is not None:
        return f"{defining.__name__} defines its own propagate(), which routing would bypass"
    if _own_propagate(layer):
        return "the instance has a propagate() of its own, which routing would bypass"
    vars(layer).pop("propagate", None)  # PyG's setters bind its generated propagate() to the instance
    layer.__class__ = routed_class(type(layer))
    adopt(layer)
    return None


# -- the report ---------------------------------------------------------------------------------------
@dataclass
class LayerReport:
    """What :func:`accelerate` did to one layer, and how it ran."""

    name: str  #: qualified name in the model (``""``: the model itself)
    pyg_class: str  #: the layer's class before the conversion
    #: ``"swapped"``, ``"routed"``, ``"kept"`` (left on PyG's path) or ``"none"`` (already a
    #: pyg_ugrapher layer: a drop-in, a routed layer, a subclass of :class:`pyg_ugrapher.MessagePassing`)
    conversion: str
    reason: Optional[str]  #: why a known layer was routed, or why a layer was kept
    layer: Module  #: the layer now in the model
    ops: Optional[int] = None  #: graph operators it ran in :meth:`AccelerationReport.observe`
    fallbacks: Tuple[str, ...] = ()  #: reasons of its propagations that took PyG's path there, each once
    edge_updates: int = 0  #: calls of PyG's ``edge_updater()`` path there (per-edge tensors in PyTorch)
    #: how its last propagation there ran ``message()`` staged (see :mod:`pyg_ugrapher.staging`), if it did
    staged: Optional[str] = None

    @property
    def runs_as(self) -> str:
        """``"drop-in"``; ``"PyG"`` for a kept layer; for the others, from :meth:`AccelerationReport.observe`:
        ``"fused"`` (one graph operator per propagation), ``"staged"`` (graph operators around what
        ``message()`` computes in PyTorch, no PyG propagation), ``"partly fused"`` (also PyG fallbacks
        or PyG's ``edge_updater()`` path), ``"PyG fallback"`` or ``"no propagation"``; before it, from
        the layer's last propagation: ``"fused"``, ``"staged"``, ``"PyG fallback"`` or ``"not run"``."""
        if isinstance(self.layer, _DROP_INS):
            return "drop-in"
        if self.conversion == "kept":
            return "PyG"
        if self.ops is not None:
            if not self.ops:
                return "PyG fallback" if self.fallbacks else "no propagation"
            if self.fallbacks or self.edge_updates:
                return "partly fused"
            return "staged" if self.staged else "fused"
        if self.layer.fallback_reason is not None:
            return "PyG fallback"
        if self.layer.staged_reason is not None:
            return "staged"
        return "not run" if self.layer.capture is None else "fused"

    @property
    def why(self) -> str:
        """Why the layer runs less than fused: PyG's fallback reasons, ``edge_updater()`` calls, and why
        a known layer was not swapped or a layer was kept."""
        reasons: List[str] = []
        if self.conversion in ("routed", "none") and not isinstance(self.layer, _DROP_INS):
            if self.ops is not None:
                reasons += self.fallbacks
                if self.staged and not self.fallbacks:
                    reasons.append(self.staged)
            elif self.layer.fallback_reason is not None:
                reasons.append(self.layer.fallback_reason)
            elif self.layer.staged_reason is not None:
                reasons.append(self.layer.staged_reason)
        if self.edge_updates:
            reasons.append(f"edge_updater() runs PyG's path ({self.edge_updates} call(s))")
        if self.reason:
            reasons.append(self.reason)
        return "; ".join(reasons)


class AccelerationReport:
    """The :class:`LayerReport` of every ``MessagePassing`` layer :func:`accelerate` met, in module
    order; prints as a table. How routed layers ran is read from their last propagation until
    :meth:`observe` records a whole forward pass."""

    def __init__(self, model: Module, layers: List[LayerReport]) -> None:
        self.model = model
        self.layers = layers

    def __iter__(self) -> Iterator[LayerReport]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, name: str) -> LayerReport:
        """The report of the layer of qualified name ``name``."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def count(self, runs_as: str) -> int:
        """How many layers run as ``runs_as`` (see :attr:`LayerReport.runs_as`)."""
        return sum(layer.runs_as == runs_as for layer in self.layers)

    def observe(self, *args: Any, **kwargs: Any) -> "AccelerationReport":
        """Run the model once on ``args``/``kwargs`` (through :func:`pyg_ugrapher.plan`, without
        gradients) and record per layer the graph operators it ran, the reasons of its propagations
        that took PyG's path and its ``edge_updater()`` calls. Returns the report itself."""
        counts: Dict[int, int] = {}

        def count(module: Module, inputs: Any, output: Any) -> None:
            # Our layers run edge_update() staged unless they say why not.
            if getattr(module, "edge_fallback_reason", "PyG's layer") is not None:
                counts[id(module)] = counts.get(id(module), 0) + 1

        handles = [layer.layer.register_edge_update_forward_hook(count) for layer in self.layers]
        try:
            entries = plan(self.model, *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        for layer in self.layers:
            mine = [entry for entry in entries if entry.module == layer.name]
            layer.ops = sum(entry.op is not None for entry in mine)
            layer.fallbacks = tuple(dict.fromkeys(entry.fallback_reason for entry in mine if entry.fallback_reason))
            layer.edge_updates = counts.get(id(layer.layer), 0)
            layer.staged = getattr(layer.layer, "staged_reason", None)
        return self

    def __str__(self) -> str:
        conversions = [layer.conversion for layer in self.layers]
        runs = [layer.runs_as for layer in self.layers]
        head = (
            f"ug.accelerate: {conversions.count('swapped')} swapped, {conversions.count('routed')} routed, "
            f"{conversions.count('kept')} kept, {conversions.count('none')} already pyg_ugrapher; runs as: "
            + ", ".join(f"{runs.count(kind)} {kind}" for kind in dict.fromkeys(runs))
        )
        rows = [("layer", "PyG class", "conversion", "runs as", "ops", "reason")]
        rows += [
            (
                layer.name or "<model>",
                layer.pyg_class,
                layer.conversion,
                layer.runs_as,
                "" if layer.ops is None else str(layer.ops),
                layer.why,
            )
            for layer in self.layers
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(5)]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5] for row in rows]
        return "\n".join([head] + [line.rstrip() for line in lines])

    __repr__ = __str__


# -- the walk -------------------------------------------------------------------------------------------
def accelerate(model: Module, *, inplace: bool = True) -> Module:
    r"""Run a PyG model's message passing on pyg_ugrapher: known layers swapped for the drop-ins of
    :mod:`pyg_ugrapher.nn`, every other :class:`torch_geometric.nn.MessagePassing` routed through the
    fused capture of its ``message()`` (see the module docstring).

    Args:
        model: any ``torch.nn.Module``; the model itself may be a layer.
        inplace: convert ``model`` itself (as Liger-Kernel's ``apply_liger_kernel_to_*`` do), or, when
            ``False``, a deep copy of it (as ``torch.ao.quantization.convert(inplace=False)``), leaving
            ``model`` as it was.

    Returns:
        The converted model, with its :class:`AccelerationReport` as ``ugrapher_report``. Use the
        returned object: a model that is itself a swapped layer is a new module. Swapped layers are
        replaced in their parents' module tables, so a reference to one held elsewhere (a plain
        attribute or list) keeps the PyG layer. Converting twice changes nothing more.

    Example::

        >>> model = ug.accelerate(model)
        >>> print(model.ugrapher_report.observe(data.x, data.edge_index))
    """
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: expected a bool, got {type(inplace).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    layers: List[LayerReport] = []
    # id of a module met before -> (it, what it became): a layer shared by several parents is converted
    # once; holding it keeps its id from being reused by a module made during the walk.
    done: Dict[int, Tuple[Module, Module]] = {}

    def convert(module: Module, name: str) -> Module:
        if id(module) in done:
            return done[id(module)][1]
        new = module
        if isinstance(module, MessagePassing):
            pyg_class = getattr(type(module), "accelerated_from", type(module)).__name__
            layers.append(LayerReport(name, pyg_class, "none", "already a pyg_ugrapher layer", module))
        elif isinstance(module, PyGMessagePassing):
            pyg_class = type(module).__name__
            swapped, why = _swap(module)
            if swapped is not None:
                new = swapped
                layers.append(LayerReport(name, pyg_class, "swapped", None, new))
            else:
                kept = _route(module)
                layers.append(LayerReport(name, pyg_class, "kept" if kept else "routed", kept or why, module))
        done[id(module)] = (module, new)
        for child_name, child in list(new._modules.items()):
            if child is not None:
                new._modules[child_name] = convert(child, f"{name}.{child_name}" if name else child_name)
        return new

    model = convert(model, "")
    model.ugrapher_report = AccelerationReport(model, layers)
    return model


__all__ = ["accelerate", "routed_class", "AccelerationReport", "LayerReport", "SWAPS"]
