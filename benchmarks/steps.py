"""Training steps as PyG users run them: wall clock per step, host included.

For every graph, model (GCN, GAT, GATv2, GraphSAGE, GIN; two layers, default arguments: GCN
normalises at every call, GAT adds its self loops), implementation (PyG's layers, ours; in eager
and recorded steps also ``no-graph``, the same model without its graph operators
(:mod:`benchmarks.graph_free`): the floor of such a step, whatever implements the operators) and
way of running the step, a row of ``steps.csv`` holds the median wall-clock time of one training
step (forward, loss, backward, Adam) over ``--repeats`` runs of ``--steps`` steps, warm-up
excluded, with the host's time in it (the clock is read after ``torch.cuda.synchronize``). Modes:

* ``eager``;
* ``compiled``: ``torch.compile(model)`` (mini-batches: ``dynamic=True``);
* ``reduce-overhead``: ``torch.compile(model, mode="reduce-overhead")`` (full batch);
* ``compiled-layers-eager`` (not run by default): ``torch.compile(model)`` with each
  message-passing layer's ``forward`` left out of the compiled graph (``torch.compiler.disable``),
  which tells what compiling costs a model apart from its layers' graph operators;
* ``recorded``: the whole step recorded once with :class:`pyg_ugrapher.RecordedStep`
  (``torch.cuda.graph``, Adam with ``capturable=True``) and replayed; on mini-batches every batch
  is padded to a size bucket (:func:`pyg_ugrapher.pad_to_bucket`), one recording per bucket.

Full batch trains on the whole graph at every step; ``minibatch`` on the parts of PyG's
``RandomNodeLoader`` (``--parts``, a new induced subgraph every step; the parts are made before
timing and moved to the GPU inside the step). PyG's and our implementation of a case are timed in
alternating rounds (:func:`run_pair`). Features are random (``--features``), labels the dataset's
where it has node labels, the loss a weighted sum over the training nodes (no boolean indexing:
the same step is recordable). ``host_syncs`` counts the synchronising CUDA calls of one
eager step on a graph already seen (``torch.cuda.set_sync_debug_mode``). What an eager step costs
the host is counted beside its time: ``python_calls``, the Python function calls of one step
(``cProfile``; builtins and methods of C types included), and with ``--count-kernels`` on a GPU
``kernels``, the GPU kernels and memory operations one step launches (``torch.profiler``, which
slows every later launch of the process: the times of such a run are not comparable).

    python -m benchmarks.steps --datasets cora pubmed --models gcn sage
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
import torch_geometric.nn
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.loader import RandomNodeLoader
from torch_geometric.nn import MessagePassing
from tqdm import tqdm

import pyg_ugrapher.nn
from autotune.timing import wall_ms as call_ms
from pyg_ugrapher import RecordedStep, pad_to_bucket
from pyg_ugrapher.datasets import load_dataset

from . import graph_free
from .report import plot
from .rows import ResultsFile, default_out, environment
from .timing import failure, synchronize
from .train_e2e import MODELS, build_model

IMPLEMENTATIONS = {"pyg": torch_geometric.nn, "ours": pyg_ugrapher.nn, "no-graph": graph_free}
#: The modes each floor of a step (:mod:`benchmarks.graph_free`) is timed in: an eager step, and a
#: recorded one, whose replay has no host time left to bound.
FLOOR_MODES = {"no-graph": ("eager", "recorded")}
FULL_MODES = ("eager", "compiled", "reduce-overhead", "recorded", "compiled-layers-eager")
MINIBATCH_MODES = ("eager", "compiled", "recorded", "compiled-layers-eager")
#: The modes a run times unless ``--modes`` names others.
DEFAULT_MODES = ("eager", "compiled", "reduce-overhead", "recorded")
DATASETS = ("cora", "pubmed", "tolokers", "coauthor-physics", "github", "amazon-computers", "collab")
#: Steps before timing: compilation, recording, the layers' caches.
WARMUP_STEPS = 5


@dataclass
class Problem:
    """Node classification on one graph: features, labels, loss weights (1/|train| on the
    training nodes, 0 elsewhere)."""

    name: str
    data: Data  #: x, edge_index, y, weight (on the host)
    num_classes: int


def make_problem(name: str, features: int, seed: int) -> Problem:
    data = load_dataset(name)
    generator = torch.Generator().manual_seed(seed)
    num_nodes = data.num_nodes
    y = getattr(data, "y", None)
    if y is None or y.dim() != 1 or y.size(0) != num_nodes:
        y = torch.randint(0, 10, (num_nodes,), generator=generator)
    train = getattr(data, "train_mask", None)
    if train is None or train.size(0) != num_nodes:
        train = torch.rand(num_nodes, generator=generator) < 0.6
    elif train.dim() == 2:  # several splits: the first
        train = train[:, 0]
    weight = train.float() / max(int(train.sum()), 1)
    x = torch.randn(num_nodes, features, generator=generator)
    problem = Data(x=x, edge_index=data.edge_index, y=y.long(), weight=weight, num_nodes=num_nodes)
    return Problem(name, problem, int(y.max()) + 1)


def minibatches(problem: Problem, parts: int, seed: int) -> List[Data]:
    """One epoch of PyG's ``RandomNodeLoader``: ``parts`` induced subgraphs (loss weights
    renormalised to each part's training nodes)."""
    torch.manual_seed(seed)
    batches = []
    for batch in RandomNodeLoader(problem.data, num_parts=parts, shuffle=True):
        train = batch.weight > 0
        batch.weight = train.float() / max(int(train.sum()), 1)
        batches.append(batch)
    return batches


