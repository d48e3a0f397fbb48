"""How much of PyG ``ug.accelerate`` covers: every ``MessagePassing`` class of ``torch_geometric.nn.conv``.

    python -m benchmarks.pyg_coverage                      # every class -> benchmarks/results/cpu/
    python -m benchmarks.pyg_coverage --classes GCNConv LEConv EdgeConv --out /tmp/coverage
    python -m benchmarks.pyg_coverage --device cuda --dtype float32 --nodes 4000 --edges 60000 \
        --channels 32 --hub 0.05 --name pyg_coverage_cuda_float32   # -> benchmarks/results/<gpu>/

Each class is built with the arguments of :data:`CASES` on a random graph (:class:`Setup`; by
default 12 vertices, 40 edges with a self loop and a duplicate, an isolated vertex, 8 features, and
whatever else it reads: edge features, positions, normals, edge and node types), in float64 and in
eval mode (no dropout, no sampling). The PyG layer and ``ug.accelerate`` of a deep copy of it run
one forward and one backward pass of the same loss: on the CPU our graph operators run on the
reference executor, or on Triton's interpreter with ``TRITON_INTERPRET=1``; on a GPU
(``--device cuda``) on the Triton kernels, with the schedules a graph of that size gets. In another
dtype (``--dtype float32``) or on a GPU both are compared with PyG's float64 run on the CPU of the
same rounded parameters, inputs and loss weights, and ours matches if it is as close as
:data:`TOLERANCE` or as PyG's own run in that dtype (:func:`_bound`). Per class the table says:

* ``conversion``: what :func:`pyg_ugrapher.accelerate` did (``swapped`` for a drop-in, ``routed``
  through the capture of ``message()``, ``kept`` on PyG's path);
* ``runs``: ``yes``, ``PyG fails: <error>`` (PyG's own layer fails here, mostly for an optional
  package that is not installed) or ``fails: <error>`` (the converted layer fails);
* ``forward_match`` / ``grads_match``: outputs, and gradients of every parameter and every
  floating-point input, within that bound (the errors are columns too, PyG's own ones as
  ``pyg_forward_error`` and ``pyg_grads_error``);
* ``ops``: graph operators our side ran in the forward pass; ``fallbacks``: propagations that took
  PyG's own path; ``edge_updates``: calls of ``edge_updater()`` that took PyG's path;
  ``staged``: ``message()`` ran staged (graph operators around what it computes in PyTorch, see
  :mod:`pyg_ugrapher.staging`; as on a graph of ``MessagePassing.staged_min_edges`` edges or more, below which a
  staged propagation, and a capture of several operators, runs PyG's); ``fully_fused``: at least one
  operator, no PyG path and not staged (``message()`` captured once: the fused operator, and where
  needed a few before it, such as a softmax's maxima and sums);
  ``edges_in_pytorch``: a staged call computed per-edge values in PyTorch, or an aggregation
  part ran in PyTorch on the per-edge messages. A Linear split by linearity into products of the
  node rows does not count (it multiplies node rows), nor one split into products of the edge
  features' rows: it multiplies the rows of edge features given to ``propagate()`` (or of values
  computed from those alone), an input transform PyG computes as well, not values gathered from
  vertices; a Linear of a per-edge value computed from vertex rows counts. A layer that runs
  without PyG's path and without this computes every per-edge value inside graph operators;
* ``reason``: the fallback reasons the capture gives, then why a known layer was not swapped.

The CSV and a markdown table with the summary counts go to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pandas as pd
import torch
import torch_geometric
from torch import Tensor
from torch.nn import Linear, ReLU, Sequential
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import degree
from tqdm import tqdm

import pyg_ugrapher as ug
from pyg_ugrapher import ops
from pyg_ugrapher.message_passing import observe_fallbacks, observe_stages
from pyg_ugrapher.staging import ON_EDGES

from .rows import default_out, environment

#: Largest relative error (to the largest magnitude of the float64 result) that counts as a match, per
#: dtype of the run: float64 results are compared with PyG's float64 run, those of another dtype
#: with PyG's float64 run of the same (rounded) inputs and parameters, where PyG's own run in that
#: dtype may set a wider bound (twice its error; :func:`_bound`).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in TOLERANCE}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu"
EDGE_DIM, NUM_RELATIONS = 4, 3
COLUMNS = (
    "layer",
    "conversion",
    "runs",
    "forward_match",
    "forward_error",
    "pyg_forward_error",
    "grads_match",
    "grads_error",
    "pyg_grads_error",
    "ops",
    "fallbacks",
    "edge_updates",
    "staged",
    "fully_fused",
    "edges_in_pytorch",
    "reason",
)


@dataclass(frozen=True)
class Setup:
    """The graph, width, dtype and device of a coverage run."""

    num_nodes: int = 12
    num_edges: int = 40
    channels: int = 8
    dtype: torch.dtype = torch.float64
    device: torch.device = torch.device("cpu")
    #: The share of the random edges that end at vertex 0 (a hub).
    hub: float = 0.0

    def __post_init__(self) -> None:
        if self.num_nodes < 8:
            raise ValueError(f"num_nodes: at least 8 (the heterogeneous cases take 7 of them), got {self.num_nodes}")
        if self.num_edges < 3:
            raise ValueError(f"num_edges: at least 3 (a self loop and a duplicate among them), got {self.num_edges}")
        if self.channels < 2 or self.channels % 2:
            raise ValueError(f"channels: an even number of at least 2 (two heads of half), got {self.channels}")
        if self.dtype not in TOLERANCE:
            raise TypeError(f"dtype: one of {', '.join(DTYPES)}, got {self.dtype}")
        if not 0.0 <= self.hub < 1.0:
            raise ValueError(f"hub: a share in [0, 1), got {self.hub}")

    def describe(self) -> str:
        hub = f", {self.hub:.0%} of them into one vertex" if self.hub else ""
        return (
            f"a random graph of {self.num_nodes:,} vertices and {self.num_edges:,} edges{hub}, "
            f"{self.channels} features, {str(self.dtype).removeprefix('torch.')}, on {self.device.type}"
        )


@dataclass
class Inputs:
    """What the layers take, all made from one seed."""

    x: Tensor
    edge_index: Tensor
    edge_weight: Tensor
    edge_attr: Tensor
    pos: Tensor
    normal: Tensor
    pseudo: Tensor  #: edge pseudo-coordinates in [0, 1] (SplineConv)
    edge_type: Tensor
    node_type: Tensor
    sequence: Tensor  #: ``[N, 3, C]`` layer history (DNAConv)

    @classmethod
    def make(cls, setup: Setup, seed: int = 0) -> "Inputs":
        """The inputs of ``setup``: made in float64 on the host, then rounded to its dtype and moved
        to its device (so a float64 copy of them, :meth:`to`, holds the same values)."""
        n, e = setup.num_nodes, setup.num_edges
        g = torch.Generator().manual_seed(seed)
        edge_index = torch.randint(0, n - 1, (2, e - 1), generator=g)  # vertex N-1 isolated
        hub = torch.rand(e - 1, generator=g) < setup.hub
        edge_index[1, hub] = 0
        edge_index[:, 0] = 2  # a self loop
        edge_index = torch.cat([edge_index, edge_index[:, 1:2]], dim=1)  # and a duplicate edge

        def rand(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=g, dtype=torch.float64)

        made = cls(
            x=rand(n, setup.channels),
            edge_index=edge_index,
            edge_weight=torch.rand(e, generator=g, dtype=torch.float64) + 0.5,
            edge_attr=rand(e, EDGE_DIM),
            pos=rand(n, 3),
            normal=rand(n, 3),
            pseudo=torch.rand(e, 2, generator=g, dtype=torch.float64),
            edge_type=torch.randint(0, NUM_RELATIONS, (e,), generator=g),
            node_type=torch.randint(0, 2, (n,), generator=g),
            sequence=rand(n, 3, setup.channels),
        )
        return made.to(setup.dtype, setup.device)

    @property
    def channels(self) -> int:
        return self.x.shape[1]

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def to(self, dtype: torch.dtype, device: Optional[torch.device] = None) -> "Inputs":
        """A copy with the floating-point tensors in ``dtype``, every tensor on ``device``."""
        return Inputs(
            **{
                name: value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
                for name, value in vars(self).items()
            }
        )

    def fresh(self) -> "Inputs":
        """A copy whose floating-point tensors are new leaves that require gradients."""
        return Inputs(
            **{
                name: value.detach().clone().requires_grad_(value.is_floating_point())
                for name, value in vars(self).items()
            }
        )


def _mlp(*sizes: int) -> Sequential:
    layers: List[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [Linear(a, b)] + ([ReLU()] if i < len(sizes) - 2 else [])
    return Sequential(*layers)


_METADATA = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")])


def _hetero(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    x_dict = {"a": i.x, "b": i.x[:7] * 2}
    src, dst = i.edge_index
    edge_index_dict = {
        ("a", "to", "b"): torch.stack([src, dst % 7]),
        ("b", "to", "a"): torch.stack([src % 7, dst]),
        ("a", "self", "a"): i.edge_index,
    }
    return (x_dict, edge_index_dict), {}


def _mesh(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    # Each mesh edge (a row of x) has four neighbouring edges, k+1...k+4: edge_index[:, 4k:4k+4] start at k.
    n, device = i.num_nodes, i.x.device
    first = torch.arange(n, device=device).repeat_interleave(4)
    return (i.x, torch.stack([first, (first + torch.arange(1, 5, device=device).repeat(n)) % n])), {}


def _plain(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    return (i.x, i.edge_index), {}


def _weighted(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    return (i.x, i.edge_index, i.edge_weight), {}


def _with_attr(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    return (i.x, i.edge_index, i.edge_attr), {}


def _typed(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    return (i.x, i.edge_index, i.edge_type), {}


def _initial(i: Inputs) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    return (i.x, i.x.detach() * 0.5, i.edge_index), {}


def _pna(i: Inputs) -> torch.nn.Module:
    deg = torch.bincount(degree(i.edge_index[1], i.num_nodes, dtype=torch.long)).cpu()
    return pyg_conv.PNAConv(
        i.channels, i.channels, ["mean", "max", "std"], ["identity", "amplification"], deg, edge_dim=EDGE_DIM
    )


R = NUM_RELATIONS
Case = Tuple[Callable[[Inputs], torch.nn.Module], Callable[[Inputs], Tuple[Tuple[Any, ...], Dict[str, Any]]]]
#: Class name -> (constructor, given the inputs it runs on; the forward arguments from the inputs).
CASES: Dict[str, Case] = {
    "SimpleConv": (lambda i: pyg_conv.SimpleConv(combine_root="sum"), _weighted),
    "GCNConv": (lambda i: pyg_conv.GCNConv(i.channels, i.channels), _weighted),
    "ChebConv": (lambda i: pyg_conv.ChebConv(i.channels, i.channels, K=2), _weighted),
    "SAGEConv": (lambda i: pyg_conv.SAGEConv(i.channels, i.channels), _plain),
    "GraphConv": (lambda i: pyg_conv.GraphConv(i.channels, i.channels), _weighted),
    "GravNetConv": (
        lambda i: pyg_conv.GravNetConv(i.channels, i.channels, space_dimensions=2, propagate_dimensions=4, k=3),
        lambda i: ((i.x,), {}),
    ),
    "GatedGraphConv": (lambda i: pyg_conv.GatedGraphConv(i.channels, num_layers=2), _weighted),
    "ResGatedGraphConv": (lambda i: pyg_conv.ResGatedGraphConv(i.channels, i.channels), _plain),
    "GATConv": (lambda i: pyg_conv.GATConv(i.channels, i.channels // 2, heads=2), _plain),
    "FusedGATConv": (
        lambda i: pyg_conv.FusedGATConv(i.channels, i.channels // 2, heads=2, add_self_loops=False),
        lambda i: ((i.x, *pyg_conv.FusedGATConv.to_graph_format(i.edge_index, (i.num_nodes, i.num_nodes))), {}),
    ),
    "GATv2Conv": (lambda i: pyg_conv.GATv2Conv(i.channels, i.channels // 2, heads=2, edge_dim=EDGE_DIM), _with_attr),
    "TransformerConv": (
        lambda i: pyg_conv.TransformerConv(i.channels, i.channels // 2, heads=2, edge_dim=EDGE_DIM),
        _with_attr,
    ),
    "AGNNConv": (lambda i: pyg_conv.AGNNConv(), _plain),
    "TAGConv": (lambda i: pyg_conv.TAGConv(i.channels, i.channels, K=2), _weighted),
    "GINConv": (lambda i: pyg_conv.GINConv(_mlp(i.channels, i.channels, i.channels), train_eps=True), _plain),
    "GINEConv": (lambda i: pyg_conv.GINEConv(_mlp(i.channels, i.channels, i.channels), edge_dim=EDGE_DIM), _with_attr),
    "ARMAConv": (lambda i: pyg_conv.ARMAConv(i.channels, i.channels, num_stacks=2, num_layers=2), _weighted),
    "SGConv": (lambda i: pyg_conv.SGConv(i.channels, i.channels, K=2), _weighted),
    "SSGConv": (lambda i: pyg_conv.SSGConv(i.channels, i.channels, alpha=0.1, K=2), _weighted),
    "APPNP": (lambda i: pyg_conv.APPNP(K=2, alpha=0.1), _weighted),
    "MFConv": (lambda i: pyg_conv.MFConv(i.channels, i.channels, max_degree=4), _plain),
    "RGCNConv": (lambda i: pyg_conv.RGCNConv(i.channels, i.channels, num_relations=R), _typed),
    "FastRGCNConv": (lambda i: pyg_conv.FastRGCNConv(i.channels, i.channels, num_relations=R), _typed),
    "RGATConv": (lambda i: pyg_conv.RGATConv(i.channels, i.channels // 2, num_relations=R, heads=2), _typed),
    "SignedConv": (
        lambda i: pyg_conv.SignedConv(i.channels, i.channels, first_aggr=True),
        lambda i: ((i.x, i.edge_index[:, ::2], i.edge_index[:, 1::2]), {}),
    ),
    "DNAConv": (lambda i: pyg_conv.DNAConv(i.channels, heads=2), lambda i: ((i.sequence, i.edge_index), {})),
    "PointNetConv": (
        lambda i: pyg_conv.PointNetConv(_mlp(i.channels + 3, i.channels), _mlp(i.channels, i.channels)),
        lambda i: ((i.x, i.pos, i.edge_index), {}),
    ),
    "GMMConv": (lambda i: pyg_conv.GMMConv(i.channels, i.channels, dim=EDGE_DIM, kernel_size=2), _with_attr),
    "SplineConv": (
        lambda i: pyg_conv.SplineConv(i.channels, i.channels, dim=2, kernel_size=3),
        lambda i: ((i.x, i.edge_index, i.pseudo), {}),
    ),
    "NNConv": (lambda i: pyg_conv.NNConv(i.channels, i.channels, _mlp(EDGE_DIM, i.channels * i.channels)), _with_attr),
    "CGConv": (lambda i: pyg_conv.CGConv(i.channels, dim=EDGE_DIM), _with_attr),
    "EdgeConv": (lambda i: pyg_conv.EdgeConv(_mlp(2 * i.channels, i.channels)), _plain),
    "DynamicEdgeConv": (
        lambda i: pyg_conv.DynamicEdgeConv(_mlp(2 * i.channels, i.channels), k=3),
        lambda i: ((i.x,), {}),
    ),
    "PPFConv": (
        lambda i: pyg_conv.PPFConv(_mlp(i.channels + 4, i.channels), _mlp(i.channels, i.channels)),
        lambda i: ((i.x, i.pos, i.normal, i.edge_index), {}),
    ),
    "FeaStConv": (lambda i: pyg_conv.FeaStConv(i.channels, i.channels, heads=2), _plain),
    "PointTransformerConv": (
        lambda i: pyg_conv.PointTransformerConv(i.channels, i.channels),
        lambda i: ((i.x, i.pos, i.edge_index), {}),
    ),
    "HypergraphConv": (lambda i: pyg_conv.HypergraphConv(i.channels, i.channels), _plain),
    "LEConv": (lambda i: pyg_conv.LEConv(i.channels, i.channels), _weighted),
    "PNAConv": (_pna, _with_attr),
    "ClusterGCNConv": (lambda i: pyg_conv.ClusterGCNConv(i.channels, i.channels), _plain),
    "GENConv": (lambda i: pyg_conv.GENConv(i.channels, i.channels, edge_dim=EDGE_DIM), _with_attr),
    "GCN2Conv": (lambda i: pyg_conv.GCN2Conv(i.channels, alpha=0.1, theta=0.5, layer=1), _initial),
    "PANConv": (lambda i: pyg_conv.PANConv(i.channels, i.channels, filter_size=2), _plain),
    "WLConvContinuous": (lambda i: pyg_conv.WLConvContinuous(), _weighted),
    "FiLMConv": (lambda i: pyg_conv.FiLMConv(i.channels, i.channels, num_relations=R), _typed),
    "SuperGATConv": (lambda i: pyg_conv.SuperGATConv(i.channels, i.channels // 2, heads=2), _plain),
    "FAConv": (lambda i: pyg_conv.FAConv(i.channels), _initial),
    "EGConv": (lambda i: pyg_conv.EGConv(i.channels, i.channels, num_heads=2, num_bases=2), _plain),
    "PDNConv": (
        lambda i: pyg_conv.PDNConv(i.channels, i.channels, edge_dim=EDGE_DIM, hidden_channels=i.channels),
        _with_attr,
    ),
    "GeneralConv": (lambda i: pyg_conv.GeneralConv(i.channels, i.channels, in_edge_channels=EDGE_DIM), _with_attr),
    "HGTConv": (lambda i: pyg_conv.HGTConv(i.channels, i.channels, _METADATA, heads=2), _hetero),
    "HEATConv": (
        lambda i: pyg_conv.HEATConv(
            i.channels,
            i.channels,
            num_node_types=2,
            num_edge_types=R,
            edge_type_emb_dim=4,
            edge_dim=EDGE_DIM,
            edge_attr_emb_dim=4,
            heads=2,
        ),
        lambda i: ((i.x, i.edge_index, i.node_type, i.edge_type, i.edge_attr), {}),
    ),
    "HANConv": (lambda i: pyg_conv.HANConv(i.channels, i.channels, _METADATA, heads=2), _hetero),
    "LGConv": (lambda i: pyg_conv.LGConv(), _weighted),
    "PointGNNConv": (
        lambda i: pyg_conv.PointGNNConv(
            _mlp(i.channels, 3), _mlp(i.channels + 3, i.channels), _mlp(i.channels, i.channels)
        ),
        lambda i: ((i.x, i.pos, i.edge_index), {}),
    ),
    "MixHopConv": (lambda i: pyg_conv.MixHopConv(i.channels, i.channels), _weighted),
    "MeshCNNConv": (lambda i: pyg_conv.MeshCNNConv(i.channels, i.channels), _mesh),
}


def message_passing_classes() -> List[str]:
    """The names of every ``MessagePassing`` subclass ``torch_geometric.nn.conv`` exports."""
    return [
        name
        for name in pyg_conv.__all__
        if inspect.isclass(getattr(pyg_conv, name))
        and issubclass(getattr(pyg_conv, name), MessagePassing)
        and getattr(pyg_conv, name) is not MessagePassing
    ]


def _tensors(value: Any) -> List[Tensor]:
    """The floating-point tensors in a layer's output (tensors, tuples, lists, dicts), in order."""
    if isinstance(value, Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _tensors(value[key])]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _leaves(args: Iterable[Any]) -> List[Tensor]:
    """The tensors of the arguments that require gradients, in order."""
    return [t for t in _tensors(list(args)) if t.requires_grad]


