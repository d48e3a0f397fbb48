"""The workload that :mod:`benchmarks.sanitize` runs under ``compute-sanitizer``: every kernel template
under explicit schedules, on small graphs of what trips kernels up, checked against the reference
executor.

    python -m benchmarks.sanitize_cases --matrix reduced --device cuda
    TRITON_INTERPRET=1 python -m benchmarks.sanitize_cases --matrix tiny --device cpu

Graphs (:data:`GRAPHS`): a hub that neighbour groups split into many chunks, isolated vertices and
empty rows, self loops, duplicate edges, a graph without edges, a bipartite graph, and all of these
in one. Each case builds its graph with int32 or int64 indices, its structure sorted or in the
user's order (the row-offset and sorted-pair kernels build them on a GPU), runs its kernels and
compares every result (relative error, :data:`TOLERANCE`) with the reference executor in float64.

Matrices:

* ``reduced``: each (template, gather op or message creation, dtype, index dtype) once, with its
  backward (the gradient ops on the reversed graph and, where the op has one, the gather with an
  edge output in one kernel, under the forward's schedule); the graph, edge order, operand layout,
  edge function and schedule (a hand-picked knob set, or one of :func:`triton_kernels.space`'s)
  rotate from case to case. Then the one-pass softmax aggregation (vertex-parallel and neighbour
  groups, the combine kernel of split rows) and a gather with an edge output per (strategy, dtype,
  index dtype); GCN and GAT layers against PyG per graph; GAT's per-head dot products, GCN's
  normalisation and the cost model's tree kernel per dtype.
* ``full``: the operator and softmax cases on every graph and in both edge orders.
* ``tiny``: one case of each kind, float32, on small graphs: a CPU check that the workload runs.

It prints one line per failed case and ends with ``SANITIZE cases=C failed=F launched=L``
(``launched``: Triton kernels launched, counted where :mod:`triton_kernels.launch` launches them);
the exit status is 1 if a case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

import numpy as np
import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor

import pyg_ugrapher as ug
import triton_kernels
from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher import reference
from pyg_ugrapher.attention import EPSILON, attention_ops
from pyg_ugrapher.ir import Expr, OpInfo
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.nn.gcn_conv import unit_norm_torch
from pyg_ugrapher.ops import differentiable_graph_op, graph_arrays, layout_of, serialized
from triton_kernels import launch
from triton_kernels.codegen import edge_mode
from triton_kernels.head_dot import head_dot
from triton_kernels.tree_ensemble import tree_ensemble_scores
from triton_kernels.unit_norm import unit_norm_weights

GRAPHS = ("hub", "isolated", "self_loops", "duplicates", "empty", "bipartite", "mixed")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
STRATEGIES = ("vertex", "edge", "group")
GATHERS = ("sum", "mean", "max", "min")
#: Edge functions of the gather cases (``{fn}_{gather}``) and the message cases, in rotation.
GATHER_FUNCTIONS = ("u_mul_e", "copy_u", "u_add_v", "e_div_u", "v_sub_e", "copy_e", "u_mul_v", "e_add_u")
MESSAGE_NAMES = ("u_dot_v", "u_mul_e", "copy_u", "e_sub_v", "v_div_u", "u_add_e")
#: Operand feature shapes: the first operand's, then the others'. ``wide`` spans several 64-feature tiles.
LAYOUTS: Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]] = {
    "vector": ((5,), (5,)),
    "heads": ((2, 3), (2, 3)),
    "head_bcast": ((2, 3), (2, 1)),
    "wide": ((70,), (70,)),
    "scalar": ((), ()),
}
#: Knob sets per strategy: feature tiles narrower than the operands, blocks that divide no edge
#: count, groups that split the hub into many chunks and one that splits nothing.
HAND_KNOBS: Dict[str, List[Dict[str, int]]] = {
    "vertex": [
        dict(block_v=1, block_e=4, block_f=4),
        dict(block_v=4, block_e=2, block_f=8, num_warps=1),
        dict(block_v=2, block_e=8, block_f=2, num_warps=2),
    ],
    "edge": [dict(block_e=8, block_f=4), dict(block_e=32, block_f=8, num_warps=1), dict(block_e=2, block_f=2)],
    "group": [
        dict(group_size=3, block_v=2, block_e=2, block_f=4),
        dict(group_size=8, block_v=4, block_e=4, block_f=8, num_warps=1),
        dict(group_size=128, block_v=1, block_e=16, block_f=2),
    ],
}
#: GAT's score with an edge term, the logit of the softmax cases.
SCORE = OpInfo(
    Expr.apply("leaky_relu", Expr.input(0) + Expr.input(1) + Expr.input(2), 0.2),
    None,
    operands=("src_v", "dst_v", "edge"),
)
#: (heads, channels, feature tile) of the softmax cases: tiles of whole heads, inside one head, a
#: head wider and one narrower than the tile, one channel per head.
SOFTMAX_TILINGS = ((4, 8, 16), (2, 16, 8), (1, 12, 8), (1, 12, 16), (3, 1, 2))
#: (gather, message, (heads, channels), edge operand per head) of the edge-output cases: GAT's and
#: ``u_mul_e_sum``'s backward pairs, a full edge operand, an elementwise edge output.
PAIRS = (
    ("u_mul_e_sum", "v_dot_u", (2, 4), True),
    ("u_mul_e_sum", "v_dot_u", (1, 5), False),
    ("copy_u_sum", "v_mul_u", (2, 3), False),
    ("u_mul_e_mean", "u_sub_v", (1, 6), False),
)
#: Largest relative error (to the largest magnitude expected) per dtype; gradients pass through one
#: more rounding of a half type (the upstream gradient) and get twice as much there.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
GRAD_FACTOR = {torch.float16: 2.0, torch.bfloat16: 2.0}
#: Absolute error of a log-normaliser (a logit, of order one whatever the row's size).
NORMALISER_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 0.1, torch.bfloat16: 0.1}


# -- graphs ----------------------------------------------------------------------------------------
def graph_edges(case: str) -> Tuple[Tensor, Tuple[int, int]]:
    """The ``[2, E]`` edges of the graph ``case`` (on the CPU, the same every time) and its
    ``(num_src, num_dst)``."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))

    def random(num_src: int, num_dst: int, num_edges: int) -> Tensor:
        return torch.stack(
            [
                torch.randint(0, num_src, (num_edges,), generator=gen),
                torch.randint(0, num_dst, (num_edges,), generator=gen),
            ]
        )

    if case == "empty":
        return torch.empty(2, 0, dtype=torch.int64), (6, 6)
    if case == "hub":  # vertex 0 receives 100 of 157 edges and sends 20
        edges = random(30, 30, 157)
        edges[1, :100] = 0
        edges[0, 100:120] = 0
        return edges, (30, 30)
    if case == "isolated":  # vertices 20-27 have no edge: empty rows and columns
        return random(20, 20, 61), (28, 28)
    if case == "self_loops":
        edges = random(16, 16, 53)
        edges[1, ::3] = edges[0, ::3]
        return edges, (16, 16)
    if case == "duplicates":  # 13 edges, each two or three times
        edges = random(12, 12, 13)
        return torch.cat([edges, edges, edges[:, :7]], dim=1), (12, 12)
    if case == "bipartite":  # source 17 and destinations 9-10 have no edge
        return random(17, 9, 47), (18, 11)
    if case == "mixed":  # a hub (0), isolated vertices (19-20), self loops, duplicate edges
        edges = random(19, 19, 37)
        edges[1, :14] = 0
        edges[1, 30:] = edges[0, 30:]
        return torch.cat([edges, edges[:, 3:12]], dim=1), (21, 21)
    raise ValueError(f"case: unknown graph {case!r}; expected one of {GRAPHS}")


