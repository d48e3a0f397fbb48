"""Operator level: one graph operator, ours against PyG, torch.compile'd PyG, cuSPARSE and the
bandwidth floor.

Methods (the ``method`` column):

==================  ==========================================================================
``pyg``             the ``MessagePassing`` module a user writes (:mod:`benchmarks.baselines`),
                    eager; also the reference every other method is checked against
``pyg_compiled``    the same module under ``torch.compile(dynamic=False)``
``cusparse``        ``torch.sparse.mm`` on a CSR adjacency built once (SpMM ops, forward only)
``ours``            ``ug.compute(..., parallel_info=None)``: the cost model's schedule, recorded
``ours_compiled``   ``ug.compute`` under ``torch.compile``; Dynamo's graphs and graph breaks counted
``ours_recorded``   ``ug.compute`` on the graph as a recorded step (``ug.RecordedStep``) reads it:
                    the sorted structure and the cost model's schedules, on small graphs too,
                    called eagerly; its ``gpu_ms`` is what every replay of such a step spends on
                    the operator, its wall and host times are eager calls'
``oracle``          ``ug.compute`` on ``ours_recorded``'s graph with the fastest schedules of the
                    exhaustive timings of this graph's whole design space on this GPU
                    (``autotune/data/oracle``, forward only; the :data:`ORACLE_TOP` fastest timed
                    again, the best kept in ``schedule``): how far any schedule goes on the graph;
                    ``unavailable`` where no such timings were collected
``sweep``           ``ug.compute`` with one explicit schedule (``config``): a seeded sample of each
                    strategy's design space plus known-good anchors (forward only); the report
                    keeps the best per strategy
``floor``           bytes that must move (each input read once, the output written once, one
                    int32 graph structure per pass) over the measured copy bandwidth
==================  ==========================================================================

Passes: ``fwd`` (inputs without gradients) and ``fwd+bwd`` (every operand requires a gradient;
one forward and ``torch.autograd.grad`` of a random output gradient). Peak memory is measured
for every timed row.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import pandas as pd
import torch
import triton
from torch import Tensor
from tqdm import tqdm

import pyg_ugrapher as ug
from autotune.collect import collection_path, read_table
from pyg_ugrapher.ops import decided_schedule
from pyg_ugrapher.parallel import STRATEGIES
from triton_kernels import space, uses_triton

from .baselines import PYG_MODULES, sparse_adjacency
from .graphs import GraphSpec, LoadedGraph
from .rows import ResultsFile, device_name
from .timing import Budget, Settings, copy_bandwidth, failure, free_memory, max_rel_err, measure

log = logging.getLogger(__name__)

PASSES = ("fwd", "fwd+bwd")
FEATURES = (32, 128, 256)
TINY_FEATURES = (8, 16)
#: Every method, in the order a case runs them (the PyG reference first).
METHODS = ("pyg", "pyg_compiled", "cusparse", "ours", "ours_compiled", "ours_recorded", "oracle", "sweep", "floor")
#: Methods of the forward pass alone.
FORWARD_ONLY = ("cusparse", "oracle", "sweep")
#: Exhaustive timings of the design space per real graph and GPU (``python -m autotune collect
#: --configs 100000``), which the ``oracle`` method reads.
ORACLE = Path(__file__).resolve().parent.parent / "autotune" / "data" / "oracle"
#: The oracle's fastest schedules of a case that the ``oracle`` method times again: schedules within
#: a few per cent of each other are ranked by chance in one timing.
ORACLE_TOP = 3
COMPILED = ("pyg_compiled", "ours_compiled")
#: Sweep configurations per strategy (anchors included).
SWEEP_SIZE = 6
TINY_SWEEP_SIZE = 2


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked operator: its operands and what its backward pass must read.

    Operands: ``x`` ``[N, F]`` source features, ``y`` ``[N, F]`` destination features, ``w``
    ``[E]`` edge weights (in ``[0.5, 1.5)``, as positive normalisation weights are).
    """

    name: str
    operands: Tuple[str, ...]
    backward: bool = True
    spmm: bool = False
    grad_reads_inputs: bool = False
    grad_reads_out: bool = False

    @property
    def gather(self) -> bool:
        return self.name.rsplit("_", 1)[-1] in ("sum", "max")

    def out_numel(self, num_nodes: int, num_edges: int, F: int) -> int:
        if self.gather:
            return num_nodes * F
        return num_edges if self.name == "u_dot_v" else num_edges * F