def loss_of(out: Tensor, y: Tensor, weight: Tensor) -> Tensor:
    return (F.cross_entropy(out, y, reduction="none") * weight).sum()


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., Tensor]:
    def step(x: Tensor, edge_index: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model(x, edge_index), y, weight)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def wall_ms(run: Callable[[], object], steps: int, repeats: int, device: torch.device) -> List[float]:
    """Wall-clock ms per step of ``repeats`` runs of ``steps`` calls: the project's timer around a
    whole run, so that steps queue on the GPU as in a training loop and only a run ends in a sync."""

    def run_steps() -> None:
        for _ in range(steps):
            run()

    return [ms / steps for ms in call_ms(run_steps, warmup=0, reps=repeats, device=device)]


def count_syncs(run: Callable[[], object], device: torch.device) -> Optional[int]:
    """Synchronising CUDA calls of one ``run()`` (``None`` on a CPU)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def count_python_calls(run: Callable[[], object], steps: int = 3) -> float:
    """Python function calls per ``run()`` (mean of ``steps`` runs), C functions called from Python
    included: what the host executes per step besides the kernels' own launch code."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        for _ in range(steps):
            run()
    finally:
        profile.disable()
    # The profiler counts its own disable() call too.
    return (pstats.Stats(profile).total_calls - 1) / steps