def _graph(case: str, index_dtype: torch.dtype, device: torch.device) -> Tuple[ug.GraphTensor, ug.GraphTensor]:
    """The graph on ``device`` with ``index_dtype`` indices, and its copy on the CPU (the reference's)."""
    edges, sizes = graph_edges(case)
    return (
        ug.GraphTensor.from_edge_index(edges.to(device), sizes, index_dtype=index_dtype),
        ug.GraphTensor.from_edge_index(edges, sizes),
    )


# -- checking --------------------------------------------------------------------------------------
def relative_error(actual: Tensor, expected: Tensor, scale: float = 0.0) -> float:
    """``max |actual - expected| / max(max |expected|, scale)`` (on the CPU, in float64); NaN counts as
    infinite."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    if actual.numel() == 0:
        return 0.0
    if torch.isnan(actual).any():
        return math.inf
    return (actual - expected).abs().max().item() / max(expected.abs().max().item(), scale, 1e-12)


def compare(
    actual: Optional[Tensor], expected: Tensor, dtype: torch.dtype, what: str, factor: float = 1.0, scale: float = 0.0
) -> List[str]:
    """The errors of ``actual`` against ``expected`` (shape, dtype ``dtype``, relative error within
    ``factor`` times :data:`TOLERANCE`, against at least ``scale``), as sentences; none if it
    matches."""
    if actual is None:
        return [f"{what}: missing"]
    if tuple(actual.shape) != tuple(expected.shape):
        return [f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"]
    if actual.dtype != dtype:
        return [f"{what}: dtype {actual.dtype}, expected {dtype}"]
    error, tolerance = relative_error(actual, expected, scale), TOLERANCE[dtype] * factor
    return [] if error <= tolerance else [f"{what}: relative error {error:.3g} > {tolerance:g}"]


# -- cases -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One run of the workload: ``kind`` names its runner (:data:`RUNNERS`)."""

    kind: str
    name: str
    graph: str = "mixed"
    dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int32
    sort: bool = True
    strategy: str = ""
    layout: str = "vector"
    schedule: int = 0  #: which schedule of the rotation (:func:`schedule_for`)
    seed: int = 0
    params: Tuple = field(default=())

    @property
    def id(self) -> str:
        parts = [
            self.kind,
            self.name,
            self.strategy,
            self.graph,
            str(self.dtype).replace("torch.", ""),
            str(self.index_dtype).replace("torch.", ""),
            "sorted" if self.sort else "user-order",
        ]
        return "/".join(p for p in parts if p)


