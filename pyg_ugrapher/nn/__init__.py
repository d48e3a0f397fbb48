"""Drop-in replacements for PyG's convolution layers, running on uGrapher's graph operators.

Each layer is a :class:`pyg_ugrapher.MessagePassing`, takes the arguments of its PyG namesake and
has the same parameters, so a PyG layer's ``state_dict`` loads into it and back. The graph work of
``forward`` is a few :func:`pyg_ugrapher.compute` calls (fused Triton kernels on a GPU), never PyG's
``propagate``; :class:`GATv2Conv` runs PyG's ``message()`` and ``edge_update()`` through
:class:`pyg_ugrapher.MessagePassing`'s capture, with its self-loop graph cached. Under
``torch.compile`` a layer with a ``[2, E]`` edge index compiles without graph breaks, also with
``dynamic=True`` (one graph for every mini-batch), see :mod:`._graph`.
"""

from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .gcn_conv import GCNConv
from .gin_conv import GINConv, GINEConv
from .graph_conv import GraphConv
from .sage_conv import SAGEConv

__all__ = ["GCNConv", "GATConv", "GATv2Conv", "SAGEConv", "GINConv", "GINEConv", "GraphConv"]
