"""End-to-end training: GCN, GAT, GATv2, GraphSAGE and GIN built from our layers and from PyG's.

For every (dataset, model) both implementations start from the same weights (ours loads the PyG
model's ``state_dict``) and the same seed, train full-batch node classification for ``--epochs``
epochs, and are compared on test accuracy and mean epoch time (forward + backward + optimizer
step; CUDA events on a GPU, the first epoch not counted: it builds the graph caches and compiles
kernels). Results are printed side by side, appended to ``<out>/train_e2e.csv`` (default
``benchmarks/results/<gpu>/``, :mod:`benchmarks.rows`) and ``<out>/train_e2e.png`` is drawn from
the newest row of each case in that file.

    python -m benchmarks.train_e2e --datasets cora --epochs 200 --device cpu

``--batch-size B --num-neighbors 10 10`` trains on mini-batches instead, as with PyG's
``NeighborLoader``: every step samples a new graph around ``B`` training seeds
(:func:`pyg_ugrapher.datasets.neighbor_sample`, the same batches for both implementations, sampled
before timing, a fresh set every epoch) and the loss is taken on the seeds. This is where a new
graph every step must cost little: the first epoch is not counted, later epochs meet new graphs
of the same sampler. ``--same-graph`` trains on the first batch's graph at every step instead
(``batch_graphs`` column ``same``, else ``new``): the difference between the two is what a new
graph costs per step (its structures, decisions and the layers' own graphs).

``--compile-mode default`` wraps both models in ``torch.compile(model)``: compiled PyG is the
baseline a user who wants speed would pick (Inductor fuses its gather and scatter). The first
:data:`COMPILED_WARMUP` epochs (tracing, compiling) are not counted.

By default a CPU run trains on Cora; a GPU run also on every node-level graph of
:func:`pyg_ugrapher.datasets.available_datasets` and on a synthetic power-law graph of 1.6e7 edges
(``power_law``). Graphs without features get random ones, graphs without node labels (graph-level
collections, multi-label BlogCatalog) random labels, graphs without a split a random 60/20/20
one; their accuracies only show that training runs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
import torch_geometric.nn
from torch import Tensor, nn
from tqdm import tqdm

import pyg_ugrapher.nn
from pyg_ugrapher.datasets import available_datasets, load_dataset, neighbor_sample, power_law_graph

from .report import plot, side_by_side
from .rows import TRAIN_COLUMNS, ResultsFile, default_out, environment
from .timing import Stopwatch, failure

MODELS = ("gcn", "gat", "gatv2", "sage", "gin")
#: PyG first: our rows' ``speedup_vs_pyg`` is computed from its row.
IMPLEMENTATIONS = {"pyg": torch_geometric.nn, "ours": pyg_ugrapher.nn}
POWER_LAW = "power_law"
#: The synthetic graph of a GPU run: 1.6e7 edges on 1e6 nodes (mean degree 16).
POWER_LAW_NODES, POWER_LAW_EDGES = 1_000_000, 16_000_000
RANDOM_FEATURES, RANDOM_CLASSES = 128, 10
#: Epochs not timed under ``--compile-mode``: tracing, compiling and Inductor's first runs.
COMPILED_WARMUP = 3


@dataclass
class Task:
    """A full-batch node classification problem on one device."""

    name: str
    x: Tensor
    edge_index: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int


# Data ######################################################################################


def _random_split(num_nodes: int, generator: torch.Generator) -> List[Tensor]:
    order = torch.randperm(num_nodes, generator=generator)
    bounds = [0, int(0.6 * num_nodes), int(0.8 * num_nodes), num_nodes]
    masks = []
    for start, end in zip(bounds, bounds[1:]):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[order[start:end]] = True
        masks.append(mask)
    return masks


def make_task(name: str, device: torch.device, seed: int) -> Task:
    """Load ``name`` (a dataset of :func:`load_dataset`, or ``power_law``) for node classification."""
    generator = torch.Generator().manual_seed(seed)
    if name == POWER_LAW:
        edge_index = power_law_graph(POWER_LAW_NODES, POWER_LAW_EDGES, seed=seed, device=device)
        num_nodes, x, y, masks = POWER_LAW_NODES, None, None, None
    else:
        data = load_dataset(name)
        edge_index, num_nodes, x, y = data.edge_index, data.num_nodes, data.x, data.y
        masks = [getattr(data, key, None) for key in ("train_mask", "val_mask", "test_mask")]
        if any(mask is None for mask in masks):
            masks = None
        elif masks[0].dim() == 2:  # several splits (Tolokers): the first
            masks = [mask[:, 0] for mask in masks]
    if x is None:
        x = torch.randn(num_nodes, RANDOM_FEATURES, generator=generator)
    if y is None or y.dim() != 1 or y.size(0) != num_nodes:
        y = torch.randint(0, RANDOM_CLASSES, (num_nodes,), generator=generator)
    if masks is None:
        masks = _random_split(num_nodes, generator)
    x = x.float()
    num_classes = int(y.max()) + 1
    return Task(
        name, x.to(device), edge_index.to(device), y.to(device), *(m.to(device) for m in masks), num_classes=num_classes
    )


# Models ####################################################################################


class Net(nn.Module):
    """Two graph layers with an activation and feature dropout between them."""

    def __init__(
        self, first: nn.Module, second: nn.Module, activation: Callable[[Tensor], Tensor], dropout: float
    ) -> None:
        super().__init__()
        self.first, self.second = first, second
        self.activation, self.dropout = activation, dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.activation(self.first(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.second(x, edge_index)


def _mlp(in_channels: int, out_channels: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_channels, hidden), nn.ReLU(), nn.Linear(hidden, out_channels))


def build_model(
    model: str, layers: ModuleType, in_channels: int, hidden: int, num_classes: int, full_batch: bool = True
) -> Net:
    """The usual two-layer model of each paper, from ``layers`` (our or PyG's namespace); GCN
    caches its normalisation only when every step sees the same graph (``full_batch``)."""
    if model == "gcn":
        return Net(
            layers.GCNConv(in_channels, hidden, cached=full_batch),
            layers.GCNConv(hidden, num_classes, cached=full_batch),
            F.relu,
            0.5,
        )
    if model in ("gat", "gatv2"):
        attention = layers.GATConv if model == "gat" else layers.GATv2Conv
        heads = 8
        return Net(
            attention(in_channels, hidden // heads, heads=heads, dropout=0.6),
            attention(hidden, num_classes, heads=1, dropout=0.6),
            F.elu,
            0.6,
        )
    if model == "sage":
        return Net(layers.SAGEConv(in_channels, hidden), layers.SAGEConv(hidden, num_classes), F.relu, 0.5)
    if model == "gin":
        return Net(
            layers.GINConv(_mlp(in_channels, hidden, hidden), train_eps=True),
            layers.GINConv(_mlp(hidden, num_classes, hidden), train_eps=True),
            F.relu,
            0.5,
        )
    raise ValueError(f"model: expected one of {MODELS}, got {model!r}")


# Training ##################################################################################


def accuracy(logits: Tensor, y: Tensor, mask: Tensor) -> float:
    return float((logits[mask].argmax(dim=-1) == y[mask]).float().mean())


@dataclass
class Batch:
    """One mini-batch: the whole graph's id of each of its nodes (seeds first) and its edges."""

    node_ids: Tensor
    edge_index: Tensor
    num_seeds: int


def sample_epochs(
    task: Task, epochs: int, batch_size: int, num_neighbors: Sequence[int], seed: int, same_graph: bool = False
) -> List[List[Batch]]:
    """The mini-batches of every epoch: the training nodes shuffled, cut into seed sets of
    ``batch_size``, and each sampled (``num_neighbors`` edges per node and hop); with
    ``same_graph``, every step of every epoch is the first batch (one graph object)."""
    train_nodes = task.train_mask.nonzero().flatten()
    generator = torch.Generator().manual_seed(seed)
    out = []
    for epoch in range(epochs):
        order = train_nodes[torch.randperm(train_nodes.numel(), generator=generator).to(train_nodes.device)]
        batches = []
        for step, start in enumerate(range(0, order.numel(), batch_size)):
            seeds = order[start : start + batch_size]
            edge_index, node_ids = neighbor_sample(
                task.edge_index, task.x.size(0), seeds, num_neighbors, seed=seed + epoch * 100_003 + step
            )
            batches.append(Batch(node_ids, edge_index, seeds.numel()))
        out.append(batches)
        if same_graph:
            return [out[0][:1] * len(out[0])] * epochs
    return out


def _fresh(epochs: List[List[Batch]]) -> List[List[Batch]]:
    """The same batches as new tensors: a loader hands out new ones every step, and caches kept
    per ``edge_index`` tensor by an earlier run must not serve this one. A batch that recurs
    (``same_graph``) stays one object."""
    copies: Dict[int, Batch] = {}

    def fresh(batch: Batch) -> Batch:
        if id(batch) not in copies:
            copies[id(batch)] = Batch(batch.node_ids, batch.edge_index.clone(), batch.num_seeds)
        return copies[id(batch)]

    return [[fresh(b) for b in batches] for batches in epochs]


def train(
    model: Net,
    task: Task,
    epochs: int,
    lr: float,
    weight_decay: float,
    progress: Callable[[], None],
    compile_mode: Optional[str] = None,
    batches: Optional[List[List[Batch]]] = None,
) -> Dict[str, float]:
    """Train ``model`` (under ``torch.compile(mode=compile_mode)`` if given), full-batch or on
    ``batches`` (one list per epoch), and return its accuracies, final loss and mean epoch and
    step times."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    forward = torch.compile(model, mode=compile_mode) if compile_mode else model
    device = task.x.device
    times: List[float] = []
    loss = torch.tensor(math.nan)
    for epoch in range(epochs):
        model.train()
        steps = batches[epoch] if batches is not None else [None]
        with Stopwatch(device) as timer:
            for batch in steps:
                optimizer.zero_grad()
                if batch is None:
                    out = forward(task.x, task.edge_index)
                    loss = F.cross_entropy(out[task.train_mask], task.y[task.train_mask])
                else:
                    out = forward(task.x[batch.node_ids], batch.edge_index)[: batch.num_seeds]
                    loss = F.cross_entropy(out, task.y[batch.node_ids[: batch.num_seeds]])
                loss.backward()
                optimizer.step()
        times.append(timer.ms)
        progress()
    model.eval()
    with torch.no_grad():
        logits = model(task.x, task.edge_index)
    # The first epoch builds the graph caches (and compiles kernels on a GPU): not counted.
    warmup = COMPILED_WARMUP if compile_mode else 1
    measured = times[warmup:] if len(times) > warmup else times[-1:]
    epoch_ms = sum(measured) / len(measured)
    steps = len(batches[-1]) if batches is not None else 1
    return {
        "test_acc": accuracy(logits, task.y, task.test_mask),
        "val_acc": accuracy(logits, task.y, task.val_mask),
        "final_loss": loss.item(),
        "epoch_ms": epoch_ms,
        "steps": steps,
        "step_ms": epoch_ms / steps,
    }


def run(
    datasets: Sequence[str],
    models: Sequence[str],
    epochs: int,
    device: torch.device,
    hidden: int,
    lr: float,
    weight_decay: float,
    seed: int,
    compile_mode: Optional[str] = None,
    batch_size: int = 0,
    num_neighbors: Sequence[int] = (10, 10),
    same_graph: bool = False,
    results: Optional[ResultsFile] = None,
) -> pd.DataFrame:
    """Every (dataset, model) with both implementations, full-batch or (``batch_size`` > 0) on
    sampled mini-batches (``same_graph``: the first batch every step); each row is appended to
    ``results`` as soon as it is measured, and the rows are returned. Failures (e.g. out of
    memory) become rows whose ``status`` and ``note`` say so."""
    rows = []
    env = environment(device)
    batch_graphs = ("same" if same_graph else "new") if batch_size else ""
    bar = tqdm(total=len(datasets) * len(models) * len(IMPLEMENTATIONS) * epochs, unit="epoch")
    for name in datasets:
        bar.set_description(f"loading {name}")
        task = make_task(name, device, seed)
        sampled = sample_epochs(task, epochs, batch_size, num_neighbors, seed, same_graph) if batch_size else None
        for model_name in models:
            torch.manual_seed(seed)
            reference = build_model(
                model_name, torch_geometric.nn, task.x.size(1), hidden, task.num_classes, full_batch=not batch_size
            )
            for impl, layers in IMPLEMENTATIONS.items():
                bar.set_description(f"{name} {model_name} {impl}")
                row = {
                    **env,
                    "dataset": name,
                    "model": model_name,
                    "impl": impl,
                    "compile_mode": compile_mode or "eager",
                    "num_nodes": task.x.size(0),
                    "num_edges": task.edge_index.size(1),
                    "hidden": hidden,
                    "batch_size": batch_size,
                    "batch_graphs": batch_graphs,
                    "epochs": epochs,
                }
                done = bar.n
                try:
                    net = build_model(
                        model_name, layers, task.x.size(1), hidden, task.num_classes, full_batch=not batch_size
                    )
                    net.load_state_dict(reference.state_dict())
                    torch.manual_seed(seed)  # the same dropout masks where both draw alike
                    row.update(
                        train(
                            net.to(device),
                            task,
                            epochs,
                            lr,
                            weight_decay,
                            bar.update,
                            compile_mode,
                            _fresh(sampled) if sampled else None,
                        )
                    )
                    row["status"] = "ok"
                except (RuntimeError, ValueError) as error:  # out of memory, unsupported input
                    row.update(failure(error))
                    bar.update(done + epochs - bar.n)
                rows.append(results.write(row) if results is not None else row)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    bar.close()
    return pd.DataFrame(rows).reindex(columns=list(TRAIN_COLUMNS))


# Command line ##############################################################################


def default_datasets(device: torch.device) -> List[str]:
    if device.type == "cuda":
        return available_datasets() + [POWER_LAW]
    return ["cora"]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        help=f"datasets ({', '.join(available_datasets())}, {POWER_LAW}); comma-separated "
        f"lists work too; default: cora on a CPU, all of them on a GPU",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"models among {', '.join(MODELS)}")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width (GAT, GATv2: 8 heads of hidden/8)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=["default", "max-autotune-no-cudagraphs"],
        help="torch.compile both models with this mode (default: eager)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="train on sampled mini-batches of this many seed nodes (0: full batch)",
    )
    parser.add_argument(
        "--num-neighbors",
        type=int,
        nargs="+",
        default=[10, 10],
        help="with --batch-size: edges sampled per node and hop",
    )
    parser.add_argument(
        "--same-graph",
        action="store_true",
        help="with --batch-size: the first batch's graph at every step (what a new graph costs)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder of train_e2e.csv and its plot (default: benchmarks/results/<gpu>/)",
    )
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device: CUDA is not available")
    known = set(available_datasets()) | {POWER_LAW}
    names = [part for item in (args.datasets or default_datasets(args.device)) for part in item.split(",") if part]
    unknown = sorted(set(names) - known)
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; expected some of {sorted(known)}")
    args.datasets = names
    models = [part for item in args.models for part in item.split(",") if part]
    if set(models) - set(MODELS):
        parser.error(f"--models: unknown {sorted(set(models) - set(MODELS))}; expected some of {MODELS}")
    args.models = models
    if args.epochs < 1:
        parser.error("--epochs: must be at least 1")
    if args.batch_size < 0:
        parser.error("--batch-size: must be 0 (full batch) or positive")
    if args.same_graph and not args.batch_size:
        parser.error("--same-graph: needs --batch-size (full batch is one graph already)")
    if any(k < 1 for k in args.num_neighbors):
        parser.error("--num-neighbors: every hop needs at least 1")
    if args.hidden < 8 or args.hidden % 8:
        parser.error("--hidden: must be a positive multiple of 8 (GAT and GATv2 split it over 8 heads)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Train, append the rows to ``--out``'s ``train_e2e.csv``, redraw its plot; returns this
    run's rows."""
    args = parse_args(argv)
    out = args.out or default_out(args.device)
    results = ResultsFile(out / "train_e2e.csv")
    rows = run(
        args.datasets,
        args.models,
        args.epochs,
        args.device,
        args.hidden,
        args.lr,
        args.weight_decay,
        args.seed,
        args.compile_mode,
        args.batch_size,
        args.num_neighbors,
        args.same_graph,
        results,
    )
    png = plot(results.path)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(side_by_side(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for row in rows[rows["status"] != "ok"].itertuples():
        print(f"{row.dataset} {row.model} {row.impl}: {row.status} {row.note}")
    print(f"appended {len(rows)} rows to {results.path}; drew {png}")
    return rows


if __name__ == "__main__":
    main()
