"""Run the comparison benchmarks: rows appended to CSVs, then plots and markdown tables.

    python -m benchmarks.run --suite headline --time-budget 420
    python -m benchmarks.run --suite headline --time-budget 420 --resume   # the rest

Rows go to ``--out`` (default ``benchmarks/results/<gpu>/``, :mod:`benchmarks.rows`): operator
rows to ``ops.csv`` (its ``suite`` column says which suite), layer rows to ``layers.csv``; then
``report.md`` and one PNG per CSV are drawn from the newest row of each case (:mod:`benchmarks.report`).

Suites:

* ``headline``: the project issue's setting (1e6 vertices, 1.6e7 edges, uniform and power-law,
  F = 128): copy_u_sum, u_mul_e_sum, copy_u_max and u_dot_v against cuSPARSE, PyG eager and
  compiled, with ours eager and compiled; then the ``layers`` suite.
* ``ops``: every operator on the whole graph corpus, F in 32/128/256, with a sweep of each
  parallel strategy (PyG compiled only with ``--compile-all``: each compilation takes 10-30 s).
* ``layers``: one training step of GCN, GAT, GATv2, SAGE, GraphConv(max) and GIN layers, and of
  PyG's Transformer, EdgeConv, GEN and PNA layers through ``ug.accelerate``.
* ``all``: all three.

Rows are appended as they are measured. When ``--time-budget`` runs out, the remaining
measurements are skipped with a logged note and the report is written from what was measured;
``--resume`` then measures only what the current commit's rows lack. ``--tiny --device cpu``
runs every code path on toy graphs (the tests do); our side then runs the reference executor (or
Triton's interpreter with ``TRITON_INTERPRET=1``) and times are wall-clock.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from tqdm import tqdm

from . import graphs, layers, ops
from .report import write_report
from .rows import ResultsFile, default_out, environment
from .timing import Budget, Settings, copy_bandwidth

log = logging.getLogger("benchmarks")

SUITES = {
    "headline": ("headline", "layers"),
    "ops": ("ops",),
    "layers": ("layers",),
    "all": ("headline", "layers", "ops"),
}
#: Short timings for toy graphs on a CPU, where only the code paths matter.
TINY_SETTINGS = Settings(warmup_ms=1.0, rep_ms=2.0, min_reps=3, max_cpu_reps=10)


class _TqdmHandler(logging.Handler):
    """Log lines printed above the progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", required=True, choices=SUITES)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder of the CSVs, plots and report.md (default: benchmarks/results/<gpu>/)",
    )
    parser.add_argument("--log", type=Path, default=None, metavar="FILE", help="also append the log to FILE")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which remaining measurements are skipped (default: none)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="toy graphs and widths (tests, CPU)")
    parser.add_argument(
        "--resume", action="store_true", help="measure only what the current commit's rows in --out lack"
    )
    parser.add_argument("--compile-all", action="store_true", help="also torch.compile PyG and ours in the ops suite")
    parser.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no code generation, for tests)"
    )
    parser.add_argument("--graphs", nargs="+", metavar="NAME", help="only these graphs (any suite)")
    parser.add_argument("--ops", nargs="+", choices=ops.OPS, help="only these operators")
    parser.add_argument(
        "--features", nargs="+", type=int, metavar="F", help="feature sizes of the ops suite (default: 32 128 256)"
    )
    parser.add_argument("--layers", nargs="+", choices=layers.LAYERS, help="only these layers")
    parser.add_argument(
        "--sweep-size",
        type=int,
        default=None,
        metavar="N",
        help=f"schedules timed per strategy in the ops suite (default {ops.SWEEP_SIZE}; 0: no sweep)",
    )
    parser.add_argument(
        "--ours-layers",
        default="pyg_ugrapher.nn",
        metavar="MODULE",
        help="module providing our layers (torch_geometric.nn dry-runs the harness)",
    )
    return parser.parse_args(argv)


def _corpora(args: argparse.Namespace) -> dict:
    corpora = {
        "headline": graphs.headline_graphs(args.tiny),
        "ops": graphs.ops_graphs(args.tiny),
        "layers": graphs.layer_graphs(args.tiny),
    }
    suites = SUITES[args.suite]
    if args.graphs:
        known = {spec.name for suite in suites for spec in corpora[suite]}
        unknown = sorted(set(args.graphs) - known)
        if unknown:
            raise SystemExit(
                f"--graphs: unknown graph(s) {', '.join(unknown)}; the {args.suite} suite "
                f"has {', '.join(sorted(known))}"
            )
    return {suite: graphs.select(corpora[suite], args.graphs) for suite in suites}


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda":
        # An explicit index: graph structures are cached per device, and set_device needs one.
        index = device.index if device.index is not None else torch.cuda.current_device()
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    return device


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Run the suites; returns (and prints) the markdown report of ``--out``."""
    args = parse(argv)
    device = _device(args.device)
    out = args.out or default_out(device)
    out.mkdir(parents=True, exist_ok=True)
    handlers: List[logging.Handler] = [_TqdmHandler()]
    if args.log:
        handlers.append(logging.FileHandler(args.log))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        _run(args, device, out)
    finally:  # after a crash too: report whatever was measured
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()
        report = write_report(out)
        print(report)
    return report


def _run(args: argparse.Namespace, device: torch.device, out: Path) -> None:
    torch.manual_seed(0)
    env = environment(device)
    settings = TINY_SETTINGS if args.tiny else Settings()
    budget = Budget(args.time_budget)
    log.info(
        "%s on %s, commit %s: torch %s, triton %s, PyG %s; copy bandwidth %.0f GB/s; rows to %s",
        args.suite,
        env["gpu"],
        env["commit"],
        env["torch"],
        env["triton"],
        env["torch_geometric"],
        copy_bandwidth(device) / 1e9,
        out,
    )
    sweep = args.sweep_size if args.sweep_size is not None else (ops.TINY_SWEEP_SIZE if args.tiny else ops.SWEEP_SIZE)
    for suite, specs in _corpora(args).items():
        if suite == "layers":
            results = ResultsFile(out / "layers.csv", resume=args.resume)
            layers.run(
                suite,
                specs,
                args.layers or list(layers.LAYERS),
                args.ours_layers,
                args.tiny,
                results,
                budget,
                settings,
                device,
                env,
                args.compile_backend,
            )
            continue
        results = ResultsFile(out / "ops.csv", resume=args.resume)
        if suite == "headline":
            op_names = [o for o in ops.HEADLINE_OPS if not args.ops or o in args.ops]
            features = ops.TINY_FEATURES[-1:] if args.tiny else (128,)
            methods = [m for m in ops.METHODS if m not in ("sweep", "oracle")]  # synthetic graphs: no oracle
        else:
            op_names = args.ops or list(ops.OPS)
            features = args.features or (ops.TINY_FEATURES if args.tiny else ops.FEATURES)
            methods = [m for m in ops.METHODS if args.compile_all or m not in ops.COMPILED]
        ops.run(
            suite,
            specs,
            op_names,
            features,
            methods,
            sweep,
            results,
            budget,
            settings,
            device,
            env,
            args.compile_backend,
        )


if __name__ == "__main__":
    main()