OPS: Dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("copy_u_sum", ("x",), spmm=True),
        OpSpec("u_mul_e_sum", ("x", "w"), spmm=True, grad_reads_inputs=True),
        OpSpec("copy_u_max", ("x",), grad_reads_inputs=True, grad_reads_out=True),
        OpSpec("u_dot_v", ("x", "y"), grad_reads_inputs=True),
        OpSpec("u_add_v", ("x", "y"), backward=False),
    )
}
HEADLINE_OPS = ("copy_u_sum", "u_mul_e_sum", "copy_u_max", "u_dot_v")


def floor_bytes(
    spec: OpSpec, pass_: str, num_nodes: int, num_edges: int, F: int, itemsize: int = 4, index_size: int = 4
) -> int:
    """Bytes that must move: every input read once, the output written once, plus the graph
    (CSR ``rowptr`` + ``col`` for a gather, ``src`` + ``dst`` for message creation).

    The backward pass reads the output gradient, the graph again and what its formulas need
    (the inputs for products and max, the output for max), and writes one gradient per operand.
    Random gathers of neighbour rows move more than this when rows leave the cache: a floor,
    not a prediction.
    """
    sizes = {"x": num_nodes * F, "y": num_nodes * F, "w": num_edges}
    inputs = sum(sizes[name] for name in spec.operands) * itemsize
    out = spec.out_numel(num_nodes, num_edges, F) * itemsize
    structure = (num_nodes + 1 + num_edges if spec.gather else 2 * num_edges) * index_size
    total = inputs + out + structure
    if pass_ == "fwd+bwd":
        total += out + structure + inputs
        total += inputs if spec.grad_reads_inputs else 0
        total += out if spec.grad_reads_out else 0
    return total


def _seed(*parts: object) -> int:
    """A stable seed from a case's identity (``hash`` of a str changes between processes)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


#: Known-good schedules, as knob patterns: the default cost model's rules and the strategies'
#: defaults. A pattern picks the first schedule of the design space that agrees on every knob the
#: schedule has (knobs left out, such as ``num_warps``, take the space's first valid value), so
#: the anchors survive changes to the space and to the knobs' defaults.
ANCHORS = (
    ("vertex", {"block_v": 4, "block_e": 16}),
    ("vertex", {"block_v": 4, "block_e": 32}),
    ("edge", {"block_e": 64}),
    ("edge", {"block_e": 128}),
    ("group", {"group_size": 128, "block_e": 32}),
    ("group", {"group_size": 512, "block_e": 32}),
)


def _matches(info: ug.ParallelInfo, strategy: str, pattern: dict) -> bool:
    return info.strategy == strategy and all(getattr(info, k, None) in (v, None) for k, v in pattern.items())


def sweep_configs(op_name: str, F: int, per_strategy: int) -> List[ug.ParallelInfo]:
    """Up to ``per_strategy`` schedules of each strategy: the anchors first (64-feature tiles,
    1 stage), then a sample seeded by (op, F, strategy), so every graph times the same
    configurations (and reuses their compiled kernels)."""
    valid = space(ug.OpInfo.from_name(op_name), F)
    common = {"block_f": min(64, triton.next_power_of_2(F)), "num_stages": 1}
    chosen: List[ug.ParallelInfo] = []
    for strategy in STRATEGIES:
        candidates = [p for p in valid if p.strategy == strategy]
        picked: List[ug.ParallelInfo] = []
        for anchor_strategy, pattern in ANCHORS:
            match = next((p for p in candidates if _matches(p, anchor_strategy, {**common, **pattern})), None)
            if match is not None and match not in picked:
                picked.append(match)
        picked = picked[:per_strategy]
        rest = [p for p in candidates if p not in picked]
        rng = random.Random(_seed(op_name, F, strategy))
        picked += rng.sample(rest, min(len(rest), per_strategy - len(picked)))
        chosen += picked
    return chosen


def _sweep_or_none(op_name: str, F: int, per_strategy: int) -> List[ug.ParallelInfo]:
    try:
        return sweep_configs(op_name, F, per_strategy)
    except Exception as error:  # noqa: BLE001 - the design space is core code; a bug there is logged
        log.error("no sweep of %s, F=%d: the design space failed (%s)", op_name, F, failure(error)["note"])
        return []


def oracle_schedules(graph: str, op_name: str, F: int, gpu_name: str, top: int = ORACLE_TOP) -> List[ug.ParallelInfo]:
    """The ``top`` fastest schedules of the exhaustive timings (:data:`ORACLE`) of the forward
    ``op_name`` at width ``F`` in float32 on ``graph`` on the GPU named ``gpu_name``, fastest first;
    ``[]`` where none were collected."""
    table = _oracle_table(collection_path(ORACLE, graph, gpu_name))
    if table is None:
        return []
    case = (table.op == op_name) & (table.F == F) & (table.reverse == 0) & (table.dtype == "float32")
    timed = table[case & (table.status == "ok")]
    return [ug.ParallelInfo.deserialize(text) for text in timed.nsmallest(top, "time_ms").config]


@functools.lru_cache(maxsize=None)
def _oracle_table(path: Path) -> Optional[pd.DataFrame]:
    return read_table([path]) if path.exists() else None


class Item(NamedTuple):
    """One planned measurement."""

    op: str
    F: int
    pass_: str
    method: str
    config: Optional[ug.ParallelInfo] = None

    def columns(self) -> dict:
        return {
            "op": self.op,
            "F": self.F,
            "pass": self.pass_,
            "method": self.method,
            "config": self.config.serialize() if self.config else "",
        }


def plan(op_names: Sequence[str], features: Sequence[int], methods: Sequence[str], sweep_size: int) -> List[Item]:
    """Every measurement of one graph, grouped by (op, F) so each case's inputs are made once."""
    items = []
    for name, F in itertools.product(op_names, features):
        spec = OPS[name]
        for pass_ in PASSES if spec.backward else PASSES[:1]:
            for method in METHODS:
                if method not in methods or (pass_ == "fwd+bwd" and method in FORWARD_ONLY):
                    continue
                if method == "cusparse" and not spec.spmm:
                    continue
                if method == "sweep":
                    items += [Item(name, F, pass_, method, c) for c in _sweep_or_none(name, F, sweep_size)]
                else:
                    items.append(Item(name, F, pass_, method))
    return items


