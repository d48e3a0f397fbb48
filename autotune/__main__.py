"""``python -m autotune collect | train | evaluate``: the cost model's data, model and evaluation.

Retrain on your own GPU (two commands; ``<gpu>`` is :func:`autotune.gpus.gpu_slug` of its name,
``h100`` for an H100)::

    python -m autotune collect --out autotune/data/raw --workers 8 --time-budget 3000
    python -m autotune train --data autotune/data/raw --out autotune/models/<gpu>.json

``collect`` is resumable (rerun it to continue), ``train`` writes the model that
:func:`autotune.select` loads on that GPU (``PYG_UGRAPHER_MODEL`` names another file).

Each command imports its module when it runs: ``collect`` (which ``train`` and ``evaluate`` import
too) imports Triton, and ``collect --device cpu`` must set ``TRITON_INTERPRET`` before that.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

#: ``evaluate``'s default output folder.
EVAL_OUT = Path("autotune/data/eval")


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x]


def _names(text: str) -> List[str]:
    return [x for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m autotune", description="Collect timings, train and evaluate the schedule cost model."
    )
    sub = main.add_subparsers(dest="command", required=True)

    c = sub.add_parser("collect", help="time sampled schedules on the graph corpus")
    c.add_argument("--out", type=Path, default=Path("autotune/data/raw"), help="output folder")
    c.add_argument(
        "--graphs",
        type=_names,
        default=None,
        help="comma-separated corpus names, name prefixes or groups (real, synthetic, uniform, power_law, "
        "rmat, hubs, batch, bipartite); default: all",
    )
    c.add_argument("--list-graphs", action="store_true", help="print the graphs a run would cover and exit")
    c.add_argument("--ops", type=_names, default=None, help="forward operators (default: the six)")
    c.add_argument("--no-backward", action="store_true", help="skip the backward steps")
    c.add_argument("--features", type=_ints, default=None, help="message widths F (default: 16..512)")
    c.add_argument("--dtypes", type=_names, default=["float32"], help="float32,float16,bfloat16")
    c.add_argument("--configs", type=int, default=24, help="sampled schedules per case (plus anchors)")
    c.add_argument("--max-edges", type=float, default=1e8, help="skip larger graphs")
    c.add_argument("--time-budget", type=float, default=None, help="seconds; stops cleanly")
    c.add_argument("--no-resume", action="store_true", help="redo cases already written")
    c.add_argument("--workers", type=int, default=0, help="compile processes (GPU only)")
    c.add_argument("--reps", type=int, default=10, help="most timed calls per schedule")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--device", default="cuda", help="cuda or cpu (Triton interpreter, smoke tests)")

    t = sub.add_parser("train", help="fit the cost model on collected data")
    t.add_argument("--data", type=Path, nargs="+", required=True, help="collected files or folders")
    t.add_argument(
        "--out",
        type=Path,
        required=True,
        help="model file; select loads autotune/models/<gpu>.json on that GPU (h100, h200: the slug of its name)",
    )
    t.add_argument("--n-estimators", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--target",
        choices=("log_time", "relative", "rank"),
        default="rank",
        help="rank the candidates of each case (default, selects best), or regress log time "
        "relative to its case's mean, or log time",
    )

    e = sub.add_parser("evaluate", help="leave-graphs-out cross-validation")
    e.add_argument("--data", type=Path, nargs="+", required=True, help="collected files or folders")
    e.add_argument(
        "--out",
        type=Path,
        default=None,
        help="CSV and plots (default: autotune/data/eval, and its leave_one_out_real folder with --leave-one-out)",
    )
    e.add_argument("--folds", type=int, default=5)
    e.add_argument(
        "--leave-one-out",
        choices=("real",),
        default=None,
        help="hold out each real graph in turn, trained on all other graphs, instead of folds",
    )
    e.add_argument(
        "--score-gpu",
        default=None,
        help="score only this GPU's held-out cases (a slug: h100, h200), the models trained on every GPU's rows",
    )
    e.add_argument(
        "--oracle",
        type=Path,
        nargs="+",
        default=None,
        help="collections of the whole design space of some real graphs: each left out in turn, only its cases scored",
    )
    e.add_argument(
        "--repeat",
        type=Path,
        nargs="+",
        default=None,
        help="with --oracle: a second collection of some of its graphs' design space, timed apart (another machine)",
    )
    e.add_argument("--n-estimators", type=int, default=None)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--target", choices=("log_time", "relative", "rank"), default="rank")
    return main


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "collect":
        if args.device == "cpu" and "triton" not in sys.modules:
            # Triton reads this when first imported; the CPU runs kernels only through it.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from . import collect

        if args.list_graphs:
            for spec in collect.select_graphs(args.graphs, args.max_edges):
                print(f"{spec.name:32s} {','.join(spec.groups):26s} {spec.num_edges:>12}")
            return 0
        settings = collect.Settings(
            out=args.out,
            graphs=args.graphs,
            ops=args.ops or collect.FORWARD_OPS,
            backward=not args.no_backward,
            features=args.features or collect.FEATURE_SIZES,
            dtypes=args.dtypes,
            configs=args.configs,
            max_edges=args.max_edges,
            time_budget=args.time_budget,
            resume=not args.no_resume,
            workers=args.workers,
            reps=args.reps,
            seed=args.seed,
            device=args.device,
        )
        collect.collect(settings)
        return 0
    if args.command == "train":
        from .train import train

        train(args.data, args.out, n_estimators=args.n_estimators, seed=args.seed, kind=args.target)
        return 0
    from .evaluate import evaluate

    out = args.out
    if out is None:
        if args.oracle is not None:
            out = EVAL_OUT / "oracle"
        elif args.leave_one_out is not None:
            out = EVAL_OUT / f"leave_one_out_{args.leave_one_out}"
        else:
            out = EVAL_OUT
    evaluate(
        args.data,
        out,
        folds=args.folds,
        n_estimators=args.n_estimators,
        seed=args.seed,
        kind=args.target,
        leave_out=args.leave_one_out,
        score_gpu=args.score_gpu,
        oracle=args.oracle,
        repeat=args.repeat,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
