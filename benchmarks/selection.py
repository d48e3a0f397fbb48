"""What choosing a schedule costs the host: ``autotune.selection.select``, cached and uncached.

The first call of an operator on a graph decides its schedule; later calls of the same case look
the decision up. For every graph, operator and width this suite times, on the device it runs on:

* ``stats_us``: the graph's degree statistics (``csr_stats`` of a copy of its CSR: device
  reductions and one sync), which a graph above the small-graph rule's size needs once;
* ``uncached_us``: ``select`` on that CSR, its statistics known, after
  ``selection.forget_decisions()``: the bucketing of the statistics, the features of the whole
  design space and their scores by the device's cost model (one kernel on a GPU), or the small-graph
  rule, or the heuristic where there is no model (``chooser`` says which);
* ``cached_us``: the same call again, a dictionary lookup.

Each is the median of ``--repeats`` timings (a cached one of ``CACHED_CALLS`` calls), after a
warm-up call that loads the model and compiles its kernel::

    python -m benchmarks.selection                                # the default graphs, a minute
    python -m benchmarks.selection --graphs tolokers --ops copy_u_sum --features 32
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import pandas as pd
import torch
from tqdm import tqdm

from autotune import selection
from autotune.collect import DTYPES
from autotune.timing import wall_ms
from pyg_ugrapher import GraphTensor, datasets
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.structure import CSR, csr_stats
from triton_kernels.space import space

from . import rows
from .report import plot
from .timing import failure

#: Real graphs: two below the small-graph rule's size, four above (up to COLLAB's 2.5e7 edges).
GRAPHS = ("cora", "pubmed", "coauthor-physics", "github", "tolokers", "collab")
OPS = ("copy_u_sum", "u_mul_e_sum", "copy_u_max", "u_dot_v")
WIDTHS = (32, 128)
#: Calls per timing of a cached decision.
CACHED_CALLS = 100


def _median_us(action: Callable[[], object], repeats: int, device: torch.device, calls: int = 1) -> float:
    """The median over ``repeats`` timings (:func:`autotune.timing.wall_ms`, from an idle device)
    of ``calls`` calls of ``action``, in µs per call."""

    def timed() -> None:
        for _ in range(calls):
            action()

    return statistics.median(wall_ms(timed, warmup=0, reps=repeats, device=device)) * 1e3 / calls


def _fresh(csr: CSR) -> CSR:
    """``csr`` with a copy of its row offsets: a structure whose statistics were never computed
    (they are cached with the offsets)."""
    return dataclasses.replace(csr, rowptr=csr.rowptr.clone())


def measure(csr: CSR, op: OpInfo, width: int, dtype: torch.dtype, device: torch.device, repeats: int) -> Dict:
    """The columns of one case (see the module docstring)."""

    # A dot product's message width counts its summed features (see select).
    reduce_size = width if op.edge_op == "dot" else 1

    def uncached() -> object:
        selection.forget_decisions()
        return selection.select(csr, op, width, dtype, reduce_size=reduce_size, device=device)

    def cached() -> object:
        return selection.select(csr, op, width, dtype, reduce_size=reduce_size, device=device)

    copies = [_fresh(csr) for _ in range(repeats)]
    stats = iter(copies)
    csr_stats(csr)  # the statistics the timed calls of select read
    uncached()  # loads the model and compiles its scoring kernel
    return {
        "chooser": selection.chooser(csr, device),
        "candidates": len(space(op, width)),
        "stats_us": _median_us(lambda: csr_stats(next(stats)), repeats, device),
        "uncached_us": _median_us(uncached, repeats, device),
        "cached_us": _median_us(cached, repeats, device, CACHED_CALLS),
    }


def run(args) -> pd.DataFrame:
    device = torch.device(args.device)
    results = rows.ResultsFile(args.out / "selection.csv", kind="selection")
    written: List[dict] = []
    for name in tqdm(args.graphs, desc="graphs", unit="graph"):
        data = datasets.load_dataset(name)
        graph = GraphTensor.from_edge_index(data.edge_index.to(device), data.num_nodes)
        csr = graph.csr(device)
        for op_name in args.ops:
            for width in args.features:
                row = {
                    **rows.environment(device),
                    "graph": name,
                    "num_nodes": data.num_nodes,
                    "num_edges": data.edge_index.size(1),
                    "op": op_name,
                    "F": width,
                    "dtype": args.dtype,
                    "repeats": args.repeats,
                }
                try:
                    row.update(measure(csr, OpInfo.from_name(op_name), width, DTYPES[args.dtype], device, args.repeats))
                    row["status"] = "ok"
                except Exception as error:  # a failed case is a row, the run goes on
                    row.update(failure(error))
                written.append(results.write(row))
                outcome = (
                    f"{row['uncached_us']:.0f} us uncached, {row['cached_us']:.1f} us cached ({row['chooser']})"
                    if row.get("status") == "ok"
                    else row.get("note")
                )
                tqdm.write(f"{name:>16} {op_name:>12} F={width:<4}: {outcome}")
    plot(results.path)
    return pd.DataFrame(written)


def parse_args(argv: Optional[Sequence[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.selection", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=datasets.available_datasets())
    parser.add_argument("--ops", nargs="+", default=list(OPS), metavar="OP")
    parser.add_argument("--features", nargs="+", type=int, default=list(WIDTHS), metavar="F")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=20, help="timings per measurement (the median counts)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<gpu>)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if any(width < 1 for width in args.features):
        parser.error("--features must be positive")
    for name in args.ops:
        try:
            OpInfo.from_name(name)
        except ValueError as error:
            parser.error(f"--ops: {error}")
    if args.out is None:
        args.out = rows.default_out(torch.device(args.device))
    return args


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