def _normal_without_zeros(shape: Tuple[int, ...], gen: torch.Generator, device: torch.device) -> Tensor:
    """Standard normal features with every exact zero set to 1. A float32 sample is rarely exactly
    0, but a graph's million features can hold one, and where it is a destination's maximum, PyG's
    max aggregation (torch's ``scatter_reduce`` "amax" into a zero-filled output) gives it half the
    gradient, sharing it with the output's initial zero: the reference would then count the whole
    gradient, which ours gives it, as a mismatch."""
    values = torch.randn(shape, generator=gen, device=device)
    return values.masked_fill_(values == 0, 1.0)


class Case:
    """One (graph, op, F): seeded random inputs, the PyG module, and PyG's results as reference."""

    def __init__(self, loaded: LoadedGraph, spec: OpSpec, F: int, device: torch.device, backend: str) -> None:
        self.loaded, self.spec, self.F, self.device, self.backend = loaded, spec, F, device, backend
        self.op = ug.OpInfo.from_name(spec.name)
        gen = torch.Generator(device=device).manual_seed(_seed(loaded.spec.name, spec.name, F))
        N, E = loaded.num_nodes, loaded.num_edges
        make = {
            "x": lambda: _normal_without_zeros((N, F), gen, device),
            "y": lambda: _normal_without_zeros((N, F), gen, device),
            "w": lambda: torch.rand(E, generator=gen, device=device) + 0.5,
        }
        self.operands = [make[name]() for name in spec.operands]
        out_shape = (N, F) if spec.gather else ((E, 1) if spec.name == "u_dot_v" else (E, F))
        self.grad_out = torch.randn(out_shape, generator=gen, device=device)
        self.pyg = PYG_MODULES[spec.name]()
        self._compiled: Dict[str, Callable] = {}
        self._reference: Dict[str, Optional[Tuple[Tensor, ...]]] = {}

    def graph(self, method: str) -> ug.GraphTensor:
        """Our graph that ``method`` reads: the recorded step's (sorted, as the oracle's timings
        read it) for ``ours_recorded`` and ``oracle``."""
        return self.loaded.recorded_graph if method in ("ours_recorded", "oracle") else self.loaded.graph

    def forward(self, method: str, config: Optional[ug.ParallelInfo] = None) -> Callable[..., Tensor]:
        """The function a method runs, called with the operands in slot order."""
        edge_index, graph = self.loaded.edge_index, self.graph(method)
        if method == "pyg":
            return lambda x, *rest: self.pyg(x, edge_index, *rest)
        if method == "cusparse":
            weights = self.operands[1] if self.spec.name == "u_mul_e_sum" else None
            adj_t = sparse_adjacency(edge_index, self.loaded.num_nodes, weights)
            return lambda x, *rest: torch.sparse.mm(adj_t, x)
        if method in ("ours", "ours_recorded"):
            return lambda *operands: ug.compute(graph, self.op, *operands)
        if method in ("sweep", "oracle"):
            return lambda *operands: ug.compute(graph, self.op, *operands, parallel_info=config)
        if method not in self._compiled:  # one compiled callable serves both passes
            if method == "pyg_compiled":
                module = torch.compile(self.pyg, dynamic=False, backend=self.backend)
                self._compiled[method] = lambda x, *rest: module(x, edge_index, *rest)
            else:
                self._compiled[method] = torch.compile(self.forward("ours"), dynamic=False, backend=self.backend)
        return self._compiled[method]

    def step(self, fn: Callable[..., Tensor], pass_: str) -> Callable[[], Tuple[Tensor, ...]]:
        """One timed call: the output, and for ``fwd+bwd`` also every operand's gradient."""
        if pass_ == "fwd":
            return lambda: (fn(*self.operands),)
        leaves = [t.detach().requires_grad_() for t in self.operands]

        def forward_backward() -> Tuple[Tensor, ...]:
            out = fn(*leaves)
            return (out, *torch.autograd.grad(out, leaves, self.grad_out))

        return forward_backward

    def reference(self, pass_: str) -> Optional[Tuple[Tensor, ...]]:
        """PyG's eager results for ``pass_``, computed once; ``None`` if PyG failed (e.g. OOM)."""
        if pass_ not in self._reference:
            try:
                self._reference[pass_] = tuple(t.detach() for t in self.step(self.forward("pyg"), pass_)())
            except Exception as error:  # noqa: BLE001 - the PyG row of this pass records it
                log.warning(
                    "%s %s F=%d %s: no PyG reference (%s)",
                    self.loaded.spec.name,
                    self.spec.name,
                    self.F,
                    pass_,
                    failure(error)["note"],
                )
                self._reference[pass_] = None
        return self._reference[pass_]

    def schedule(self, method: str = "ours") -> str:
        """The schedule ``compute`` runs with ``parallel_info=None`` on this case's operands, as
        they are read after the timed calls (a reused edge weight in CSR order), on the graph
        ``method`` reads."""
        if not uses_triton(self.device):
            return "reference"
        return decided_schedule(self.graph(method), self.op, self.operands).serialize()


