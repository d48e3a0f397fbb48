"""Training on several GPUs: data-parallel mini-batches (DDP) and a partitioned graph, full batch.

Written for any number of processes: ``torchrun --nproc_per_node=K`` starts K ranks (NCCL, one GPU
each); every case runs on all of them and rank 0 appends one row per case to
``<out>/distributed.csv`` (default ``benchmarks/results/<gpu>/``) and redraws its plot::

    torchrun --nproc_per_node=2 -m benchmarks.distributed --graphs collab power_law-2e7 --models gcn sage
    python -m benchmarks.distributed --quick        # CPU, gloo, 2 processes spawned, a tiny graph

Modes:

* ``ddp``: every rank holds the graph and a replica of a two-layer model of our layers inside
  ``DistributedDataParallel``, and trains on mini-batches sampled around its own shard of the
  training vertices (:func:`pyg_ugrapher.distributed.sample_batches`, each epoch's batches sampled
  before it is timed and freed after it). ``edges_per_s``: sampled edges of all ranks per second.
  On several ranks, rank 0 also trains a replica of its own alone (``--one-rank-baseline``, on by
  default), in epochs alternating with those of all ranks: its row has ``world_size`` 1 and
  ``launch_ranks`` K, and the ranks' row's ``scaling`` is their ``edges_per_s`` over its, timed
  under the same host conditions (separate launches differ by more than that ratio does from K).
  ``--compile-modes`` adds ``torch.compile``d (``default``) and recorded (``reduce-overhead``,
  CUDA graphs) runs; recorded runs pad every batch to bucket sizes (``pad_to_bucket``), so a
  handful of recordings serve every batch.
* ``partitioned``: the vertices split into one part per rank (``--partition``); a rank makes and
  holds only its part's features and incoming edges, the features' halo rows fetched once, each
  later layer exchanges its halo rows (``all_to_all_single``), gradients are summed over the
  ranks. ``edges_per_s``: the whole graph's edges per second of epoch time.
  ``halo_mib_per_layer`` and ``comm_ms_per_layer`` are the forward halo (received by the busiest
  rank) and the time of the exchanges, forward and backward, of an epoch per layer;
  ``compute_ms`` is the epoch's time outside the exchanges.

Every time is the slowest rank's median over the timed epochs (the first ``--warmup`` epochs, which
build structures and decide schedules, not counted); ``peak_mib`` the largest peak of GPU memory
on one rank (DDP: in the replica's training epochs, its batches sampled before; partitioned: the
whole case). Graphs: ``collab`` (from the shared datasets), ``cora``, and ``power_law-<edges>``
(:func:`pyg_ugrapher.datasets.power_law_graph`, mean degree 20, e.g. ``power_law-2e8``), with
random features and labels. Each case runs with what existed before it frozen out of the garbage
collector's reach (:func:`frozen_heap`, ``gc_frozen`` 1; ``--no-gc-freeze`` leaves it, 0), as a
training loop on several GPUs should: otherwise a full collection pauses a rank for hundreds of
ms, and DDP pauses every rank with it.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from pyg_ugrapher import nn as ug_nn
from pyg_ugrapher import pad_to_bucket
from pyg_ugrapher.datasets import load_dataset, power_law_graph
from pyg_ugrapher.distributed import (
    DistributedGraph,
    MiniBatch,
    Worker,
    all_reduce_gradients,
    cpu_start_method,
    init_from_env,
    layer_forward,
    partition_graph,
    record_exchanges,
    sample_batches,
    spawn,
    with_halo,
)

from .report import plot
from .rows import ResultsFile, default_out, environment

MODES = ("ddp", "partitioned")
MODELS = ("gcn", "sage", "gat")
#: The models run unless ``--models`` names others.
DEFAULT_MODELS = ("gcn", "sage")
#: Attention heads of the GAT model's first layer (each ``hidden / GAT_HEADS`` wide, concatenated).
GAT_HEADS = 4
COMPILE_MODES = ("eager", "default", "reduce-overhead")
POWER_LAW = "power_law"
#: Mean degree of the synthetic power-law graphs.
POWER_LAW_DEGREE = 20
NUM_CLASSES = 16
TRAIN_FRACTION = 0.6
#: The columns of a row printed as it is written.
PRINTED = (
    "mode",
    "graph",
    "model",
    "compile_mode",
    "world_size",
    "launch_ranks",
    "epoch_ms",
    "edges_per_s",
    "scaling",
    "comm_ms",
    "status",
)
QUICK = dict(
    graphs=["power_law-20000"],
    features=16,
    hidden=16,
    epochs=2,
    warmup=1,
    batch_size=64,
    num_neighbors=[5, 5],
    max_steps=3,
    compile_modes=["eager"],
    world_size=2,
)


class Net(nn.Module):
    """Two layers of ``pyg_ugrapher.nn`` with a ReLU between them."""

    def __init__(self, model: str, features: int, hidden: int) -> None:
        super().__init__()
        if model == "gcn":
            self.conv1, self.conv2 = ug_nn.GCNConv(features, hidden), ug_nn.GCNConv(hidden, NUM_CLASSES)
        elif model == "gat":
            self.conv1 = ug_nn.GATConv(features, hidden // GAT_HEADS, heads=GAT_HEADS)
            self.conv2 = ug_nn.GATConv(hidden // GAT_HEADS * GAT_HEADS, NUM_CLASSES)
        else:
            self.conv1, self.conv2 = ug_nn.SAGEConv(features, hidden), ug_nn.SAGEConv(hidden, NUM_CLASSES)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def forward_partitioned(self, x: Tensor, graph: DistributedGraph) -> Tensor:
        return layer_forward(self.conv2, layer_forward(self.conv1, x, graph).relu(), graph)


@dataclass
class Graph:
    """A whole graph's edges (in host memory) and its size."""

    name: str
    edge_index: Tensor
    num_nodes: int