@dataclass
class Run:
    """One forward and backward pass of a layer: its outputs and the gradients of its parameters and
    of its floating-point inputs."""

    outputs: List[Tensor]
    grads: Dict[str, Optional[Tensor]]


def _run(
    model: torch.nn.Module,
    inputs: Callable[[Inputs], Tuple[Tuple[Any, ...], Dict[str, Any]]],
    made: Inputs,
    dtype: torch.dtype,
) -> Run:
    """The pass of ``model`` on ``made``; its loss weighs every output element by a linear ramp from
    -1 to 1 rounded to ``dtype`` (the run's), so that a float64 run of the same inputs differentiates
    the same loss."""
    args, kwargs = inputs(made.fresh())
    torch.manual_seed(0)
    outputs = _tensors(model(*args, **kwargs))
    if not outputs:
        raise RuntimeError("the layer returned no floating-point tensor")
    loss = sum((t * _ramp(t.numel(), dtype).to(device=t.device, dtype=t.dtype).view_as(t)).sum() for t in outputs)
    leaves = _leaves(list(args) + list(kwargs.values()))
    parameters = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    targets = [p for _, p in parameters] + leaves
    grads = torch.autograd.grad(loss, targets, allow_unused=True) if loss.requires_grad else [None] * len(targets)
    names = [name for name, _ in parameters] + [f"input {k}" for k in range(len(leaves))]
    return Run([t.detach() for t in outputs], dict(zip(names, grads)))