def _measure_item(case: Case, item: Item, settings: Settings) -> dict:
    spec, loaded = case.spec, case.loaded
    row = item.columns()
    if item.method == "floor":
        bandwidth = copy_bandwidth(case.device)
        moved = floor_bytes(spec, item.pass_, loaded.num_nodes, loaded.num_edges, case.F)
        return {
            **row,
            "time_ms": moved / bandwidth * 1e3,
            "status": "ok",
            "note": f"{moved / 1e6:.1f} MB at {bandwidth / 1e9:.0f} GB/s copy bandwidth",
        }
    reference = None if item.method == "pyg" else case.reference(item.pass_)
    compare = None if reference is None else (lambda result: max_rel_err(result, reference))
    if item.method == "oracle":
        row.update(_fastest_of_oracle(case, settings, compare))
    else:
        try:
            fn = case.forward(item.method, item.config)
        except Exception as error:  # noqa: BLE001 - building a baseline may fail (OOM): record it
            return {**row, **failure(error)}
        row.update(
            measure(case.step(fn, item.pass_), case.device, settings, compare=compare, compiled=item.method in COMPILED)
        )
    if item.config is not None:
        row["schedule"] = row["config"]
    elif item.method in ("ours", "ours_compiled", "ours_recorded") and row["status"] == "ok":
        row["schedule"] = case.schedule(item.method)  # after the timed calls: what they ran
    row["strategy"] = row.get("schedule", "").split(":")[0]
    if reference is None and item.method != "pyg":
        row["note"] = "; ".join(filter(None, [row["note"], "unchecked: the PyG reference failed"]))
    return row