def load_graph(name: str, device: torch.device, seed: int) -> Graph:
    """``collab``/``cora`` from :func:`load_dataset`, or ``power_law-<edges>`` generated on
    ``device`` (the same graph on every rank: same seed, same device type), kept in host memory."""
    if name.startswith(POWER_LAW + "-"):
        num_edges = edge_count(name)
        num_nodes = max(num_edges // POWER_LAW_DEGREE, 2)
        return Graph(name, power_law_graph(num_nodes, num_edges, seed=seed, device=device).cpu(), num_nodes)
    data = load_dataset(name)
    return Graph(name, data.edge_index, data.num_nodes)


def edge_count(name: str) -> int:
    """The edges of ``power_law-<edges>`` (``2e8``, ``20000000``, ``20M``)."""
    text = name[len(POWER_LAW) + 1 :]
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(text[-1:].lower(), 1)
    try:
        value = float(text[:-1] if scale != 1 else text) * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"graph: {name!r} needs a whole number of edges, e.g. power_law-2e8")
    return int(value)


@dataclass
class Task:
    """Random features, labels and training vertices of ``num_nodes`` vertices."""

    x: Tensor
    y: Tensor
    train: Tensor

    @classmethod
    def random(cls, num_nodes: int, features: int, seed: int, device: torch.device) -> "Task":
        generator = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(num_nodes, features, generator=generator, device=device)
        y = torch.randint(0, NUM_CLASSES, (num_nodes,), generator=generator, device=device)
        train = torch.rand(num_nodes, generator=generator, device=device) < TRAIN_FRACTION
        return cls(x, y, train)