def _ramp(count: int, dtype: torch.dtype) -> Tensor:
    """``count`` weights from -1 to 1, computed in float64 and rounded to ``dtype``."""
    return torch.linspace(-1, 1, count, dtype=torch.float64).to(dtype)


def _error(ours: Sequence[Optional[Tensor]], theirs: Sequence[Optional[Tensor]]) -> float:
    """The largest relative error over pairs of tensors (``theirs`` the exact ones, maybe of a wider
    dtype); infinite where shapes or presence differ.

    Each error is relative to the largest magnitude over all of PyG's tensors of the list (as the
    tests compare gradients): a gradient that is zero up to rounding (a bias before a softmax,
    which the softmax's shift invariance cancels) is compared as the zero it is, not as rounding
    noise against rounding noise.
    """
    floor = max((b.abs().max().item() for b in theirs if b is not None and b.numel()), default=0.0)
    floor = max(floor, 1e-12)
    worst = 0.0
    for a, b in zip(ours, theirs):
        if a is None or b is None:
            if (a is None) != (b is None) and not ((a if b is None else b).abs().max() == 0):
                return math.inf
            continue
        if a.shape != b.shape or bool(torch.isnan(a).any()) != bool(torch.isnan(b).any()):
            return math.inf
        if b.numel():
            worst = max(worst, ((a.to(b.device) - b).abs().max() / floor).item())
    return worst if len(ours) == len(theirs) else math.inf