def count_kernels(run: Callable[[], object], device: torch.device, steps: int = 3) -> Optional[float]:
    """GPU kernels and memory operations (copies, fills) per ``run()`` (``None`` on a CPU)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            run()
        synchronize(device)
    events = profiler.key_averages()
    return sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / steps


class Case:
    """One (problem, model, implementation, mode, batching) to time."""

    def __init__(self, problem: Problem, model_name: str, impl: str, mode: str, batching: str, args) -> None:
        self.mode, self.batching, self.device = mode, batching, torch.device(args.device)
        torch.manual_seed(args.seed)
        # PyG's model first: ours loads its weights, so both start equal.
        reference = build_model(model_name, torch_geometric.nn, args.features, args.hidden, problem.num_classes, False)
        model = build_model(model_name, IMPLEMENTATIONS[impl], args.features, args.hidden, problem.num_classes, False)
        if impl not in FLOOR_MODES:  # the floor's stand-ins have parameters of their own
            model.load_state_dict(reference.state_dict())
        model = model.to(self.device)
        if mode == "compiled-layers-eager":
            for module in model.modules():
                if isinstance(module, MessagePassing):
                    module.forward = torch.compiler.disable(module.forward)
        if mode in ("compiled", "compiled-layers-eager"):
            model = torch.compile(model, dynamic=True if batching == "minibatch" else None)
        elif mode == "reduce-overhead":
            model = torch.compile(model, mode="reduce-overhead")
        self.model = model
        recorded = mode == "recorded"
        step = make_step(model, torch.optim.Adam(model.parameters(), lr=0.01, capturable=recorded))
        self.step = RecordedStep(step) if recorded else step
        if batching == "full":
            data = problem.data.clone().to(self.device)  # Data.to moves in place
            batches = [(data.x, data.edge_index, data.y, data.weight)]
        else:
            batches = [(b.x, b.edge_index, b.y, b.weight) for b in minibatches(problem, args.parts, args.seed)]
        self._next = itertools.cycle(batches)
        # Each case draws its dropout masks from a stream of its own, as if it ran alone, so that
        # PyG's and our losses stay comparable when their steps alternate (run_pair). A recording
        # (ours, or the CUDA graphs of mode="reduce-overhead") keeps its generator's state in the
        # graph: its CUDA generator is left alone.
        recording = mode in ("recorded", "reduce-overhead")
        self._streams = [self.device] if self.device.type == "cuda" and not recording else []
        self._rng = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in self._streams])

    @contextmanager
    def own_rng(self) -> Iterator[None]:
        """The block draws random numbers from this case's own stream."""
        with torch.random.fork_rng(devices=self._streams):
            torch.set_rng_state(self._rng[0])
            for device, state in zip(self._streams, self._rng[1]):
                torch.cuda.set_rng_state(state, device)
            yield
            self._rng = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in self._streams])

    def inputs(self) -> Sequence[Tensor]:
        tensors = next(self._next)
        if self.batching == "minibatch":
            tensors = [t.to(self.device, non_blocking=True) for t in tensors]
            if self.mode == "recorded":
                tensors = pad_to_bucket(*tensors)
        return tensors

    def run(self) -> Tensor:
        return self.step(*self.inputs())


def _prepared(case: Case, row: Dict) -> None:
    """Warm-up steps, then the host synchronisations of one eager step."""
    with case.own_rng():
        for _ in range(WARMUP_STEPS):
            case.run()
        synchronize(case.device)
        if case.mode == "eager":
            row["host_syncs"] = count_syncs(case.run, case.device)


def _finished(case: Case, times: List[float], row: Dict, args) -> None:
    """The row's times, final loss and host counts (counted after the timing: a profiler slows the
    calls it watches)."""
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    with case.own_rng():
        final_loss = float(case.run())
    row.update(
        step_ms=statistics.median(times),
        step_ms_iqr=quartiles[2] - quartiles[0],
        steps=args.steps * len(times),
        final_loss=final_loss,
    )
    if case.mode == "eager":
        row["python_calls"] = count_python_calls(case.run)
        if args.count_kernels:
            row["kernels"] = count_kernels(case.run, case.device)
    if isinstance(case.step, RecordedStep):
        row["recordings"] = case.step.num_recordings


