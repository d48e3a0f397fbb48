"""Each drop-in layer and its PyG namesake: the constructor arguments read back from a layer's
attributes (both classes store them under the same names) and the state put from one into the other.

:mod:`pyg_ugrapher.acceleration` swaps a PyG layer for its drop-in with them. The other way,
:func:`pyg_twin` is what ``torch.jit.script`` compiles in place of a drop-in
(:meth:`ScriptedAsPyG.__prepare_scriptable__`): PyG's layers are scriptable, the drop-ins' fused
path (custom operators, caches, Triton launches) is not, and the twin computes the same function on
the same parameters.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch.nn import Module, Parameter
from torch_geometric.nn.conv import MessagePassing as PyGMessagePassing
from torch_geometric.nn.conv.gat_conv import GATConv
from torch_geometric.nn.conv.gatv2_conv import GATv2Conv
from torch_geometric.nn.conv.gcn_conv import GCNConv
from torch_geometric.nn.conv.gin_conv import GINConv, GINEConv
from torch_geometric.nn.conv.graph_conv import GraphConv
from torch_geometric.nn.conv.sage_conv import SAGEConv


def _attributes(layer: Any, *names: str) -> Dict[str, Any]:
    """The constructor arguments a layer stores under their own names."""
    return {name: getattr(layer, name) for name in names}


def _gcn(layer: Any) -> Dict[str, Any]:
    names = ("in_channels", "out_channels", "improved", "cached", "add_self_loops", "normalize")
    return dict(_attributes(layer, *names), bias=layer.bias is not None)


def _gat(layer: Any) -> Dict[str, Any]:
    names = ("in_channels", "out_channels", "heads", "concat", "negative_slope", "dropout")
    names += ("add_self_loops", "edge_dim", "fill_value", "residual")
    return dict(_attributes(layer, *names), bias=layer.bias is not None)


def _gatv2(layer: Any) -> Dict[str, Any]:
    names = ("in_channels", "out_channels", "heads", "concat", "negative_slope", "dropout")
    names += ("add_self_loops", "edge_dim", "fill_value", "share_weights", "residual")
    return dict(_attributes(layer, *names), bias=layer.bias is not None)


def _sage(layer: Any) -> Dict[str, Any]:
    names = ("in_channels", "out_channels", "normalize", "root_weight", "project")
    return dict(_attributes(layer, *names), bias=layer.lin_l.bias is not None)


def _gin(layer: Any) -> Dict[str, Any]:
    # The network is the user's module and moves over as it is; the constructor, which resets the
    # network it is given, gets a stand-in.
    return dict(nn=torch.nn.Identity(), eps=layer.initial_eps, train_eps=isinstance(layer.eps, Parameter))


def _gine(layer: Any) -> Dict[str, Any]:
    # With edge_dim, the constructor reads the network's input width from its first map.
    edge_dim = None if layer.lin is None else layer.lin.in_channels
    stand_in = torch.nn.Identity() if layer.lin is None else torch.nn.Linear(layer.lin.out_channels, 1)
    return dict(nn=stand_in, eps=layer.initial_eps, train_eps=isinstance(layer.eps, Parameter), edge_dim=edge_dim)


def _graph_conv(layer: Any) -> Dict[str, Any]:
    return dict(_attributes(layer, "in_channels", "out_channels"), bias=layer.lin_rel.bias is not None)


#: Class name (a drop-in's is its PyG namesake's) -> the constructor arguments read from a layer.
ARGUMENTS: Dict[str, Callable[[Any], Dict[str, Any]]] = {
    "GCNConv": _gcn,
    "GATConv": _gat,
    "GATv2Conv": _gatv2,
    "SAGEConv": _sage,
    "GINConv": _gin,
    "GINEConv": _gine,
    "GraphConv": _graph_conv,
}

#: Class name -> PyG's class, from the module that defines it: code that puts the drop-ins in
#: ``torch_geometric.nn``'s place (a test harness) leaves these alone.
PYG_CLASSES: Dict[str, type] = {
    cls.__name__: cls for cls in (GCNConv, GATConv, GATv2Conv, SAGEConv, GINConv, GINEConv, GraphConv)
}

#: Attributes of PyG's base class a layer keeps beside its constructor arguments.
BASE_SETTINGS = ("flow", "node_dim", "decomposed_layers")


def transplant(old: Module, new: Module) -> Optional[str]:
    """Put ``old``'s direct submodules, parameters and buffers into ``new`` in place of its own (the
    same objects: both then hold them); why not (completes a sentence) when the two do not hold the
    same state under the same names."""
    if (
        set(old._modules) != set(new._modules)
        or set(old._parameters) != set(new._parameters)
        or set(old._buffers) != set(new._buffers)
        or old._non_persistent_buffers_set != new._non_persistent_buffers_set
    ):
        return (
            f"has other state (submodules {sorted(new._modules)}, parameters {sorted(new._parameters)}, "
            f"buffers {sorted(new._buffers)}) than the layer ({sorted(old._modules)}, "
            f"{sorted(old._parameters)}, {sorted(old._buffers)})"
        )
    for table in ("_modules", "_parameters", "_buffers"):
        for key, value in getattr(old, table).items():
            mine = getattr(new, table)[key]
            if (value is None) != (mine is None):
                kind = table.strip("_")[:-1]
                return f"leaves {kind} {key!r} {'unset' if mine is None else 'set'}, the layer does not"
    for table in ("_modules", "_parameters", "_buffers"):
        getattr(new, table).update(getattr(old, table))
    return None


def pyg_twin(layer: PyGMessagePassing) -> PyGMessagePassing:
    """PyG's layer of the drop-in ``layer``'s class, built with its arguments and settings, holding
    ``layer``'s very submodules, parameters and buffers, in its training mode."""
    name = type(layer).__name__
    aggr = layer.aggr if isinstance(layer.aggr, (str, list)) else layer.aggr_module
    twin = PYG_CLASSES[name](**ARGUMENTS[name](layer), aggr=aggr)
    for setting in BASE_SETTINGS:
        setattr(twin, setting, getattr(layer, setting))
    why = transplant(layer, twin)
    if why is not None:
        raise RuntimeError(f"PyG's {name} {why}")
    twin.training = layer.training
    return twin


class ScriptedAsPyG:
    """A drop-in layer's ``torch.jit.script`` support: the scripted module is :func:`pyg_twin`."""

    def __prepare_scriptable__(self) -> PyGMessagePassing:
        return pyg_twin(self)