def _bound(dtype: torch.dtype, pyg_error: float) -> float:
    """The largest error of ours that matches, given PyG's own error in ``dtype``: a result as close
    to the float64 one as PyG's own in that dtype matches, within the dtype's :data:`TOLERANCE`."""
    return max(TOLERANCE[dtype], 2 * pyg_error)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


@contextmanager
def staged_at_any_size() -> Iterator[None]:
    """Propagations that run staged, or captured as several operators, do so on the table's small
    graph too, as on a graph of ``MessagePassing.staged_min_edges`` edges or more (below, they run
    PyG's propagation): the table says how each layer runs where that rule applies."""
    saved = ug.MessagePassing.staged_min_edges
    ug.MessagePassing.staged_min_edges = 0
    try:
        yield
    finally:
        ug.MessagePassing.staged_min_edges = saved


def cover(name: str, setup: Optional[Setup] = None) -> Dict[str, Any]:
    """The row of one class (see the module docstring) on the inputs of ``setup`` (default:
    :class:`Setup`'s)."""
    with staged_at_any_size():
        return _cover(name, setup or Setup())


def _cover(name: str, setup: Setup) -> Dict[str, Any]:
    row: Dict[str, Any] = dict.fromkeys(COLUMNS, "")
    row.update(
        layer=name,
        ops=0,
        fallbacks=0,
        edge_updates=0,
        staged=False,
        edges_in_pytorch=False,
        forward_match=False,
        grads_match=False,
        fully_fused=False,
        forward_error=math.nan,
        grads_error=math.nan,
        pyg_forward_error=math.nan,
        pyg_grads_error=math.nan,
    )
    if name not in CASES:
        row["runs"] = "no arguments in benchmarks.pyg_coverage.CASES"
        return row
    build, inputs = CASES[name]
    made = Inputs.make(setup)
    exact = made.to(torch.float64, torch.device("cpu"))
    try:
        torch.manual_seed(0)
        layer = build(exact).to(device=setup.device, dtype=setup.dtype).eval()
    except Exception as error:  # PyG's layer itself: its optional packages, its own checks
        row["runs"] = f"PyG fails: {_describe(error)}"
        return row
    # PyG's float64 run on the CPU of the same rounded parameters, inputs and loss is what both are
    # compared with: on a GPU PyG leaves some results unspecified (which of a node's several
    # stored self loops lends GCN's loop its weight), where the CPU's are reproducible.
    on_cpu = setup.device.type == "cpu"
    reference = layer if on_cpu and setup.dtype == torch.float64 else copy.deepcopy(layer).to("cpu", torch.float64)
    converted = ug.accelerate(layer, inplace=False)
    report = converted.ugrapher_report
    row["conversion"] = report[""].conversion
    try:
        truth = _run(reference, inputs, exact, setup.dtype)
        theirs = truth if reference is layer else _run(layer, inputs, made, setup.dtype)
    except Exception as error:
        row["runs"] = f"PyG fails: {_describe(error)}"
        return row
    reasons: List[str] = []
    edge_updates = [0]

    def count_edge_update(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if getattr(module, "edge_fallback_reason", "PyG's layer") is not None:
            edge_updates[0] += 1

    hooks = [layer.layer.register_edge_update_forward_hook(count_edge_update) for layer in report]
    calls: List[Any] = []
    stages: List[str] = []
    try:
        with (
            ops.observe(calls.append),
            observe_fallbacks(lambda module, reason: reasons.append(reason)),
            observe_stages(lambda module, description: stages.append(description)),
        ):
            ours = _run(converted, inputs, made, setup.dtype)
    except Exception as error:
        row["runs"] = f"fails: {_describe(error)}"
        return row
    finally:
        for hook in hooks:
            hook.remove()
    forward, pyg_forward = (_error(run.outputs, truth.outputs) for run in (ours, theirs))
    grads, pyg_grads = (
        math.inf
        if run.grads.keys() != truth.grads.keys()
        else _error(list(run.grads.values()), list(truth.grads.values()))
        for run in (ours, theirs)
    )
    distinct = list(dict.fromkeys(reasons))
    if edge_updates[0]:
        distinct.append("edge_updater() runs PyG's path")
    distinct += [layer.reason for layer in report if layer.reason]
    staged = [layer.layer.staged_reason for layer in report if getattr(layer.layer, "staged_reason", None)]
    if not reasons:
        distinct += staged
    row.update(
        runs="yes",
        forward_error=forward,
        grads_error=grads,
        pyg_forward_error=pyg_forward,
        pyg_grads_error=pyg_grads,
        forward_match=forward <= _bound(setup.dtype, pyg_forward),
        grads_match=grads <= _bound(setup.dtype, pyg_grads),
        ops=len(calls),
        fallbacks=len(reasons),
        edge_updates=edge_updates[0],
        staged=bool(staged),
        fully_fused=bool(calls) and not reasons and not edge_updates[0] and not staged,
        edges_in_pytorch=any(ON_EDGES in description for description in stages),
        reason=" | ".join(distinct),
    )
    return row


def summary(frame: pd.DataFrame) -> Dict[str, int]:
    runs = frame.runs == "yes"
    return {
        "classes": len(frame),
        "run": int(runs.sum()),
        "PyG fails": int(frame.runs.str.startswith("PyG fails").sum()),
        "ours fails": int(frame.runs.str.startswith("fails").sum()),
        "forward matches": int((runs & frame.forward_match).sum()),
        "forward and gradients match": int((runs & frame.forward_match & frame.grads_match).sum()),
        "swapped": int((frame.conversion == "swapped").sum()),
        "fully fused": int((runs & frame.fully_fused).sum()),
        "every per-edge value on graph operators": int(
            (
                runs
                & (frame.ops > 0)
                & (frame.fallbacks == 0)
                & (frame.edge_updates == 0)
                & ~frame.edges_in_pytorch.astype(bool)
            ).sum()
        ),
        "staged": int((runs & frame.staged & (frame.fallbacks == 0) & (frame.edge_updates == 0)).sum()),
        "partly fused": int((runs & (frame.ops > 0) & ((frame.fallbacks > 0) | (frame.edge_updates > 0))).sum()),
        "no graph operator (all PyG)": int((runs & (frame.ops == 0)).sum()),
    }


def markdown(frame: pd.DataFrame, setup: Optional[Setup] = None) -> str:
    setup = setup or Setup()
    counts = summary(frame)
    versions = f"torch_geometric {torch_geometric.__version__}, torch {torch.__version__}"
    if setup.device.type == "cuda":
        measured = environment(setup.device)
        versions += f", Triton {measured['triton']}; {measured['gpu']}, commit {measured['commit']}"
    bound = f"error <= {TOLERANCE[setup.dtype]:g} relative to the largest magnitude of PyG's"
    if setup.dtype == torch.float64 and setup.device.type == "cpu":
        bound += " outputs, or gradients"
    else:
        bound += (
            " float64 outputs, or gradients, on the CPU, of the same rounded parameters, inputs and loss, or up"
            " to twice the error of PyG's own run (in this dtype, on this device)"
        )
    lines = [
        f"# PyG coverage of `ug.accelerate` ({versions})",
        "",
        f"Every `MessagePassing` class of `torch_geometric.nn.conv`, built as in `benchmarks/pyg_coverage.py` "
        f"on {setup.describe()}, eval mode; "
        f"forward and backward of PyG's layer against `ug.accelerate` of a copy "
        f"(match: {bound}). "
        f"Staged: `message()` runs on every call as graph operators around what it computes in PyTorch "
        f"(`pyg_ugrapher/staging.py`); fully fused: `message()` captured once, the fused graph operator "
        f"and where needed a few before it (a softmax's maxima and sums), as on a graph of "
        f"`MessagePassing.staged_min_edges` edges or more for a capture of several operators, as for "
        f"staged runs (below, PyG's propagation runs); every per-edge "
        f"value on graph operators: fully fused, or staged with no per-edge value computed in PyTorch "
        f"(a Linear split by linearity into products of the node rows multiplies node rows; one "
        f"split into products of the edge features' rows multiplies the rows of edge features given "
        f"to `propagate()`, or of values computed from those alone, an input transform PyG computes "
        f"as well; a Linear of a per-edge value computed from vertex rows counts as computed in "
        f"PyTorch).",
        "",
        "| " + " | ".join(counts) + " |",
        "|" + " --- |" * len(counts),
        "| " + " | ".join(str(v) for v in counts.values()) + " |",
        "",
    ]
    shown = [
        "layer",
        "conversion",
        "runs",
        "forward_match",
        "grads_match",
        "ops",
        "fallbacks",
        "edge_updates",
        "staged",
        "fully_fused",
        "edges_in_pytorch",
        "reason",
    ]
    lines += ["| " + " | ".join(shown) + " |", "|" + " --- |" * len(shown)]
    for record in frame.to_dict("records"):
        cells = [str(record[column]).replace("|", "\\|") for column in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pyg_coverage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--classes", nargs="+", help="class names (default: every MessagePassing class)")
    parser.add_argument("--device", default="cpu", help="where both sides run (cuda: our Triton kernels)")
    parser.add_argument("--dtype", default="float64", choices=list(DTYPES))
    parser.add_argument("--nodes", type=int, default=Setup.num_nodes, help="vertices of the random graph")
    parser.add_argument("--edges", type=int, default=Setup.num_edges, help="its edges")
    parser.add_argument("--channels", type=int, default=Setup.channels, help="features per vertex (even)")
    parser.add_argument("--hub", type=float, default=Setup.hub, help="share of the edges ending at vertex 0")
    parser.add_argument("--name", default="pyg_coverage", help="stem of the .csv and .md written")
    parser.add_argument(
        "--out", type=Path, default=None, help="their folder (default: benchmarks/results/cpu, or the GPU's)"
    )
    args = parser.parse_args(argv)
    names = args.classes or message_passing_classes()
    unknown = [name for name in names if not isinstance(getattr(pyg_conv, name, None), type)]
    if unknown:
        parser.error(f"--classes: not classes of torch_geometric.nn.conv: {unknown}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device: CUDA is not available here")
    try:
        setup = Setup(args.nodes, args.edges, args.channels, DTYPES[args.dtype], device, args.hub)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    out = args.out or (DEFAULT_OUT if device.type == "cpu" else default_out(device))
    frame = pd.DataFrame(
        [cover(name, setup) for name in tqdm(names, desc="classes", unit="class")], columns=list(COLUMNS)
    )
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / f"{args.name}.csv", index=False)
    (out / f"{args.name}.md").write_text(markdown(frame, setup))
    for key, value in summary(frame).items():
        print(f"{key}: {value}", file=sys.stderr)
    return frame


if __name__ == "__main__":
    main()