def run_pair(build: Callable[[str], Case], rows: Dict[str, Dict], args) -> None:
    """Time the implementations of one case (``build(impl)`` makes each) in alternating rounds: one
    run of ``--steps`` steps of each per round, the order reversed every round, so that a change of
    the host's pace during the case (machines drift by tens of percent within minutes) reaches
    every implementation alike. ``rows`` (one per implementation) get the results, or a failure's
    status and note; an implementation that fails leaves the others running."""
    live: Dict[str, Case] = {}
    for impl, row in rows.items():
        try:
            live[impl] = build(impl)
            _prepared(live[impl], row)
        except Exception as error:  # a case that fails is a row saying why
            row.update(failure(error))
            live.pop(impl, None)
    times: Dict[str, List[float]] = {impl: [] for impl in live}
    for round_ in range(args.repeats):
        for impl in list(live) if round_ % 2 == 0 else list(live)[::-1]:
            try:
                with live[impl].own_rng():
                    times[impl] += wall_ms(live[impl].run, args.steps, 1, live[impl].device)
            except Exception as error:
                rows[impl].update(failure(error))
                del live[impl]
    for impl, case in live.items():
        try:
            _finished(case, times[impl], rows[impl], args)
            rows[impl]["status"] = "ok"
        except Exception as error:
            rows[impl].update(failure(error))


def implementations(mode: str) -> List[str]:
    """The implementations a case of ``mode`` times: every one, a floor only in its
    :data:`FLOOR_MODES`."""
    return [impl for impl in IMPLEMENTATIONS if mode in FLOOR_MODES.get(impl, (mode,))]


def cases(args) -> Iterator[tuple]:
    """``(dataset, batching, model, mode)`` of every case to time, each for every implementation."""
    for dataset in args.datasets:
        for batching in args.batching:
            for model in args.models:
                for mode in FULL_MODES if batching == "full" else MINIBATCH_MODES:
                    if mode not in args.modes or (mode == "recorded" and args.device == "cpu"):
                        continue
                    yield dataset, batching, model, mode


def run(args) -> pd.DataFrame:
    device = torch.device(args.device)
    results = ResultsFile(args.out / "steps.csv", kind="steps")
    todo = list(cases(args))
    problems: Dict[str, Problem] = {}
    written = []
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    for dataset, batching, model, mode in tqdm(todo, desc="steps", unit="case"):
        if deadline is not None and time.monotonic() > deadline:
            break
        if dataset not in problems:
            problems.clear()
            problems[dataset] = make_problem(dataset, args.features, args.seed)
        problem = problems[dataset]
        rows = {
            impl: {
                **environment(device),
                "dataset": dataset,
                "model": model,
                "impl": impl,
                "mode": mode,
                "batching": batching,
                "num_nodes": problem.data.num_nodes,
                "num_edges": problem.data.edge_index.size(1),
                "features": args.features,
                "hidden": args.hidden,
            }
            for impl in implementations(mode)
        }
        run_pair(lambda impl: Case(problem, model, impl, mode, batching, args), rows, args)
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for impl, row in rows.items():
            written.append(results.write(row))
            outcome = row.get("note")
            if row.get("status") == "ok":
                outcome = (
                    f"{row['step_ms']:.3f} ms, syncs {row.get('host_syncs')}, "
                    f"Python calls {row.get('python_calls')}, kernels {row.get('kernels')}"
                )
            tqdm.write(f"{dataset:>16} {batching:>9} {model:>4} {impl:>4} {mode:>15}: {outcome}")
    plot(results.path)
    return pd.DataFrame(written)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--modes", nargs="+", choices=FULL_MODES, default=list(DEFAULT_MODES))
    parser.add_argument("--batching", nargs="+", choices=("full", "minibatch"), default=["full", "minibatch"])
    parser.add_argument("--parts", type=int, default=16, help="mini-batches: RandomNodeLoader's num_parts")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--count-kernels",
        action="store_true",
        help="count the GPU kernels of eager steps (torch.profiler: it stays attached to the process and "
        "slows the launches of every later case, so use a run with it for counts, not times)",
    )
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; later cases are skipped")
    parser.add_argument("--out", type=Path, default=None, help="folder of steps.csv")
    args = parser.parse_args(argv)
    for name in ("parts", "features", "hidden", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be positive")
    args.out = args.out or default_out(torch.device(args.device))
    return args


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
