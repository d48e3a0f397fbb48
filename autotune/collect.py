r"""Collect the cost model's training data: time sampled schedules of every operator on a corpus.

A *case* is one (graph, operator, width ``F``, dtype); each case times a sample of the design space
(:func:`triton_kernels.space.space`) and writes one row per schedule: the base feature columns of
:mod:`autotune.features`, the measured ``time_ms`` and a ``status`` (``ok``, ``error``, ``oom`` or
``skipped``, with the reason in ``note``).

* **Corpus** (:func:`corpus`): seeded synthetic graphs (uniform, Chung-Lu power law at several
  exponents, R-MAT, bipartite shapes, block-diagonal batches of small graphs, graphs with a few
  hubs of :data:`HUB_DEGREE` edges) from :math:`10^3` to :math:`10^8` edges, and every real graph
  of :func:`pyg_ugrapher.datasets.available_datasets` (:func:`real_graphs`; PROTEINS, DD and
  COLLAB as block-diagonal batches of their graphs). ``--graphs`` picks graphs by name, name
  prefix or group (:attr:`GraphSpec.groups`).
* **Operators** (:func:`op_cases`): the forward operators users run and every step of their
  backward passes (:func:`pyg_ugrapher.backward.derive`), each on the graph it runs on (the
  reversed graph for gradients of source features).
* **Schedules** (:func:`sample_configs`): a seeded permutation of the space of the widest message
  is cut to the first ``n`` schedules valid at ``F``, so that every graph and every gather
  operator at one ``F`` measures the same schedules (oracle and best-static comparisons are
  fair) and narrow and wide cases share compiled kernels. The heuristic's choice and a few fixed
  anchors are always added.
* **Compilation** first, in ``workers`` processes that launch each (operator, dtype, schedule)
  once on a tiny graph, which fills Triton's on-disk cache: kernels do not specialise on graph
  sizes, so the timed runs only load them.
* **Timing** (:func:`autotune.timing.cuda_ms`): CUDA events around single calls, each started
  with a cold L2 cache and behind a short GPU busy-wait, so that the host has queued the call
  before the start event fires (the events then time the GPU work, not the launch overhead); the
  median of ``3..reps`` calls, fewer for slow schedules; the warm-up call is not timed. On a CPU
  (the Triton interpreter, for smoke tests) wall-clock medians.

Rows go to one gzipped CSV per graph under ``out``, rewritten atomically every 30 seconds and when
the graph is done or the ``time_budget`` is spent (a killed run loses at most 30 seconds of work);
``resume`` skips the cases already written.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd
import torch
from torch import Tensor
from tqdm import tqdm

import triton_kernels
from pyg_ugrapher import datasets
from pyg_ugrapher.backward import derive
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.layout import Layout, infer_layout
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import DegreeStats, GraphStats, GraphStructure, csr_stats, index_dtype_for
from triton_kernels import GraphArrays
from triton_kernels.csr_pair import build_csr_pair
from triton_kernels.space import space

from .features import GpuInfo, case_columns, gpu_info
from .heuristic import heuristic
from .timing import cuda_ms, flush_buffer, wall_ms

log = logging.getLogger(__name__)

#: Forward operators collected by default; their backward steps are added by :func:`op_cases`.
FORWARD_OPS = ("copy_u_sum", "copy_u_mean", "copy_u_max", "u_mul_e_sum", "u_add_v", "u_dot_v")
FEATURE_SIZES = (16, 32, 64, 128, 256, 512)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: A gather of this many features or more holds a schedule's widest tile: the space is cut from it.
_WIDEST = 512
#: Fraction of free device memory a case may plan to use.
_MEMORY_FRACTION = 0.6
#: Seconds between rewrites of a graph's file (each rewrite compresses all its rows again).
_WRITE_EVERY = 30.0


# -- the graph corpus ------------------------------------------------------------------------------
#: In- and out-degree of each hub of a ``hubs`` graph: rows far longer than any other, so that a
#: schedule in which one program walks a whole hub keeps the GPU waiting on that program.
HUB_DEGREE = 100_000
#: Nodes of each small graph of a ``batch`` graph (uniformly from this range, both ends included),
#: the size of molecules and proteins batched for graph classification.
BATCH_NODES = (10, 60)
#: What ``--graphs`` selects by besides names: a synthetic generator (:attr:`GraphSpec.kind`),
#: ``real`` or ``synthetic`` graphs, and ``bipartite`` ones.
GROUPS = ("real", "synthetic", "uniform", "power_law", "rmat", "hubs", "batch", "bipartite")


@dataclass(frozen=True)
class GraphSpec:
    """One graph of the corpus: a real dataset or seeded generator arguments."""

    name: str
    kind: str  #: "real", "uniform", "power_law", "rmat", "hubs" or "batch"
    num_edges: int = 0  #: synthetic only (real graphs: known once loaded)
    num_nodes: int = 0
    num_dst: Optional[int] = None  #: bipartite destinations
    exponent: float = 0.8
    hubs: int = 0  #: ``hubs`` graphs: how many
    seed: int = 0

    @property
    def groups(self) -> Tuple[str, ...]:
        """The :data:`GROUPS` the graph belongs to."""
        if self.kind == "real":
            return ("real",)
        return ("synthetic", self.kind) + (("bipartite",) if self.num_dst else ())

    def load(self, device: torch.device) -> GraphStructure:
        if self.kind == "real":
            data = datasets.load_dataset(self.name)
            return structure_of(data.edge_index.to(device), int(data.num_nodes), int(data.num_nodes))
        if self.kind == "hubs":
            edge_index = hub_graph(self.num_nodes, self.num_edges, self.hubs, seed=self.seed, device=device)
        elif self.kind == "batch":
            edge_index = batch_graph(self.num_nodes, self.num_edges, seed=self.seed, device=device)
        elif self.kind == "rmat":
            edge_index = datasets.rmat_graph(
                self.num_nodes.bit_length() - 1, self.num_edges, seed=self.seed, device=device
            )
        elif self.kind == "power_law":
            edge_index = datasets.power_law_graph(
                self.num_nodes,
                self.num_edges,
                exponent=self.exponent,
                seed=self.seed,
                device=device,
                num_dst_nodes=self.num_dst,
            )
        else:
            edge_index = datasets.uniform_graph(
                self.num_nodes, self.num_edges, seed=self.seed, device=device, num_dst_nodes=self.num_dst
            )
        num_dst = self.num_nodes if self.num_dst is None else self.num_dst
        return structure_of(edge_index, self.num_nodes, num_dst)


def hub_graph(num_nodes: int, num_edges: int, hubs: int, seed: int, device: torch.device) -> Tensor:
    """``num_edges`` edges over ``num_nodes`` nodes: ``hubs`` random nodes with
    :data:`HUB_DEGREE` edges to and from random nodes each, the other edges uniform (seeded)."""
    spokes = hubs * HUB_DEGREE
    if num_edges < 2 * spokes:
        raise ValueError(f"num_edges: {hubs} hubs need {2 * spokes} edges, got {num_edges}")
    background = datasets.uniform_graph(num_nodes, num_edges - 2 * spokes, seed=seed, device=device)
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    centres = torch.randperm(num_nodes, generator=generator, device=device)[:hubs].repeat_interleave(HUB_DEGREE)
    others = torch.randint(num_nodes, (spokes,), generator=generator, device=device)
    return torch.cat([background, torch.stack([others, centres]), torch.stack([centres, others])], dim=1)


def batch_graph(num_nodes: int, num_edges: int, seed: int, device: torch.device) -> Tensor:
    """A block-diagonal batch of small uniform graphs of :data:`BATCH_NODES` nodes each (the last
    one smaller where ``num_nodes`` ends), ``num_edges`` edges in all (a random one in both
    directions per pair, rounded up to even), spread over the graphs by their sizes (seeded)."""
    low, high = BATCH_NODES
    generator = torch.Generator(device=device).manual_seed(seed)
    sizes = torch.randint(low, high + 1, (num_nodes // low + 1,), generator=generator, device=device)
    ends = torch.cumsum(sizes, 0)
    ends = torch.cat([ends[ends < num_nodes], ends.new_tensor([num_nodes])])
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    pairs = (num_edges + 1) // 2
    src = torch.randint(num_nodes, (pairs,), generator=generator, device=device)
    block = torch.searchsorted(ends, src, right=True)
    span = ends[block] - starts[block]
    dst = starts[block] + (torch.rand(pairs, generator=generator, device=device) * span).long().clamp_(max=span - 1)
    return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])


def structure_of(edge_index: Tensor, num_src: int, num_dst: int) -> GraphStructure:
    """Both sorted directions of the ``[2, E]`` edge index (sources first) on its device, in the
    index dtype, as :meth:`~pyg_ugrapher.GraphTensor.structure` sorts them."""
    dtype = index_dtype_for(max(num_src, num_dst), edge_index.size(1))
    src, dst = edge_index[0].to(dtype), edge_index[1].to(dtype)
    return GraphStructure(*build_csr_pair(src, dst, num_src, num_dst, dtype), src, dst)


#: Approximate stored edges of the real graphs (``SOURCES.md``), to order the corpus by size; the
#: ``--max-edges`` limit is applied to the loaded graph.
_REAL_EDGES = {
    "cora": 10_556,
    "citeseer": 9_104,
    "pubmed": 88_648,
    "blogcatalog": 667_966,
    "amazon-computers": 491_722,
    "amazon-photo": 238_162,
    "coauthor-cs": 163_788,
    "coauthor-physics": 495_924,
    "tolokers": 1_038_000,
    "github": 578_006,
    "facebook": 342_004,
    "proteins": 162_088,
    "dd": 1_686_092,
    "collab": 24_574_995,
}


def _short(count: float) -> str:
    exponent = int(math.floor(math.log10(count)))
    mantissa = count / 10**exponent
    return f"{mantissa:.2g}e{exponent}"


def _synthetic(kind: str, num_nodes: int, num_edges: int, **kwargs) -> GraphSpec:
    label = {
        "uniform": "uni",
        "power_law": f"pl{kwargs.get('exponent', 0.8):g}",
        "rmat": "rmat",
        "hubs": f"hub{kwargs.get('hubs', 0)}",
        "batch": "batch",
    }[kind]
    dst = kwargs.get("num_dst")
    nodes = _short(num_nodes) + (f"x{_short(dst)}" if dst else "")
    return GraphSpec(f"{label}-n{nodes}-e{_short(num_edges)}", kind, num_edges, num_nodes, **kwargs)


def corpus() -> List[GraphSpec]:
    r"""Every graph of the corpus, by increasing size (so that a time-limited run covers the small
    and middle sizes first).

    Synthetic families: uniform at mean degrees 2, 10 and 100; power law (exponent 0.8, maximum
    degree tens of times the mean) from :math:`10^3` to :math:`10^8` edges; milder (0.5) and
    heavier (1.0, 1.2) exponents at :math:`10^5..10^7`; R-MAT; bipartite graphs with many sources
    and few destinations (mini-batch sampling) and the reverse; block-diagonal batches of small
    graphs (mean degree 4, as a batch of molecules or proteins) from :math:`10^4` to
    :math:`10^7` edges; uniform graphs with 1, 2 or 4 hubs of :data:`HUB_DEGREE` edges from
    :math:`3 \cdot 10^5` to :math:`10^7` edges.
    """
    specs = [_synthetic("uniform", int(e // 10), int(e)) for e in (1e3, 1e4, 1e5, 1e6, 1e7, 1e8)]
    specs += [_synthetic("uniform", int(e // 2), int(e)) for e in (1e4, 1e6)]
    specs += [_synthetic("uniform", int(e // 100), int(e)) for e in (1e5, 1e7)]
    specs += [_synthetic("power_law", int(e // 10), int(e)) for e in (1e3, 1e4, 1e5, 1e6, 1e7, 1e8)]
    specs += [
        _synthetic("power_law", int(e // 10), int(e), exponent=x) for x in (0.5, 1.0, 1.2) for e in (1e5, 1e6, 1e7)
    ]
    specs += [_synthetic("rmat", 1 << s, int(e)) for s, e in ((14, 2e5), (17, 2e6), (20, 1.6e7))]
    specs += [
        _synthetic("uniform", 100_000, 1_000_000, num_dst=2_000),
        _synthetic("uniform", 2_000, 1_000_000, num_dst=100_000),
        _synthetic("power_law", 200_000, 4_000_000, num_dst=20_000),
    ]
    specs += [_synthetic("batch", int(e // 4), int(e)) for e in (1e4, 1e5, 1e6, 1e7)]
    specs += [_synthetic("hubs", int(n), int(e), hubs=h) for n, e, h in ((1e5, 3e5, 1), (2e5, 1e6, 2), (1e6, 1e7, 4))]
    specs += [GraphSpec(name, "real", _REAL_EDGES.get(name, 0)) for name in real_graphs()]
    return sorted(specs, key=lambda s: s.num_edges)


def real_graphs() -> List[str]:
    """The real graphs of the corpus (every dataset of
    :func:`~pyg_ugrapher.datasets.available_datasets`); the rest is synthetic."""
    return datasets.available_datasets()


def family(spec: GraphSpec, graph: GraphStructure) -> str:
    """``"power_law"`` or ``"uniform"``: synthetic graphs by their generator (exponent 0.5 and up
    is skewed, so are hubs; batches of small uniform graphs are not), real graphs by their
    in-degrees (the largest over 8x the mean, the heuristic's criterion)."""
    if spec.kind in ("power_law", "rmat", "hubs"):
        return "power_law"
    if spec.kind in ("uniform", "batch"):
        return "uniform"
    rows = csr_stats(graph.csr).rows
    return "power_law" if rows.max > 8 * max(rows.mean, 1.0) else "uniform"


# -- operators ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCase:
    """One operator as it runs: forward, or one step of a backward pass."""

    name: str  #: ``copy_u_sum``, or ``u_mul_e_sum:grad0`` for the gradient of its slot 0
    op: OpInfo
    reverse: bool  #: runs on the reversed graph
    shapes: Tuple[Tuple[int, ...], ...]  #: operand feature shapes, per slot

    def layout(self) -> Layout:
        return infer_layout(self.op, [(1,) + s for s in self.shapes])


def _forward_shapes(op: OpInfo, F: int) -> Tuple[Tuple[int, ...], ...]:
    """Operand feature shapes of a forward operator at width ``F``: ``[F]`` per vertex, and one
    scalar per edge for an edge operand (edge weights, as GCN's normalisation)."""
    return tuple(() if kind == "edge" else (F,) for kind in op.inputs)


def op_cases(names: Sequence[str], F: int, backward: bool = True) -> List[OpCase]:
    """The forward operators ``names`` at width ``F`` and, with ``backward``, every step of their
    backward passes (shared steps once: ``copy_u_sum``'s gradient is ``copy_u_sum`` reversed)."""
    found: Dict[Tuple, OpCase] = {}
    for name in names:
        op = OpInfo.from_name(name)
        shapes = _forward_shapes(op, F)
        case = OpCase(name, op, False, shapes)
        found.setdefault((op, False, shapes), case)
        if not backward:
            continue
        layout = case.layout()
        reducible = tuple(
            kind == "edge" and pattern in ("head", "scalar") for kind, pattern in zip(op.inputs, layout.patterns)
        )
        plan = derive(op, reducible)
        known = {"grad": layout.out_shape, "out": layout.out_shape}
        steps = [("count", plan.count)] if plan.count is not None else []
        steps += [(f"grad{slot}", step) for slot, step in enumerate(plan.slots)]
        for label, step in steps:
            step_shapes = tuple(shapes[s] if isinstance(s, int) else known[s] for s in step.sources)
            key = (step.op, step.reverse, step_shapes)
            found.setdefault(key, OpCase(f"{name}:{label}", step.op, step.reverse, step_shapes))
    return list(found.values())


# -- schedules ---------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _permutation(message: bool, seed: int) -> Tuple[ParallelInfo, ...]:
    op = OpInfo("copy_lhs", None if message else "sum", lhs="src_v")
    infos = list(space(op, _WIDEST))
    random.Random(f"{seed}:{message}").shuffle(infos)
    return tuple(infos)


def _regular(skewed: bool) -> GraphStats:
    """Statistics that send :func:`~autotune.heuristic.heuristic` down its skewed or regular rule."""
    degrees = DegreeStats(
        10.0, 30.0 if skewed else 3.0, 1000.0 if skewed else 20.0, 5.0 if skewed else 0.3, 0.2 if skewed else 0.02, 0.0
    )
    return GraphStats(1000, 1000, 10_000, degrees, degrees)


def anchors(op: OpInfo, F: int) -> List[ParallelInfo]:
    """Fixed schedules measured in every case: the heuristic's GPU choices for regular and skewed
    graphs, a one-row vertex schedule and an edge schedule."""
    block_f = min(64, 1 << max(F - 1, 0).bit_length())
    fixed = [heuristic(_regular(skewed), op, F, True) for skewed in (False, True)]
    fixed += [
        ParallelInfo("vertex", block_v=1, block_e=32, block_f=block_f, num_warps=4),
        ParallelInfo("edge", block_e=128, block_f=block_f, num_warps=4 if block_f >= 32 else 2),
    ]
    return list(dict.fromkeys(fixed))


def sample_configs(op: OpInfo, F: int, count: int, seed: int = 0) -> List[ParallelInfo]:
    """``count`` schedules of ``op``'s space at width ``F`` (see the module docstring), then the
    :func:`anchors` (valid for ``op`` at ``F``, though not always in the space)."""
    message = op.gather_op is None
    valid = set(space(op, F))
    chosen = [info for info in _permutation(message, seed) if info in valid][:count]
    for info in anchors(op, F):
        if info not in chosen:
            chosen.append(info)
    return chosen


# -- running one operator ------------------------------------------------------------------------
def _rows(graph: GraphStructure, kind: str) -> int:
    return {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}[kind]


def operands(
    graph: GraphStructure, case: OpCase, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> List[Tensor]:
    """Random operands of ``case`` on ``graph`` (already reversed where the case says so)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return [
        torch.randn((_rows(graph, kind),) + shape, generator=generator, device=device, dtype=dtype)
        for kind, shape in zip(case.op.inputs, case.shapes)
    ]


def runner(graph: GraphStructure, case: OpCase, tensors: Sequence[Tensor], info: ParallelInfo):
    """A callable that runs ``case`` under ``info`` through the kernels, as ``ug.compute`` does."""
    arrays = GraphArrays(graph.csr, graph.src, graph.dst)
    layout = infer_layout(case.op, [t.shape for t in tensors])
    return lambda: triton_kernels.run(case.op, layout, arrays, tensors, info)


def planned_bytes(graph: GraphStructure, case: OpCase, itemsize: int) -> int:
    """Device memory a case needs beyond the graph: operands, output, per-edge scratch."""
    layout = case.layout()
    width = max(math.prod(layout.out_shape), 1)
    operand_bytes = (
        sum(_rows(graph, kind) * max(math.prod(shape), 1) for kind, shape in zip(case.op.inputs, case.shapes))
        * itemsize
    )
    out_rows = graph.num_dst if case.op.gather_op else graph.num_edges
    return operand_bytes + out_rows * width * max(itemsize, 4) * 2 + graph.num_edges * 8


class Timer:
    """Median time of one call, warm-up excluded; CUDA events on a GPU, wall clock on a CPU."""

    def __init__(self, device: torch.device, reps: int = 10, target_ms: float = 20.0) -> None:
        self.device = device
        self.reps = max(reps, 1)
        self.target_ms = target_ms
        self.cuda = device.type == "cuda"
        self._flush = flush_buffer(device) if self.cuda else None

    def _once(self, fn) -> float:
        """One timed call: behind a busy-wait, with a cold L2 (:func:`autotune.timing.cuda_ms`)."""
        if self.cuda:
            return cuda_ms(fn, warmup=0, reps=1, flush=self._flush)[0]
        return wall_ms(fn, warmup=0, reps=1)[0]

    def __call__(self, fn) -> Tuple[float, int]:
        """``(median ms, calls timed)``: as many calls as fit in ``target_ms``, between 3 and
        ``reps``; a schedule slower than ``target_ms`` is timed once (it is far from the best)."""
        fn()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        first = self._once(fn)
        fit = self.target_ms // max(first, 1e-3)
        reps = 1 if fit < 1 else int(min(self.reps, max(3, fit)))
        times = [first] + [self._once(fn) for _ in range(reps - 1)]
        return statistics.median(times), reps


def _failure(error: BaseException) -> Tuple[str, str]:
    message = str(error).strip().splitlines()
    note = f"{type(error).__name__}: {message[0] if message else ''}"[:300]
    return ("oom" if isinstance(error, torch.OutOfMemoryError) else "error"), note


# -- compilation ---------------------------------------------------------------------------------
def _compile_chunk(jobs: List[Tuple[str, str, str]], device: str) -> List[str]:
    """Launch each (op case name, dtype, schedule) once on a tiny graph; the errors met."""
    device = torch.device(device)
    graph = structure_of(torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 3, 3]], device=device), 4, 4)
    errors = []
    for case_text, dtype_name, config in jobs:
        case = _decode_case(case_text)
        try:
            g = graph.reverse() if case.reverse else graph
            tensors = operands(g, case, DTYPES[dtype_name], device)
            runner(g, case, tensors, ParallelInfo.deserialize(config))()
        except Exception as error:  # noqa: BLE001 - reported by the caller, timing skips it again
            errors.append(f"{case.name} {dtype_name} {config}: {_failure(error)[1]}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return errors


def _encode_case(case: OpCase) -> str:
    return "|".join(
        [case.name, case.op.serialize(), str(int(case.reverse)), ";".join(",".join(map(str, s)) for s in case.shapes)]
    )


def _decode_case(text: str) -> OpCase:
    name, rest = text.split("|", 1)
    op, reverse, shapes = rest.rsplit("|", 2)  # the serialised op may hold "|" itself
    shapes_t = tuple(tuple(int(d) for d in s.split(",") if d) for s in shapes.split(";"))
    return OpCase(name, OpInfo.deserialize(op), bool(int(reverse)), shapes_t)


def kernel_jobs(jobs: Iterable[Tuple[OpCase, str, ParallelInfo]]) -> List[Tuple[str, str, str]]:
    """One (encoded case, dtype, schedule) per distinct kernel of ``jobs``.

    A kernel depends on the operator, the operands' patterns, the dtype and the schedule, not on
    ``F`` (every width collected is a multiple of 16, which is all Triton specialises on), except
    for a reducing op, whose split of the feature tile between outputs and summed features does.
    """
    unique: Dict[Tuple, Tuple[str, str, str]] = {}
    for case, dtype, info in jobs:
        pattern = tuple(bool(s) for s in case.shapes)
        width = case.layout().message_width if case.op.reduces else 0
        unique.setdefault((case.op, pattern, width, dtype, info), (_encode_case(case), dtype, info.serialize()))
    return sorted(unique.values())


def compile_all(jobs: List[Tuple[OpCase, str, ParallelInfo]], workers: int, device: torch.device) -> None:
    """Fill Triton's on-disk cache with every kernel of ``jobs`` (:func:`kernel_jobs`) in
    ``workers`` processes."""
    if not jobs or workers < 1 or device.type != "cuda":
        return
    encoded = kernel_jobs(jobs)
    chunks = [encoded[k :: workers * 4] for k in range(workers * 4)]
    errors: List[str] = []
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_compile_chunk, chunk, str(device)) for chunk in chunks if chunk]
        for future in tqdm(futures, desc=f"compiling {len(encoded)} kernels", unit="chunk"):
            errors += future.result()
    for error in errors:
        log.warning("compile: %s", error)


# -- the collection loop -------------------------------------------------------------------------
@dataclass
class Settings:
    """What one ``collect`` run covers and how (the CLI's options)."""

    out: Path
    graphs: Optional[List[str]] = None  #: see :func:`select_graphs`; None: all
    ops: Sequence[str] = FORWARD_OPS
    backward: bool = True
    features: Sequence[int] = FEATURE_SIZES
    dtypes: Sequence[str] = ("float32",)
    configs: int = 24
    max_edges: float = 1e8
    time_budget: Optional[float] = None
    resume: bool = True
    workers: int = 0
    reps: int = 10
    seed: int = 0
    device: str = "cuda"


def _matches(spec: GraphSpec, name: str) -> bool:
    return spec.name.startswith(name) or name.replace("-", "_") in spec.groups


def select_graphs(names: Optional[Sequence[str]] = None, max_edges: float = math.inf) -> List[GraphSpec]:
    """The graphs of :func:`corpus` named by ``names`` (``None`` or empty: all), by name, a prefix
    of names (``pl0.8``) or one of :data:`GROUPS` (``real``, ``hubs``, ``power-law``), of at most
    ``max_edges`` edges (a real graph's stored count; the loaded graph is checked again)."""
    specs = corpus()
    if names:
        unknown = [n for n in names if not any(_matches(s, n) for s in specs)]
        if unknown:
            raise ValueError(f"graphs: unknown {unknown}; known: {list(GROUPS)} and {[s.name for s in specs]}")
        specs = [s for s in specs if any(_matches(s, n) for n in names)]
    return [s for s in specs if s.num_edges <= max_edges]


def collection_path(out: Path, graph: str, gpu_name: str) -> Path:
    """The file in ``out`` of the timings collected on ``graph`` on the GPU named ``gpu_name``."""
    gpu_tag = "".join(ch if ch.isalnum() else "_" for ch in gpu_name.lower())
    return out / f"{graph}__{gpu_tag}.csv.gz"


def _write(path: Path, rows: List[Dict]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False, compression="gzip")
    os.replace(tmp, path)


def _case_key(case: str, F: int, dtype: str) -> Tuple[str, int, str]:
    return case, int(F), dtype


def collect(settings: Settings) -> Path:
    """Run the sweep of ``settings``; returns the output folder."""
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA is not available; use --device cpu (the Triton interpreter)")
    if device.type == "cpu" and not triton_kernels.interpreting():
        raise ValueError(
            "device: the CPU runs kernels through Triton's interpreter only; set "
            "TRITON_INTERPRET=1 before starting Python"
        )
    for dtype in settings.dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtypes: unknown {dtype!r}; expected one of {list(DTYPES)}")
    for name in settings.ops:
        OpInfo.from_name(name)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_info(device)
    specs = select_graphs(settings.graphs, settings.max_edges)
    deadline = math.inf if settings.time_budget is None else time.monotonic() + settings.time_budget
    timer = Timer(device, settings.reps)

    plans = {F: op_cases(settings.ops, F, settings.backward) for F in settings.features}
    jobs = [
        (case, dtype, info)
        for F, cases in plans.items()
        for case in cases
        for dtype in settings.dtypes
        for info in sample_configs(case.op, case.layout().message_width, settings.configs, settings.seed)
    ]
    compile_all(jobs, settings.workers, device)

    total = len(specs) * sum(len(c) for c in plans.values()) * len(settings.dtypes)
    progress = tqdm(total=total, desc="cases", unit="case")
    for spec in specs:
        if time.monotonic() >= deadline:
            log.info("time budget spent; stopping before %s", spec.name)
            break
        path = collection_path(out, spec.name, gpu.name)
        rows: List[Dict] = []
        if settings.resume and path.exists():
            rows = pd.read_csv(path).to_dict("records")
        done = {_case_key(r["op"], r["F"], r["dtype"]) for r in rows}
        todo = [
            (case, dtype)
            for F, cases in plans.items()
            for case in cases
            for dtype in settings.dtypes
            if _case_key(case.name, case.layout().message_width, dtype) not in done
        ]
        progress.update(sum(len(c) for c in plans.values()) * len(settings.dtypes) - len(todo))
        if not todo:
            continue
        try:
            graph = spec.load(device)
        except (FileNotFoundError, ValueError) as error:
            log.warning("graph %s: not loaded (%s)", spec.name, error)
            progress.update(len(todo))
            continue
        if graph.num_edges > settings.max_edges:
            log.info("graph %s: %d edges, over --max-edges", spec.name, graph.num_edges)
            progress.update(len(todo))
            continue
        graph_family = family(spec, graph)
        written = len(rows)
        last_write = time.monotonic()
        for case, dtype_name in todo:
            case_rows = _run_case(spec.name, graph_family, graph, case, dtype_name, gpu, timer, settings, deadline)
            if case_rows is None:
                break
            rows += case_rows
            progress.update(1)
            if time.monotonic() - last_write >= _WRITE_EVERY:
                _write(path, rows)
                written, last_write = len(rows), time.monotonic()
        if len(rows) > written:
            _write(path, rows)
        del graph
        if device.type == "cuda":
            torch.cuda.empty_cache()
    progress.close()
    return out


def _run_case(
    graph_name: str,
    graph_family: str,
    graph: GraphStructure,
    case: OpCase,
    dtype_name: str,
    gpu: GpuInfo,
    timer: Timer,
    settings: Settings,
    deadline: float,
) -> Optional[List[Dict]]:
    """The rows of one case, or ``None`` when the ``deadline`` (``time.monotonic``) passed before
    its last schedule was timed."""
    device = timer.device
    dtype = DTYPES[dtype_name]
    g = graph.reverse() if case.reverse else graph
    layout = case.layout()
    F, reduce_size = layout.message_width, layout.reduce_size
    stats = csr_stats(g.csr)
    base = {
        "graph": graph_name,
        "family": graph_family,
        "op": case.name,
        "op_text": case.op.serialize(),
        "reverse": int(case.reverse),
        "dtype": dtype_name,
        "gpu": gpu.name,
    }
    base.update(case_columns(stats, case.op, F, reduce_size, dtype, gpu))
    chosen = heuristic(stats, case.op, F, device.type == "cuda")
    configs = sample_configs(case.op, F, settings.configs, settings.seed)
    if chosen not in configs:
        configs.append(chosen)
    itemsize = dtype.itemsize
    skip_note = ""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        need = planned_bytes(g, case, itemsize)
        if need > _MEMORY_FRACTION * free:
            skip_note = f"needs {need / 2**30:.1f} GiB of {free / 2**30:.1f} GiB free"
    tensors = [] if skip_note else operands(g, case, dtype, device, settings.seed)
    rows = []
    for info in configs:
        row = dict(base)
        row.update(
            {
                "config": info.serialize(),
                "heuristic": int(info == chosen),
                "strategy": info.strategy,
                **{k: getattr(info, k) or 0 for k in ("block_v", "block_e", "block_f", "group_size", "num_warps")},
                "time_ms": float("nan"),
                "reps": 0,
                "status": "ok",
                "note": "",
            }
        )
        if skip_note:
            row.update(status="skipped", note=skip_note)
            rows.append(row)
            continue
        try:
            row["time_ms"], row["reps"] = timer(runner(g, case, tensors, info))
        except Exception as error:  # noqa: BLE001 - a failing schedule is a row, the sweep goes on
            row["status"], row["note"] = _failure(error)
            log.warning("%s %s F=%d %s: %s", graph_name, case.name, F, info.serialize(), row["note"])
        if row["status"] == "oom":
            torch.cuda.empty_cache()
        rows.append(row)
        if time.monotonic() >= deadline:
            return None
    return rows


def read_table(paths: Iterable[os.PathLike]) -> pd.DataFrame:
    """Every collected row under ``paths`` (files, or folders of ``*.csv.gz``), concatenated."""
    files: List[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.glob("*.csv.gz")) + sorted(path.glob("*.csv"))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"data: {path} does not exist")
    if not files:
        raise ValueError(f"data: no .csv or .csv.gz files under {[str(p) for p in paths]}")
    return pd.concat([pd.read_csv(f, low_memory=False) for f in files], ignore_index=True)


def digest(table: pd.DataFrame) -> str:
    """A short hash of a table's contents (recorded with a trained model)."""
    return hashlib.sha256(pd.util.hash_pandas_object(table, index=False).values.tobytes()).hexdigest()[:16]
