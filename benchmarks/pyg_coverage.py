"""How much of PyG ``ug.accelerate`` covers: every ``MessagePassing`` class of ``torch_geometric.nn.conv``.

    python -m benchmarks.pyg_coverage                      # every class -> benchmarks/results/cpu/
    python -m benchmarks.pyg_coverage --classes GCNConv LEConv EdgeConv --out /tmp/coverage

Each class is built with the arguments of :data:`CASES` on a small random graph (12 vertices, 40
edges with a self loop and a duplicate, 8 features, and whatever else it reads: edge features,
positions, normals, edge and node types), in float64 and in eval mode (no dropout, no sampling). The
PyG layer and ``ug.accelerate`` of a deep copy of it run one forward and one backward pass of the
same loss on the CPU (our graph operators on the reference executor, or on Triton's interpreter with
``TRITON_INTERPRET=1``). Per class the table says:

* ``conversion``: what :func:`pyg_ugrapher.accelerate` did (``swapped`` for a drop-in, ``routed``
  through the capture of ``message()``, ``kept`` on PyG's path);
* ``runs``: ``yes``, ``PyG fails: <error>`` (PyG's own layer fails here, mostly for an optional
  package that is not installed) or ``fails: <error>`` (the converted layer fails);
* ``forward_match`` / ``grads_match``: outputs, and gradients of every parameter and every
  floating-point input, within a relative error of :data:`TOLERANCE` of PyG's (the errors are
  columns too);
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

import pyg_ugrapher as ug
from pyg_ugrapher import ops
from pyg_ugrapher.message_passing import observe_fallbacks, observe_stages
from pyg_ugrapher.staging import ON_EDGES

#: Largest relative error (to the largest magnitude of PyG's tensor) that counts as a match (float64).
TOLERANCE = 1e-9
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu"
NUM_NODES, NUM_EDGES, CHANNELS, EDGE_DIM, NUM_RELATIONS = 12, 40, 8, 4, 3
COLUMNS = (
    "layer",
    "conversion",
    "runs",
    "forward_match",
    "forward_error",
    "grads_match",
    "grads_error",
    "ops",
    "fallbacks",
    "edge_updates",
    "staged",
    "fully_fused",
    "edges_in_pytorch",
    "reason",
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
    def make(cls, seed: int = 0) -> "Inputs":
        g = torch.Generator().manual_seed(seed)
        edge_index = torch.randint(0, NUM_NODES - 1, (2, NUM_EDGES - 1), generator=g)  # vertex N-1 isolated
        edge_index[:, 0] = 2  # a self loop
        edge_index = torch.cat([edge_index, edge_index[:, 1:2]], dim=1)  # and a duplicate edge

        def rand(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=g, dtype=torch.float64)

        return cls(
            x=rand(NUM_NODES, CHANNELS),
            edge_index=edge_index,
            edge_weight=torch.rand(NUM_EDGES, generator=g, dtype=torch.float64) + 0.5,
            edge_attr=rand(NUM_EDGES, EDGE_DIM),
            pos=rand(NUM_NODES, 3),
            normal=rand(NUM_NODES, 3),
            pseudo=torch.rand(NUM_EDGES, 2, generator=g, dtype=torch.float64),
            edge_type=torch.randint(0, NUM_RELATIONS, (NUM_EDGES,), generator=g),
            node_type=torch.randint(0, 2, (NUM_NODES,), generator=g),
            sequence=rand(NUM_NODES, 3, CHANNELS),
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
    first = torch.arange(NUM_NODES).repeat_interleave(4)
    return (i.x, torch.stack([first, (first + torch.arange(1, 5).repeat(NUM_NODES)) % NUM_NODES])), {}


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


def _pna() -> torch.nn.Module:
    deg = torch.bincount(degree(Inputs.make().edge_index[1], NUM_NODES, dtype=torch.long))
    return pyg_conv.PNAConv(
        CHANNELS, CHANNELS, ["mean", "max", "std"], ["identity", "amplification"], deg, edge_dim=EDGE_DIM
    )


C, R = CHANNELS, NUM_RELATIONS
Case = Tuple[Callable[[], torch.nn.Module], Callable[[Inputs], Tuple[Tuple[Any, ...], Dict[str, Any]]]]
#: Class name -> (constructor, the forward arguments from the inputs).
CASES: Dict[str, Case] = {
    "SimpleConv": (lambda: pyg_conv.SimpleConv(combine_root="sum"), _weighted),
    "GCNConv": (lambda: pyg_conv.GCNConv(C, C), _weighted),
    "ChebConv": (lambda: pyg_conv.ChebConv(C, C, K=2), _weighted),
    "SAGEConv": (lambda: pyg_conv.SAGEConv(C, C), _plain),
    "GraphConv": (lambda: pyg_conv.GraphConv(C, C), _weighted),
    "GravNetConv": (
        lambda: pyg_conv.GravNetConv(C, C, space_dimensions=2, propagate_dimensions=4, k=3),
        lambda i: ((i.x,), {}),
    ),
    "GatedGraphConv": (lambda: pyg_conv.GatedGraphConv(C, num_layers=2), _weighted),
    "ResGatedGraphConv": (lambda: pyg_conv.ResGatedGraphConv(C, C), _plain),
    "GATConv": (lambda: pyg_conv.GATConv(C, C // 2, heads=2), _plain),
    "FusedGATConv": (
        lambda: pyg_conv.FusedGATConv(C, C // 2, heads=2, add_self_loops=False),
        lambda i: ((i.x, *pyg_conv.FusedGATConv.to_graph_format(i.edge_index, (NUM_NODES, NUM_NODES))), {}),
    ),
    "GATv2Conv": (lambda: pyg_conv.GATv2Conv(C, C // 2, heads=2, edge_dim=EDGE_DIM), _with_attr),
    "TransformerConv": (lambda: pyg_conv.TransformerConv(C, C // 2, heads=2, edge_dim=EDGE_DIM), _with_attr),
    "AGNNConv": (lambda: pyg_conv.AGNNConv(), _plain),
    "TAGConv": (lambda: pyg_conv.TAGConv(C, C, K=2), _weighted),
    "GINConv": (lambda: pyg_conv.GINConv(_mlp(C, C, C), train_eps=True), _plain),
    "GINEConv": (lambda: pyg_conv.GINEConv(_mlp(C, C, C), edge_dim=EDGE_DIM), _with_attr),
    "ARMAConv": (lambda: pyg_conv.ARMAConv(C, C, num_stacks=2, num_layers=2), _weighted),
    "SGConv": (lambda: pyg_conv.SGConv(C, C, K=2), _weighted),
    "SSGConv": (lambda: pyg_conv.SSGConv(C, C, alpha=0.1, K=2), _weighted),
    "APPNP": (lambda: pyg_conv.APPNP(K=2, alpha=0.1), _weighted),
    "MFConv": (lambda: pyg_conv.MFConv(C, C, max_degree=4), _plain),
    "RGCNConv": (lambda: pyg_conv.RGCNConv(C, C, num_relations=R), _typed),
    "FastRGCNConv": (lambda: pyg_conv.FastRGCNConv(C, C, num_relations=R), _typed),
    "RGATConv": (lambda: pyg_conv.RGATConv(C, C // 2, num_relations=R, heads=2), _typed),
    "SignedConv": (
        lambda: pyg_conv.SignedConv(C, C, first_aggr=True),
        lambda i: ((i.x, i.edge_index[:, ::2], i.edge_index[:, 1::2]), {}),
    ),
    "DNAConv": (lambda: pyg_conv.DNAConv(C, heads=2), lambda i: ((i.sequence, i.edge_index), {})),
    "PointNetConv": (
        lambda: pyg_conv.PointNetConv(_mlp(C + 3, C), _mlp(C, C)),
        lambda i: ((i.x, i.pos, i.edge_index), {}),
    ),
    "GMMConv": (lambda: pyg_conv.GMMConv(C, C, dim=EDGE_DIM, kernel_size=2), _with_attr),
    "SplineConv": (
        lambda: pyg_conv.SplineConv(C, C, dim=2, kernel_size=3),
        lambda i: ((i.x, i.edge_index, i.pseudo), {}),
    ),
    "NNConv": (lambda: pyg_conv.NNConv(C, C, _mlp(EDGE_DIM, C * C)), _with_attr),
    "CGConv": (lambda: pyg_conv.CGConv(C, dim=EDGE_DIM), _with_attr),
    "EdgeConv": (lambda: pyg_conv.EdgeConv(_mlp(2 * C, C)), _plain),
    "DynamicEdgeConv": (lambda: pyg_conv.DynamicEdgeConv(_mlp(2 * C, C), k=3), lambda i: ((i.x,), {})),
    "PPFConv": (
        lambda: pyg_conv.PPFConv(_mlp(C + 4, C), _mlp(C, C)),
        lambda i: ((i.x, i.pos, i.normal, i.edge_index), {}),
    ),
    "FeaStConv": (lambda: pyg_conv.FeaStConv(C, C, heads=2), _plain),
    "PointTransformerConv": (lambda: pyg_conv.PointTransformerConv(C, C), lambda i: ((i.x, i.pos, i.edge_index), {})),
    "HypergraphConv": (lambda: pyg_conv.HypergraphConv(C, C), _plain),
    "LEConv": (lambda: pyg_conv.LEConv(C, C), _weighted),
    "PNAConv": (_pna, _with_attr),
    "ClusterGCNConv": (lambda: pyg_conv.ClusterGCNConv(C, C), _plain),
    "GENConv": (lambda: pyg_conv.GENConv(C, C, edge_dim=EDGE_DIM), _with_attr),
    "GCN2Conv": (lambda: pyg_conv.GCN2Conv(C, alpha=0.1, theta=0.5, layer=1), _initial),
    "PANConv": (lambda: pyg_conv.PANConv(C, C, filter_size=2), _plain),
    "WLConvContinuous": (lambda: pyg_conv.WLConvContinuous(), _weighted),
    "FiLMConv": (lambda: pyg_conv.FiLMConv(C, C, num_relations=R), _typed),
    "SuperGATConv": (lambda: pyg_conv.SuperGATConv(C, C // 2, heads=2), _plain),
    "FAConv": (lambda: pyg_conv.FAConv(C), _initial),
    "EGConv": (lambda: pyg_conv.EGConv(C, C, num_heads=2, num_bases=2), _plain),
    "PDNConv": (lambda: pyg_conv.PDNConv(C, C, edge_dim=EDGE_DIM, hidden_channels=C), _with_attr),
    "GeneralConv": (lambda: pyg_conv.GeneralConv(C, C, in_edge_channels=EDGE_DIM), _with_attr),
    "HGTConv": (lambda: pyg_conv.HGTConv(C, C, _METADATA, heads=2), _hetero),
    "HEATConv": (
        lambda: pyg_conv.HEATConv(
            C,
            C,
            num_node_types=2,
            num_edge_types=R,
            edge_type_emb_dim=4,
            edge_dim=EDGE_DIM,
            edge_attr_emb_dim=4,
            heads=2,
        ),
        lambda i: ((i.x, i.edge_index, i.node_type, i.edge_type, i.edge_attr), {}),
    ),
    "HANConv": (lambda: pyg_conv.HANConv(C, C, _METADATA, heads=2), _hetero),
    "LGConv": (lambda: pyg_conv.LGConv(), _weighted),
    "PointGNNConv": (
        lambda: pyg_conv.PointGNNConv(_mlp(C, 3), _mlp(C + 3, C), _mlp(C, C)),
        lambda i: ((i.x, i.pos, i.edge_index), {}),
    ),
    "MixHopConv": (lambda: pyg_conv.MixHopConv(C, C), _weighted),
    "MeshCNNConv": (lambda: pyg_conv.MeshCNNConv(C, C), _mesh),
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


def _run(model: torch.nn.Module, inputs: Callable[[Inputs], Tuple[Tuple[Any, ...], Dict[str, Any]]]) -> Run:
    args, kwargs = inputs(Inputs.make().fresh())
    torch.manual_seed(0)
    outputs = _tensors(model(*args, **kwargs))
    if not outputs:
        raise RuntimeError("the layer returned no floating-point tensor")
    loss = sum((t * torch.linspace(-1, 1, t.numel(), dtype=t.dtype).view_as(t)).sum() for t in outputs)
    leaves = _leaves(list(args) + list(kwargs.values()))
    parameters = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    targets = [p for _, p in parameters] + leaves
    grads = torch.autograd.grad(loss, targets, allow_unused=True) if loss.requires_grad else [None] * len(targets)
    names = [name for name, _ in parameters] + [f"input {k}" for k in range(len(leaves))]
    return Run([t.detach() for t in outputs], dict(zip(names, grads)))


def _error(ours: Sequence[Optional[Tensor]], theirs: Sequence[Optional[Tensor]]) -> float:
    """The largest relative error over pairs of tensors; infinite where shapes or presence differ.

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
        if a.shape != b.shape or torch.isnan(a).any() != torch.isnan(b).any():
            return math.inf
        if b.numel():
            worst = max(worst, ((a - b).abs().max() / floor).item())
    return worst if len(ours) == len(theirs) else math.inf


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