# -- timing ------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(values: Sequence[float], device: torch.device) -> List[float]:
    """Every value's maximum over the ranks."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _total(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def _epoch_ms(run_epoch, device: torch.device, barrier: bool = True) -> float:
    if barrier:
        dist.barrier()
    _sync(device)
    start = time.perf_counter()
    run_epoch()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


@dataclass
class EpochRun:
    """One timed epoch of a DDP replica: its time, the edges of its batches, its steps, and the
    peak of GPU memory during it (MiB; 0 on a CPU)."""

    ms: float
    edges: int
    steps: int
    peak_mib: float


def ddp_trainer(
    graph: Graph,
    task: Task,
    model_name: str,
    compile_mode: str,
    args: argparse.Namespace,
    device: torch.device,
    group: Optional[dist.ProcessGroup] = None,
    shard: Optional[Tuple[int, int]] = None,
) -> Tuple[Callable[[int, bool], EpochRun], List[Tensor]]:
    """A replica of the model in ``DistributedDataParallel`` over ``group`` (default: every rank)
    training on the batches of its seed shard ``(rank, world_size)`` (default: the rank's own), and
    its losses. The returned function trains one epoch and times it; each epoch's batches are
    sampled just before it and freed after it, as a training loop holds its batches (every batch
    held to the end keeps its graph's structures alive, and the allocator then asks the driver for
    new memory in every step)."""
    edge_index = graph.edge_index
    train_nodes = task.train.nonzero().flatten()
    rank, world_size = shard if shard is not None else (None, None)
    torch.manual_seed(args.seed)
    model = Net(model_name, args.features, args.hidden).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None, process_group=group)
    forward = ddp if compile_mode == "eager" else torch.compile(ddp, mode=compile_mode, dynamic=True)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    losses: List[Tensor] = []

    def run_epoch(batches: List[MiniBatch]) -> None:
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            x, edges = task.x[batch.node_ids], batch.edge_index
            if compile_mode == "reduce-overhead":
                # A handful of bucket sizes, each recorded once, serve every batch (the seeds stay
                # the first rows; the padded nodes come after every real one).
                x, edges = pad_to_bucket(x, edges)
            out = forward(x, edges)[: batch.num_seeds]
            loss = F.cross_entropy(out, task.y[batch.node_ids[: batch.num_seeds]])
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())

    def train(epoch: int, barrier: bool) -> EpochRun:
        sampled = sample_batches(
            edge_index,
            graph.num_nodes,
            train_nodes,
            args.batch_size,
            args.num_neighbors,
            epoch,
            rank=rank,
            world_size=world_size,
            seed=args.seed,
        )
        batches = list(itertools.islice(sampled, args.max_steps))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ms = _epoch_ms(partial(run_epoch, batches), device, barrier)
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        return EpochRun(ms, sum(b.edge_index.size(1) for b in batches), len(batches), peak_mib)

    return train, losses


def _ddp_result(
    runs: List[EpochRun], losses: List[Tensor], graph: Graph, args: argparse.Namespace, device: torch.device
) -> Dict:
    """The row of one replica's timed epochs (``runs`` empty on the ranks that did not train it):
    the slowest rank's median epoch, all ranks' edges, the largest peak of memory in its epochs
    (with the other replica's parameters resident, its batches freed)."""
    timed = runs[args.warmup :]
    epoch_ms = statistics.median(r.ms for r in timed) if timed else 0.0
    peak = max((r.peak_mib for r in runs), default=0.0)
    epoch_ms, peak = _slowest([epoch_ms, peak], device)
    edges = _total(sum(r.edges for r in timed) / args.epochs if timed else 0.0, device)
    steps = int(_slowest([timed[-1].steps if timed else 0], device)[0])
    measured = {"peak_mib": peak} if device.type == "cuda" else {}
    return {
        **measured,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.edge_index.size(1),
        "batch_size": args.batch_size,
        "steps": steps,
        "epoch_ms": epoch_ms,
        "step_ms": epoch_ms / max(steps, 1),
        "edges_per_s": edges / (epoch_ms / 1e3),
        "final_loss": float(losses[-1]) if losses else math.nan,
    }


def ddp_case(worker: Worker, graph: Graph, model_name: str, compile_mode: str, args: argparse.Namespace) -> List[Dict]:
    """The row of the DDP case on every rank; with ``--one-rank-baseline`` on several ranks, first
    the row of one rank training alone (rank 0, a replica of its own over a group of one, the whole
    training set as its shard) in epochs alternating with those of all ranks, in the same
    processes: ``scaling`` compares the two under the same host conditions, which differ by more
    between launches than the scaling does from its ideal."""
    device = worker.device
    graph = Graph(graph.name, graph.edge_index.to(device), graph.num_nodes)
    task = Task.random(graph.num_nodes, args.features, args.seed, device)
    train_all, losses_all = ddp_trainer(graph, task, model_name, compile_mode, args, device)
    baseline = args.one_rank_baseline and worker.world_size > 1
    # Every rank makes the group (new_group is collective); rank 0 alone trains in it.
    solo_group = dist.new_group([0]) if baseline else None
    train_one, losses_one = (None, [])
    if baseline and worker.rank == 0:
        train_one, losses_one = ddp_trainer(graph, task, model_name, compile_mode, args, device, solo_group, (0, 1))
    runs_all: List[EpochRun] = []
    runs_one: List[EpochRun] = []
    for epoch in range(args.warmup + args.epochs):
        # The order alternates, so that neither replica always runs on the other's heels.
        for part in ("all", "one") if epoch % 2 == 0 else ("one", "all"):
            if part == "all":
                runs_all.append(train_all(epoch, True))
            elif baseline:
                if train_one is not None:
                    runs_one.append(train_one(epoch, False))
                dist.barrier()  # the other ranks wait for rank 0's epoch alone
    row = {**_ddp_result(runs_all, losses_all, graph, args, device), "launch_ranks": worker.world_size}
    if not baseline:
        return [row]
    alone = _ddp_result(runs_one, losses_one, graph, args, device)
    alone.update(world_size=1, launch_ranks=worker.world_size)
    row["scaling"] = row["edges_per_s"] / alone["edges_per_s"]
    return [alone, row]


def partitioned_case(worker: Worker, graph: Graph, model_name: str, args: argparse.Namespace) -> Dict:
    device = worker.device
    edge_index = graph.edge_index.to(device)
    num_edges = edge_index.size(1)
    partition = partition_graph(edge_index, graph.num_nodes, worker.world_size, args.partition, seed=args.seed)
    shard = DistributedGraph.from_partition(edge_index, partition, device=device)
    # Only this rank's share of the edges stays on its device.
    del edge_index
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # Features and labels of this rank's vertices only, made here. The features need no gradient:
    # their halo is fetched once, so the first layer exchanges nothing in an epoch.
    task = Task.random(shard.num_local, args.features, args.seed * 1009 + worker.rank, device)
    x, y, train = with_halo(task.x, shard.plan), task.y, task.train
    num_train = _total(float(train.sum()), device)
    torch.manual_seed(args.seed)
    model = Net(model_name, args.features, args.hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses: List[Tensor] = []

    def run_epoch() -> None:
        optimizer.zero_grad(set_to_none=True)
        out = model.forward_partitioned(x, shard)
        loss = F.cross_entropy(out[train], y[train], reduction="sum") / num_train
        loss.backward()
        all_reduce_gradients(model)
        optimizer.step()
        losses.append(loss.detach())

    times, comm, halo_bytes = [], [], []
    for _ in range(args.warmup + args.epochs):
        with record_exchanges() as exchanges:
            times.append(_epoch_ms(run_epoch, device))
        comm.append(sum(e.elapsed_ms() for e in exchanges))
        halo_bytes = [e.bytes_received for e in exchanges if e.direction == "forward"]
    layers = 2
    epoch_ms = statistics.median(times[args.warmup :])
    comm_ms = statistics.median(comm[args.warmup :])
    # ``halo_bytes`` is of the last epoch: the normalisation's degree exchange happens in the first.
    halo_mib = sum(halo_bytes) / layers / 2**20
    epoch_ms, comm_ms, compute_ms, halo_mib, halo_rows = _slowest(
        [epoch_ms, comm_ms, epoch_ms - comm_ms, halo_mib, shard.num_halo], device
    )
    return {
        "num_nodes": graph.num_nodes,
        "num_edges": num_edges,
        "steps": 1,
        "epoch_ms": epoch_ms,
        "step_ms": epoch_ms,
        "edges_per_s": num_edges / (epoch_ms / 1e3),
        "comm_ms": comm_ms,
        "compute_ms": compute_ms,
        "halo_rows": int(halo_rows),
        "halo_mib_per_layer": halo_mib,
        "comm_ms_per_layer": comm_ms / layers,
        "cut_fraction": partition.cut_edges / max(num_edges, 1),
        "partition": partition.method,
        "final_loss": float(losses[-1]),
    }


# -- running the cases -------------------------------------------------------------------------------
def cases(args: argparse.Namespace):
    """``(graph, mode, model, compile_mode)`` in order; compile modes apply to DDP only, the
    ``--partitioned-graphs`` to the partitioned mode only."""
    for name in args.graphs + args.partitioned_graphs:
        for mode in args.modes:
            if mode == "ddp" and name not in args.graphs:
                continue
            for model in args.models:
                for compile_mode in args.compile_modes if mode == "ddp" else ["eager"]:
                    yield name, mode, model, compile_mode


@contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[None]:
    """Inside the block, every object that exists at its start is out of the garbage collector's
    reach (``gc.freeze``), so a full collection walks only what the block allocates. Otherwise a
    rank's full collection walks every object of the process (torch, PyG, compiled code), pausing
    it for hundreds of ms; with DDP every other rank then waits at the next all-reduce, so each
    rank's pauses are everyone's, and K ranks pause K times as often as one.

    The block ends by unfreezing the heap, unless objects were already frozen when it began:
    ``gc.unfreeze`` would release those too, against the wishes of whoever froze them, so then
    what the block froze stays frozen with them."""
    if not enabled:
        yield
        return
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def run(worker: Worker, args: argparse.Namespace) -> List[Dict]:
    """Every case on every rank; rank 0 appends the rows (and returns them)."""
    device = worker.device
    results = ResultsFile(args.out / "distributed.csv", kind="distributed") if worker.rank == 0 else None
    rows: List[Dict] = []
    loaded: Optional[Graph] = None
    for name, mode, model, compile_mode in cases(args):
        row = {
            **environment(device),
            "mode": mode,
            "graph": name,
            "model": model,
            "compile_mode": compile_mode,
            "world_size": worker.world_size,
            "launch_ranks": worker.world_size,
            # The machine: its GPUs (whatever the launch uses) and CPU cores.
            "host_gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
            "host_cpus": os.cpu_count(),
            "gc_frozen": int(args.gc_freeze),
            "features": args.features,
            "hidden": args.hidden,
            "epochs": args.epochs,
        }
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        results_of_case = [row]
        try:
            if loaded is None or loaded.name != name:
                loaded = None  # the previous graph's memory is free before the next one loads
                loaded = load_graph(name, device, args.seed)
            with frozen_heap(args.gc_freeze):
                if mode == "ddp":
                    measured = ddp_case(worker, loaded, model, compile_mode, args)
                else:
                    measured = [partitioned_case(worker, loaded, model, args)]
            results_of_case = [{**row, **values, "status": "ok"} for values in measured]
        except Exception as error:
            # A failure every rank meets (out of memory, a compile error) becomes the row's status;
            # one that a single rank meets stops the run at the next collective.
            status = "oom" if isinstance(error, torch.OutOfMemoryError) else "error"
            row.update(status=status, note=f"{type(error).__name__}: {error}".splitlines()[0][:200])
        if device.type == "cuda":
            peak_mib = _slowest([torch.cuda.max_memory_allocated(device) / 2**20], device)[0]
            for result in results_of_case:
                result.setdefault("peak_mib", peak_mib)  # a DDP replica's own peak where measured
            torch.cuda.empty_cache()
        torch._dynamo.reset()
        if results is not None:
            for result in results_of_case:
                rows.append(results.write(result))
                print(" ".join(f"{k}={result.get(k)}" for k in PRINTED), flush=True)
            plot(results.path)  # after every case: a run cut short keeps its plot too
    return rows


def _spawned(worker: Worker, args: argparse.Namespace) -> None:
    """One CPU process: the reference executor runs its graph operators (never Triton's interpreter)."""
    os.environ["TRITON_INTERPRET"] = "0"
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // worker.world_size))
    run(worker, args)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.distributed",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--graphs",
        nargs="+",
        default=["collab", "power_law-2e7"],
        help="collab, cora, power_law-<edges> (e.g. power_law-2e8)",
    )
    parser.add_argument(
        "--partitioned-graphs",
        nargs="+",
        default=[],
        help="more graphs, partitioned mode only (sampling mini-batches from the whole edge "
        "list of a 1e8-edge graph is the sampler's benchmark, not this one's)",
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(DEFAULT_MODELS))
    parser.add_argument(
        "--compile-modes",
        nargs="+",
        choices=COMPILE_MODES,
        default=["eager"],
        help="DDP runs: eager, torch.compile (default) and recorded steps (reduce-overhead)",
    )
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="epochs before the timed ones (two: a weight read again, such as GCN's normalisation, is "
        "decided again in its second call)",
    )
    parser.add_argument("--batch-size", type=int, default=1024, help="DDP: seeds per batch and rank")
    parser.add_argument("--num-neighbors", type=int, nargs="+", default=[10, 10], help="DDP: edges per vertex, hop")
    parser.add_argument("--max-steps", type=int, default=50, help="DDP: batches per epoch and rank at most")
    parser.add_argument(
        "--one-rank-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="DDP on several ranks: also time one rank training alone, in epochs alternating with all "
        "ranks' in the same launch (a world_size 1 row and the ranks' row's scaling column)",
    )
    parser.add_argument(
        "--partition",
        default="contiguous",
        choices=["auto", "metis", "contiguous", "random"],
        help="partitioned: how the vertices are split",
    )
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="gc.freeze() what exists before each case (frozen_heap): no full collection of every "
        "object pauses a rank, and every rank with it, in the middle of an epoch",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="under torchrun: CPU threads of every rank")
    parser.add_argument(
        "--world-size", type=int, default=None, help="without torchrun: spawn this many CPU processes (gloo)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny power-law graph, 2 CPU processes, small widths: a check in under a minute",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder of distributed.csv (default: benchmarks/results/<gpu>/)"
    )
    args = parser.parse_args(argv)
    if args.quick:  # its sizes, where the command line left the defaults
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    for name in args.graphs + args.partitioned_graphs:
        if name.startswith(POWER_LAW + "-"):
            try:
                edge_count(name)
            except ValueError as error:
                parser.error(f"--graphs: {error}")
        elif name not in ("collab", "cora"):
            parser.error(f"--graphs: unknown {name!r}; expected collab, cora or power_law-<edges>")
    for name in ("features", "hidden", "epochs", "batch_size", "max_steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be positive")
    if args.warmup < 0:
        parser.error("--warmup: must be 0 or more")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if dist.is_torchelastic_launched():
        worker = init_from_env()
        # torchrun gives several processes one thread each and a single one all the cores; every
        # world size gets the same, so that only the number of ranks differs.
        torch.set_num_threads(args.threads)
        args.out = args.out or default_out(worker.device)
        try:
            run(worker, args)
        finally:
            dist.destroy_process_group()
        return
    args.out = args.out or default_out(torch.device("cpu"))
    spawn(
        _spawned,
        args.world_size or 1,
        (args,),
        backend="gloo",
        start_method=cpu_start_method(),
        preload=["pyg_ugrapher.distributed", "benchmarks.report"],
    )


if __name__ == "__main__":
    main()
