"""Host time per call of what a training step calls on a graph, ours against PyG's.

On graphs of up to about a million edges a step is host time (``steps.csv``), so what each call
costs the host decides it. For every graph and width this suite times, ours against PyG's:

* ``op copy_u_sum`` / ``op copy_u_mean``: one aggregation, ``ug.compute`` against PyG's
  ``scatter(x[src], dst)``;
* ``layer SAGEConv`` / ``layer GINConv`` / ``layer GCNConv``: one layer with its default arguments
  (GIN around a Linear), on a graph it has seen;
* ``new graph SAGEConv`` / ``new graph GCNConv`` / ``new graph GATConv``: that layer on a new edge
  index at every call (a mini-batch's: the index is copied before each call, so nothing is cached
  for it; GCN's adds self loops and normalises, GAT's replaces the stored self loops and groups the
  rows for its one-pass softmax), forward only;
* ``compiled layer SAGEConv`` / ``compiled layer GCNConv``: the layer under ``torch.compile``
  (default mode), PyG's compiled against ours: our operators run as custom ops, whose dispatch
  costs host time at every call, where Inductor fuses PyG's gathers and scatters into its own
  kernels;
* ``compiled op copy_u_sum``: the aggregation under ``torch.compile``, on a graph whose structure
  only the compiled calls build.

each in the passes ``forward`` (no gradient) and ``forward+backward`` (input features and
parameters with gradients, the output's gradient given), except the new graph's. A row holds the
median over ``--repeats`` runs of ``--calls`` calls of the host time per call (the clock read before
the device catches up: the time the host spent issuing the call) and of the wall time per call
(read after a device sync), and the Python function calls per call (``cProfile``)::

    python -m benchmarks.host_calls                             # Cora, PubMed, Tolokers parts
    python -m benchmarks.host_calls --graphs cora --features 64 --calls 200
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

import pandas as pd
import torch
import torch_geometric.nn
from torch import Tensor
from torch_geometric.loader import RandomNodeLoader
from torch_geometric.utils import scatter
from tqdm import tqdm

import pyg_ugrapher as ug
import pyg_ugrapher.nn
from pyg_ugrapher.datasets import load_dataset

from .report import plot
from .rows import ResultsFile, default_out, environment
from .timing import failure, synchronize

#: Graph names: a dataset of ``../shared/datasets``, or ``<dataset>-parts``: the first part of
#: PyG's ``RandomNodeLoader`` with :data:`PARTS` parts (a mini-batch's graph).
GRAPHS = ("cora", "pubmed", "tolokers-parts")
PARTS = 16
WIDTHS = (64,)
PASSES = ("forward", "forward+backward")
IMPLEMENTATIONS = {"pyg": torch_geometric.nn, "ours": pyg_ugrapher.nn}
#: New edge indices a ``new graph`` case cycles through (each copied before its call).
NEW_GRAPHS = 8
CASES = (
    "op copy_u_sum",
    "op copy_u_mean",
    "layer SAGEConv",
    "layer GINConv",
    "layer GCNConv",
    "new graph SAGEConv",
    "new graph GCNConv",
    "new graph GATConv",
    "compiled layer SAGEConv",
    "compiled layer GCNConv",
    "compiled op copy_u_sum",
)


def load_graph(name: str, seed: int) -> Tuple[Tensor, int]:
    """``(edge_index, num_nodes)`` of the graph ``name`` (see :data:`GRAPHS`), on the host."""
    dataset, _, parts = name.partition("-")
    data = load_dataset(dataset)
    if not parts:
        return data.edge_index, data.num_nodes
    if parts != "parts":
        raise ValueError(f"graphs: unknown graph {name!r}; expected a dataset name or '<dataset>-parts'")
    torch.manual_seed(seed)
    part = next(iter(RandomNodeLoader(data, num_parts=PARTS, shuffle=True)))
    return part.edge_index, part.num_nodes


def layer(cls: str, impl: str, width: int) -> torch.nn.Module:
    """The layer ``cls`` of ``impl`` with its default arguments, ``width`` features in and out."""
    namespace = IMPLEMENTATIONS[impl]
    if cls == "GINConv":
        return namespace.GINConv(torch.nn.Linear(width, width))
    return getattr(namespace, cls)(width, width)


def cases(args) -> Iterator[Tuple[str, str]]:
    """``(case, pass)`` pairs of the run."""
    for case in args.cases:
        for pass_ in PASSES:
            if case.startswith("new graph") and pass_ != "forward":
                continue
            yield case, pass_


def make_call(
    case: str, pass_: str, impl: str, edge_index: Tensor, num_nodes: int, width: int, device: torch.device
) -> Callable[[], object]:
    """One call of ``case`` in ``pass_`` by ``impl`` (inputs made once, on ``device``)."""
    generator = torch.Generator().manual_seed(0)
    backward = pass_ == "forward+backward"
    x = torch.randn(num_nodes, width, generator=generator).to(device).requires_grad_(backward)
    edge_index = edge_index.to(device)
    kind, _, name = case.partition(" ")
    compiled_op = kind == "compiled" and name.startswith("op ")
    if compiled_op:
        kind, _, name = name.partition(" ")
    if kind == "op":
        gather = name.rsplit("_", 1)[1]
        src, dst = edge_index
        graph = ug.GraphTensor.from_edge_index(edge_index, num_nodes)

        def forward() -> Tensor:
            if impl == "ours":
                return ug.compute(graph, name, x)
            return scatter(x.index_select(0, src), dst, 0, dim_size=num_nodes, reduce=gather)

    elif kind == "layer":
        module = layer(name, impl, width).to(device)

        def forward() -> Tensor:
            return module(x, edge_index)

    elif kind == "compiled":
        module = torch.compile(layer(name.split()[-1], impl, width).to(device))

        def forward() -> Tensor:
            return module(x, edge_index)

    elif kind == "new":
        module = layer(name.split()[-1], impl, width).to(device)
        indices = itertools.cycle(
            [edge_index[:, torch.randperm(edge_index.size(1), generator=generator)] for _ in range(NEW_GRAPHS)]
        )

        def forward() -> Tensor:
            return module(x, next(indices).clone())

    else:
        raise ValueError(f"cases: unknown case {case!r}; expected one of {', '.join(CASES)}")
    if compiled_op:
        forward = torch.compile(forward)
    if not backward:

        def call() -> object:
            with torch.no_grad():
                return forward()

        return call
    grad = torch.randn(num_nodes, width, generator=generator).to(device)
    return lambda: forward().backward(grad)


def measure(call: Callable[[], object], calls: int, repeats: int, device: torch.device) -> Dict[str, float]:
    """Median host and wall microseconds per call over ``repeats`` runs of ``calls`` calls (after a
    warm-up run), and the Python function calls per call."""
    for _ in range(max(calls // 4, 5)):
        call()
    synchronize(device)
    host, wall = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        issued = time.perf_counter()
        synchronize(device)
        done = time.perf_counter()
        host.append((issued - start) / calls * 1e6)
        wall.append((done - start) / calls * 1e6)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        call()
    profile.disable()
    synchronize(device)
    return {
        "host_us": statistics.median(host),
        "wall_us": statistics.median(wall),
        "python_calls": pstats.Stats(profile).total_calls / 10,
    }


def run(args) -> pd.DataFrame:
    device = torch.device(args.device)
    results = ResultsFile(args.out / "host_calls.csv", kind="host_calls")
    written = []
    todo = [(graph, width, *case) for graph in args.graphs for width in args.features for case in cases(args)]
    loaded: Dict[str, Tuple[Tensor, int]] = {}
    for graph, width, case, pass_ in tqdm(todo, desc="host calls", unit="case"):
        if graph not in loaded:
            loaded[graph] = load_graph(graph, args.seed)
        edge_index, num_nodes = loaded[graph]
        for impl in IMPLEMENTATIONS:
            row = {
                **environment(device),
                "graph": graph,
                "num_nodes": num_nodes,
                "num_edges": edge_index.size(1),
                "F": width,
                "case": case,
                "pass": pass_,
                "impl": impl,
                "calls": args.calls,
            }
            try:
                call = make_call(case, pass_, impl, edge_index, num_nodes, width, device)
                row.update(measure(call, args.calls, args.repeats, device))
                row["status"] = "ok"
            except Exception as error:  # a failed case is a row, the run goes on
                row.update(failure(error))
            written.append(results.write(row))
            outcome = row.get("note") if row.get("status") != "ok" else f"{row['host_us']:.1f} us host"
            tqdm.write(f"{graph:>16} F={width:<4} {case:>20} {pass_:>16} {impl:>4}: {outcome}")
    plot(results.path)
    return pd.DataFrame(written)


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_calls", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), metavar="NAME")
    parser.add_argument("--features", nargs="+", type=int, default=list(WIDTHS), metavar="F")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES, metavar="CASE")
    parser.add_argument("--calls", type=int, default=500, help="calls per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (the median counts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<gpu>)")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats must be at least 1")
    if args.out is None:
        args.out = default_out(torch.device(args.device))
    return args


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