def cover(name: str) -> Dict[str, Any]:
    """The row of one class (see the module docstring)."""
    with staged_at_any_size():
        return _cover(name)


def _cover(name: str) -> Dict[str, Any]:
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
    )
    if name not in CASES:
        row["runs"] = "no arguments in benchmarks.pyg_coverage.CASES"
        return row
    build, inputs = CASES[name]
    try:
        torch.manual_seed(0)
        layer = build().double().eval()
    except Exception as error:  # PyG's layer itself: its optional packages, its own checks
        row["runs"] = f"PyG fails: {_describe(error)}"
        return row
    converted = ug.accelerate(layer, inplace=False)
    report = converted.ugrapher_report
    row["conversion"] = report[""].conversion
    try:
        theirs = _run(layer, inputs)
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
            ours = _run(converted, inputs)
    except Exception as error:
        row["runs"] = f"fails: {_describe(error)}"
        return row
    finally:
        for hook in hooks:
            hook.remove()
    forward = _error(ours.outputs, theirs.outputs)
    grads = (
        math.inf
        if ours.grads.keys() != theirs.grads.keys()
        else _error(list(ours.grads.values()), list(theirs.grads.values()))
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
        forward_match=forward <= TOLERANCE,
        grads_match=grads <= TOLERANCE,
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


def markdown(frame: pd.DataFrame) -> str:
    counts = summary(frame)
    lines = [
        f"# PyG coverage of `ug.accelerate` (torch_geometric {torch_geometric.__version__}, torch {torch.__version__})",
        "",
        f"Every `MessagePassing` class of `torch_geometric.nn.conv`, built as in `benchmarks/pyg_coverage.py` "
        f"on a random graph of {NUM_NODES} vertices and {NUM_EDGES} edges, float64, eval mode; "
        f"forward and backward of PyG's layer against `ug.accelerate` of a copy "
        f"(match: error <= {TOLERANCE:g} relative to the largest magnitude of PyG's outputs, or gradients). "
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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of pyg_coverage.csv/.md")
    args = parser.parse_args(argv)
    names = args.classes or message_passing_classes()
    unknown = [name for name in names if not isinstance(getattr(pyg_conv, name, None), type)]
    if unknown:
        parser.error(f"--classes: not classes of torch_geometric.nn.conv: {unknown}")
    frame = pd.DataFrame([cover(name) for name in names], columns=list(COLUMNS))
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "pyg_coverage.csv", index=False)
    (args.out / "pyg_coverage.md").write_text(markdown(frame))
    for key, value in summary(frame).items():
        print(f"{key}: {value}", file=sys.stderr)
    return frame


if __name__ == "__main__":
    main()