def schedule_for(op: OpInfo, strategy: str, width: int, index: int, hand_only: bool) -> ug.ParallelInfo:
    """Case ``index``'s schedule of ``strategy`` for messages of ``width`` features: a knob set of
    :data:`HAND_KNOBS` (every other case, or all with ``hand_only``; its feature tile clipped to the
    width), else one of :func:`triton_kernels.space`'s, spread over its list."""
    if hand_only or index % 2 == 0:
        knobs = HAND_KNOBS[strategy][(index // 2) % len(HAND_KNOBS[strategy])]
        top = 1 << max(width - 1, 0).bit_length()
        return ug.ParallelInfo(strategy, **{**knobs, "block_f": min(knobs["block_f"], top)})
    schedules = [info for info in triton_kernels.space(op, width) if info.strategy == strategy]
    return schedules[(index * 37) % len(schedules)]


def _operands(
    graph: ug.GraphTensor, op: OpInfo, layout: str, dtype: torch.dtype, seed: int, device: torch.device
) -> List[Tensor]:
    """Random operands in slot order, distinct values (unique maxima) and divisors away from zero."""
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    gen = torch.Generator().manual_seed(seed)
    first, rest = LAYOUTS[layout]
    tensors = []
    for slot, kind in enumerate(op.inputs):
        values = torch.rand((rows[kind],) + (first if slot == 0 else rest), generator=gen, dtype=torch.float64) * 2 - 1
        if op.edge_op == "div" and slot == 1:
            values = torch.sign(values) * (0.5 + values.abs())
        tensors.append(values.to(dtype=dtype, device=device))
    return tensors


def _layouts_for(op: OpInfo) -> Tuple[str, ...]:
    if op.reduces:
        return ("vector", "heads", "wide")
    if len(op.inputs) == 1:
        return ("scalar", "vector", "heads", "wide")
    return ("vector", "heads", "head_bcast", "wide")


def run_op(case: Case, device: torch.device, hand_only: bool) -> List[str]:
    """One IR op under an explicit schedule, forward and backward, against the reference executor's
    values and autograd's gradients of them."""
    op = OpInfo.from_name(case.name)
    graph, cpu_graph = _graph(case.graph, case.index_dtype, device)
    operands = [t.requires_grad_() for t in _operands(graph, op, case.layout, case.dtype, case.seed, device)]
    layout = infer_layout(op, [t.shape for t in operands])
    info = schedule_for(op, case.strategy, layout.message_width, case.schedule, hand_only)
    structure = graph.structure(device, sort=case.sort)
    out = differentiable_graph_op(structure, operands, serialized(op), info.serialize())
    upstream = torch.rand(out.shape, generator=torch.Generator().manual_seed(case.seed + 1), dtype=torch.float64)
    upstream = upstream.to(case.dtype).double()  # what the kernels read, exactly
    grads = torch.autograd.grad(out, operands, upstream.to(device, case.dtype))
    exact = [t.detach().cpu().double().requires_grad_() for t in operands]
    expected = reference.execute(cpu_graph, op, exact)
    expected_grads = torch.autograd.grad(expected, exact, upstream, allow_unused=True)
    errors = compare(out, expected, case.dtype, f"output under {info}")
    for slot, (grad, want) in enumerate(zip(grads, expected_grads)):
        want = torch.zeros_like(exact[slot]) if want is None else want
        errors += compare(grad, want, case.dtype, f"gradient of slot {slot}", GRAD_FACTOR.get(case.dtype, 1.0))
    return errors


def _softmax_schedule(strategy: str, block_f: int) -> ug.ParallelInfo:
    if strategy == "group":  # groups of two edges: the hub and most rows split into several chunks
        return ug.ParallelInfo("group", group_size=2, block_f=block_f, block_v=4, block_e=2, num_warps=1)
    return ug.ParallelInfo("vertex", block_f=block_f, block_v=4, block_e=4, num_warps=1)


def run_softmax(case: Case, device: torch.device, hand_only: bool) -> List[str]:
    """GAT's softmax aggregation in one pass (``triton_kernels.run_softmax``), with a dropout scale
    in every other case, against the three forward ops on the reference executor."""
    heads, channels, block_f = SOFTMAX_TILINGS[case.schedule % len(SOFTMAX_TILINGS)]
    dropout = case.schedule % 2 == 1
    graph, cpu_graph = _graph(case.graph, case.index_dtype, device)
    gen = torch.Generator().manual_seed(case.seed)
    scores = [
        torch.randn(rows, heads, 1, generator=gen, dtype=torch.float64)
        for rows in (graph.num_src, graph.num_dst, graph.num_edges)
    ]
    x = torch.randn(graph.num_src, heads, channels, generator=gen, dtype=torch.float64)
    extra = [((torch.rand(graph.num_edges, heads, 1, generator=gen) > 0.4).double() / 0.6)] if dropout else []
    exact = [t.to(case.dtype).double() for t in [x] + scores + extra]
    ops = attention_ops(SCORE.serialize(), dropout)
    operands = [t.to(device, case.dtype) for t in exact]
    layout = layout_of(serialized(ops.one_pass), operands)
    arrays = graph_arrays(graph.structure(device, sort=case.sort))
    info = _softmax_schedule(case.strategy, block_f)
    result = triton_kernels.run_softmax(
        ops.value, ops.logit, ops.one_pass.inputs, layout, arrays, operands, info, (case.dtype, case.dtype)
    )
    if result is None:
        return [f"{info} refused the one pass for {heads} heads of {channels}"]
    out, normaliser = result
    columns = exact[1:4]
    shift = reference.execute(cpu_graph, ops.shift, columns)
    total = reference.execute(cpu_graph, ops.denominator, columns + [shift])
    want_normaliser = shift + (total + EPSILON).log()
    want_out = reference.execute(cpu_graph, ops.output, [exact[0]] + columns + [want_normaliser] + exact[4:])
    errors = compare(out, want_out, case.dtype, f"output under {info}")
    if normaliser.shape != want_normaliser.shape:
        return errors + [f"log-normaliser: shape {tuple(normaliser.shape)}, expected {tuple(want_normaliser.shape)}"]
    if normaliser.numel():
        gap = (normaliser.cpu().double() - want_normaliser).abs().max().item()
        if not gap <= NORMALISER_TOLERANCE[case.dtype]:
            errors.append(f"log-normaliser: absolute error {gap:.3g}")
    return errors


def run_pair(case: Case, device: torch.device, hand_only: bool) -> List[str]:
    """A gather and a message op in one kernel (``triton_kernels.run_with_edge_output``), as a
    backward pass runs them, against the reference executor."""
    gather_name, message_name, (heads, inner), per_head = PAIRS[case.schedule % len(PAIRS)]
    graph, cpu_graph = _graph(case.graph, case.index_dtype, device)
    ops = (OpInfo.from_name(gather_name), OpInfo.from_name(message_name))
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    gen = torch.Generator().manual_seed(case.seed)
    tensors: Dict[str, Tensor] = {}
    for op in ops:
        for kind in op.inputs:
            if kind not in tensors:
                shape = (rows[kind], heads, 1 if kind == "edge" and per_head else inner)
                tensors[kind] = (torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5).to(case.dtype)
    exact = [[tensors[kind].double() for kind in op.inputs] for op in ops]
    operands = [[tensors[kind].to(device) for kind in op.inputs] for op in ops]
    layouts = [infer_layout(op, [t.shape for t in ts]) for op, ts in zip(ops, operands)]
    knobs = {
        "vertex": dict(block_v=2, block_e=4, num_warps=4),
        "group": dict(group_size=4, block_v=2, block_e=2, num_warps=4),
    }[case.strategy]
    width = heads * inner
    tiles = [b for b in (1, 2, 4, 8, 16) if b < 2 * width and edge_mode(width, layouts[1].reduce_size, b) is not None]
    info = ug.ParallelInfo(case.strategy, block_f=tiles[case.schedule % len(tiles)], **knobs)
    both = triton_kernels.run_with_edge_output(
        ops[0],
        layouts[0],
        ops[1],
        layouts[1],
        graph_arrays(graph.structure(device, sort=case.sort)),
        operands[0],
        operands[1],
        info,
        (case.dtype, case.dtype),
    )
    if both is None:
        return [f"{info} refused {gather_name} with the edge output of {message_name}"]
    expected = [reference.execute(cpu_graph, op, ts) for op, ts in zip(ops, exact)]
    return compare(both[0], expected[0], case.dtype, f"gather output under {info}") + compare(
        both[1], expected[1], case.dtype, f"edge output under {info}"
    )


LAYERS: Dict[str, Callable[[object], torch.nn.Module]] = {
    "GCNConv": lambda ns: ns.GCNConv(6, 4),
    "GATConv": lambda ns: ns.GATConv(6, 4, heads=2),
}


def run_layer(case: Case, device: torch.device, hand_only: bool) -> List[str]:
    """A layer of :mod:`pyg_ugrapher.nn` and PyG's with the same weights, one training step, with the
    automatic schedules: outputs and gradients (input, parameters) in float32, within 1e-3 (GAT's
    attention gradients sum cancelling terms, where two float32 orders differ by more than 1e-5).
    Each gradient's error is relative to the layer's largest gradient at least: on a graph of self
    loops alone the attention gradients cancel to zero exactly in PyG and to float32 rounding of
    the other gradients' size in ours, and a relative error against zero would measure only that
    rounding."""
    edges, (num_src, num_dst) = graph_edges(case.graph)
    torch.manual_seed(case.seed)
    ours, theirs = LAYERS[case.name](ug_nn).to(device), LAYERS[case.name](pyg_nn).to(device)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(num_dst, 6, generator=torch.Generator().manual_seed(case.seed)).to(device)
    edge_index = edges.to(device)
    errors: List[str] = []
    results = []
    for layer in (ours, theirs):
        inputs = x.clone().requires_grad_()
        out = layer(inputs, edge_index)
        grads = torch.autograd.grad(out.square().sum(), [inputs] + list(layer.parameters()))
        results.append([out] + list(grads))
    ours_out, *ours_grads = results[0]
    theirs_out, *theirs_grads = results[1]
    errors += compare(ours_out, theirs_out, torch.float32, "output", 100.0)
    largest = max(g.abs().max().item() for g in theirs_grads if g.numel())
    for i, (a, b) in enumerate(zip(ours_grads, theirs_grads)):
        errors += compare(a, b, torch.float32, f"gradient {i}", 100.0, scale=largest)
    return errors


def _random_forest(num_trees: int, num_features: int, max_depth: int, seed: int) -> Dict[str, np.ndarray]:
    """Trees of random shapes, at most ``max_depth`` splits deep, as the tree kernel's flat node
    arrays; the first tree is a lone leaf."""
    rng = np.random.default_rng(seed)
    fields = ("feature", "threshold", "left", "right", "default_left", "value")
    arrays: Dict[str, List] = {name: [] for name in fields}

    def grow(depth: int) -> int:
        node = len(arrays["feature"])
        for name in fields:
            arrays[name].append(0)
        if depth < max_depth and rng.random() < 0.8:
            arrays["feature"][node] = int(rng.integers(num_features))
            arrays["threshold"][node] = float(rng.normal())
            arrays["default_left"][node] = int(rng.integers(2))
            arrays["left"][node] = grow(depth + 1)
            arrays["right"][node] = grow(depth + 1)
        else:
            arrays["left"][node] = arrays["right"][node] = node
            arrays["value"][node] = float(rng.normal())
        return node

    roots = [grow(max_depth if tree == 0 else 0) for tree in range(num_trees)]
    forest = {
        name: np.asarray(values, dtype=np.float32 if name in ("threshold", "value") else np.int32)
        for name, values in arrays.items()
    }
    forest["roots"] = np.asarray(roots, dtype=np.int32)
    return forest


def _walk(forest: Dict[str, np.ndarray], x: np.ndarray, base: float) -> np.ndarray:
    scores = np.full(x.shape[0], base, dtype=np.float64)
    for r, row in enumerate(x):
        for node in forest["roots"]:
            while forest["left"][node] != node:
                value = row[forest["feature"][node]]
                left = value < forest["threshold"][node] if not math.isnan(value) else forest["default_left"][node]
                node = forest["left"][node] if left else forest["right"][node]
            scores[r] += forest["value"][node]
    return scores


def run_kernel(case: Case, device: torch.device, hand_only: bool) -> List[str]:
    """The hand-written kernels outside the templates: GAT's per-head dot products, GCN's
    normalisation weights (with and without self loops) and the cost model's tree ensemble."""
    gen = torch.Generator().manual_seed(case.seed)
    if case.name == "head_dot":
        a, b = (torch.randn(37, 4, 33, generator=gen, dtype=torch.float64).to(case.dtype) for _ in range(2))
        return compare(
            head_dot(a.to(device), b.to(device)),
            (a.double() * b.double()).sum(-1, keepdim=True),
            case.dtype,
            "head_dot",
        )
    if case.name == "unit_norm":
        graph, _ = _graph(case.graph, case.index_dtype, device)
        src, dst = graph.coo(device)
        errors = []
        for loops in (True, False):
            want = unit_norm_torch(src.long(), dst.long(), graph.num_dst, loops, case.dtype)
            errors += compare(
                unit_norm_weights(src, dst, graph.num_dst, loops, case.dtype),
                want,
                case.dtype,
                f"unit_norm (self loops: {loops})",
            )
        return errors
    if case.name == "tree_ensemble":
        forest = _random_forest(num_trees=40, num_features=7, max_depth=5, seed=case.seed)
        x = np.random.default_rng(case.seed).normal(size=(130, 7)).astype(np.float32)
        x[::7, 3] = np.nan
        arrays = [
            torch.from_numpy(forest[name]).to(device)
            for name in ("feature", "threshold", "left", "right", "default_left", "value", "roots")
        ]
        scores = tree_ensemble_scores(torch.from_numpy(x).to(device), *arrays, 5, 0.25)
        return compare(scores, torch.from_numpy(_walk(forest, x, 0.25)).float(), torch.float32, "tree_ensemble")
    raise ValueError(f"case: unknown kernel {case.name!r}")


RUNNERS: Dict[str, Callable[[Case, torch.device, bool], List[str]]] = {
    "op": run_op,
    "softmax": run_softmax,
    "pair": run_pair,
    "layer": run_layer,
    "kernel": run_kernel,
}


# -- matrices --------------------------------------------------------------------------------------
def _op_cases(every_graph: bool) -> Iterator[Case]:
    grid = list(itertools.product(STRATEGIES, GATHERS + (None,), DTYPES, INDEX_DTYPES))
    for i, (strategy, gather, dtype, index_dtype) in enumerate(grid):
        if gather is None:
            name = MESSAGE_NAMES[i % len(MESSAGE_NAMES)]
        else:
            name = f"{GATHER_FUNCTIONS[i % len(GATHER_FUNCTIONS)]}_{gather}"
        layouts = _layouts_for(OpInfo.from_name(name))
        placements = (
            [(g, s) for g in GRAPHS for s in (True, False)]
            if every_graph
            else [(GRAPHS[i % len(GRAPHS)], (i // len(GRAPHS)) % 2 == 0)]
        )
        for j, (graph, sort) in enumerate(placements):
            yield Case(
                "op",
                name,
                graph,
                dtype,
                index_dtype,
                sort,
                strategy,
                layouts[(i + j) % len(layouts)],
                schedule=i + j,
                seed=i,
            )


def _softmax_and_pair_cases(every_graph: bool) -> Iterator[Case]:
    for kind in ("softmax", "pair"):
        grid = list(itertools.product(("vertex", "group"), DTYPES, INDEX_DTYPES))
        for i, (strategy, dtype, index_dtype) in enumerate(grid):
            placements = (
                [(g, s) for g in GRAPHS for s in (True, False)]
                if every_graph
                else [(GRAPHS[(i + 3) % len(GRAPHS)], i % 2 == 0)]
            )
            for j, (graph, sort) in enumerate(placements):
                yield Case(
                    kind,
                    "one_pass" if kind == "softmax" else "edge_output",
                    graph,
                    dtype,
                    index_dtype,
                    sort,
                    strategy,
                    schedule=i + j,
                    seed=i,
                )


def _other_cases() -> Iterator[Case]:
    for name in LAYERS:
        for graph in GRAPHS:
            if graph != "bipartite":  # the layers' graphs are square
                yield Case("layer", name, graph, index_dtype=torch.int64)
    for dtype in DTYPES:
        yield Case("kernel", "head_dot", "", dtype)
        for index_dtype in INDEX_DTYPES:
            yield Case("kernel", "unit_norm", "mixed", dtype, index_dtype)
    yield Case("kernel", "tree_ensemble", "")


def _tiny_cases() -> List[Case]:
    ops = [
        Case("op", "u_mul_e_sum", "mixed", strategy="vertex", sort=False),
        Case("op", "copy_u_max", "hub", strategy="edge", index_dtype=torch.int64, layout="heads", schedule=2),
        Case("op", "v_sub_e_mean", "duplicates", strategy="group", schedule=2),
        Case("op", "u_dot_v", "duplicates", strategy="edge", layout="heads", schedule=2),
        Case("op", "u_mul_e_min", "empty", strategy="vertex"),
    ]
    return ops + [
        Case("softmax", "one_pass", "mixed", strategy="group"),
        Case("pair", "edge_output", "duplicates", strategy="vertex"),
        Case("layer", "GCNConv", "mixed", index_dtype=torch.int64),
        Case("kernel", "head_dot", ""),
        Case("kernel", "unit_norm"),
        Case("kernel", "tree_ensemble", ""),
    ]


def cases(matrix: str) -> List[Case]:
    """The cases of ``matrix``: ``reduced``, ``full`` or ``tiny`` (see the module docstring)."""
    if matrix == "tiny":
        return _tiny_cases()
    if matrix not in ("reduced", "full"):
        raise ValueError(f"matrix: expected 'reduced', 'full' or 'tiny', got {matrix!r}")
    every_graph = matrix == "full"
    return list(_op_cases(every_graph)) + list(_softmax_and_pair_cases(every_graph)) + list(_other_cases())


# -- running ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def counting_launches() -> Iterator[List[int]]:
    """Count the Triton kernels launched inside the block (``[count]``, updated as they launch), at
    the two classes every kernel of the package launches through."""
    count = [0]
    originals = {cls: cls.run for cls in (launch.DirectKernel, launch.InterpretedKernel)}

    def counted(run):
        def wrapper(self, grid, args, kwargs):
            count[0] += 1
            return run(self, grid, args, kwargs)

        return wrapper

    for cls, run in originals.items():
        cls.run = counted(run)
    try:
        yield count
    finally:
        for cls, run in originals.items():
            cls.run = run


@dataclass
class Summary:
    cases: int = 0
    failed: int = 0
    launched: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return f"SANITIZE cases={self.cases} failed={self.failed} launched={self.launched} seconds={self.seconds:.1f}"


def run_cases(selected: Sequence[Case], device: torch.device, out: Optional[TextIO] = None) -> Summary:
    """Run every case on ``device`` (a case that raises fails; the next one still runs), printing
    ``FAIL <case>: <errors>`` for each failure to ``out`` (default: standard output); the counts."""
    out = out or sys.stdout
    summary = Summary()
    hand_only = device.type != "cuda"  # the design space's large tiles take minutes in the interpreter
    start = time.perf_counter()
    with counting_launches() as launched:
        for case in selected:
            summary.cases += 1
            try:
                errors = RUNNERS[case.kind](case, device, hand_only)
            except Exception as error:  # noqa: BLE001 - a failing case is reported, the others still run
                errors = [f"raised {type(error).__name__}: {error}"]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if errors:
                summary.failed += 1
                print(f"FAIL {case.id}: {'; '.join(errors)}", file=out, flush=True)
    summary.launched = launched[0]
    summary.seconds = time.perf_counter() - start
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sanitize_cases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--matrix", default="reduced", choices=("reduced", "full", "tiny"))
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: through Triton's interpreter (TRITON_INTERPRET=1 must be set)",
    )
    parser.add_argument("--only", default="", help="run only the cases whose id contains this text")
    parser.add_argument("--limit", type=int, default=0, help="run at most this many cases (0: all)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device (use --device cpu with TRITON_INTERPRET=1)")
    if device.type == "cpu" and not triton_kernels.interpreting():
        parser.error("--device cpu: set TRITON_INTERPRET=1 before starting Python")
    selected = [case for case in cases(args.matrix) if args.only in case.id]
    if args.limit:
        selected = selected[: args.limit]
    summary = run_cases(selected, device)
    print(summary.line(), flush=True)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