def _fastest_of_oracle(case: Case, settings: Settings, compare: Optional[Callable[[object], float]]) -> dict:
    """The ``oracle`` measurement of a case's forward pass: each of its :func:`oracle_schedules`
    timed as a ``sweep`` row is, the fastest that matches the reference kept (its ``schedule``)."""
    schedules = oracle_schedules(case.loaded.spec.name, case.spec.name, case.F, device_name(case.device))
    if not schedules:
        return {"status": "unavailable", "note": f"no exhaustive timings of this graph on this device in {ORACLE}"}
    timed = []
    for schedule in schedules:
        step = case.step(case.forward("oracle", schedule), "fwd")
        timed.append({**measure(step, case.device, settings, compare=compare), "schedule": schedule.serialize()})
    ok = [t for t in timed if t["status"] == "ok"]
    # GPU time where every timing has one (the CPU's rows have wall time alone); no match: the first.
    key = "gpu_ms" if all(not math.isnan(t["gpu_ms"]) for t in ok) else "time_ms"
    best = min(ok, key=lambda t: t[key]) if ok else timed[0]
    kept = f"fastest of the oracle's {len(schedules)} fastest schedules"
    best["note"] = "; ".join(filter(None, [best["note"], kept]))
    return best


def run(
    suite: str,
    specs: Sequence[GraphSpec],
    op_names: Sequence[str],
    features: Sequence[int],
    methods: Sequence[str],
    sweep_size: int,
    results: ResultsFile,
    budget: Budget,
    settings: Settings,
    device: torch.device,
    env: dict,
    backend: str,
) -> None:
    """Measure every planned item of every graph not already in ``results``; rows are written as
    they are measured. Once ``budget`` expires the rest is skipped, with a logged note."""
    items = plan(op_names, features, methods, sweep_size)
    todo = {
        spec: [i for i in items if not results.done({"suite": suite, "graph": spec.name, **i.columns()})]
        for spec in specs
    }
    skipped: Dict[str, int] = {}
    common = {"suite": suite, "dtype": "float32", **env}
    with tqdm(total=sum(map(len, todo.values())), desc=suite, mininterval=10, unit="meas") as bar:
        for spec, graph_items in todo.items():
            if not graph_items:
                continue
            if budget.expired:
                skipped[spec.name] = len(graph_items)
                continue
            try:
                loaded = spec.load(device)
            except Exception as error:  # noqa: BLE001 - a missing dataset must not end the run
                status = failure(error)
                if isinstance(error, FileNotFoundError):
                    status["status"] = "unavailable"
                results.write({**common, "graph": spec.name, "graph_kind": spec.kind, "method": "load", **status})
                bar.update(len(graph_items))
                free_memory(device)
                continue
            _run_graph(loaded, graph_items, common, results, budget, settings, device, backend, bar, skipped)
            del loaded
            torch._dynamo.reset()  # compiled code holds this graph's tensors and shapes
            free_memory(device)
    if skipped:
        log.warning(
            "time budget of %s s exhausted: %d %s measurements skipped (%s); rerun with --resume to measure them",
            budget.seconds,
            sum(skipped.values()),
            suite,
            ", ".join(f"{name}: {n}" for name, n in skipped.items()),
        )


def _run_graph(
    loaded: LoadedGraph,
    items: Iterable[Item],
    common: dict,
    results: ResultsFile,
    budget: Budget,
    settings: Settings,
    device: torch.device,
    backend: str,
    bar: tqdm,
    skipped: Dict[str, int],
) -> None:
    name = loaded.spec.name
    for (op_name, F), case_items in itertools.groupby(items, key=lambda i: (i.op, i.F)):
        case_items = list(case_items)
        if budget.expired:
            skipped[name] = skipped.get(name, 0) + len(case_items)
            continue
        try:
            case = Case(loaded, OPS[op_name], F, device, backend)
        except Exception as error:  # noqa: BLE001 - inputs of a huge case may not fit
            for item in case_items:
                results.write({**common, **loaded.columns(), **item.columns(), **failure(error)})
            bar.update(len(case_items))
            continue
        for item in case_items:
            if budget.expired:
                skipped[name] = skipped.get(name, 0) + 1
                continue
            results.write({**common, **loaded.columns(), **_measure_item(case, item, settings)})
            bar.update()
        del case
        free_memory(device)
