"""Markdown tables and plots, drawn from the results CSVs alone (:mod:`benchmarks.rows`).

Tables and plots show the newest row of each case of a file (:func:`benchmarks.rows.latest`),
whatever its commit; the environment lines, the layers table and the plot titles name the commits::

    python -m benchmarks.report benchmarks/results/h100            # report.md and a PNG per CSV
    python -m benchmarks.report --plot benchmarks/results/h100/ops.csv   # that CSV's PNG only

Cells show the median time, or the row's status where it failed (``oom``, ``error``); a time
marked ``!`` did not match PyG's result (``max_rel_err`` above the tolerance).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: the GPU machine has no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from .rows import KINDS, TIMED, commits, kind_of, latest, read  # noqa: E402

#: The headline's columns per pass.
HEADLINE_METHODS = {
    "fwd": ("cusparse", "pyg", "pyg_compiled", "ours", "ours_compiled", "floor"),
    "fwd+bwd": ("pyg", "pyg_compiled", "ours", "ours_compiled", "floor"),
}
#: An operator file's latest rows with up to this many (graph, op, F) cases are plotted as times per
#: method (the headline's cases); more, as our speed-up over eager PyG per graph.
FEW_CASES = 12


def load(path: Path) -> Optional[pd.DataFrame]:
    """The newest row of each case of a results CSV (:func:`benchmarks.rows.latest`), or ``None``
    when the file is missing or empty."""
    path = Path(path)
    if not path.exists():
        return None
    frame = latest(read(path), KINDS[kind_of(path)][1])
    return frame if len(frame) else None


# -- formatting ------------------------------------------------------------------------------
def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _number(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2e}"


def _ratio(value: Optional[float]) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.3g}x"


def _time(row: Optional[pd.Series], column: str = "time_ms") -> Optional[float]:
    """A timed row's value, or None (missing, failed)."""
    if row is None or row["status"] not in TIMED or not math.isfinite(row[column]):
        return None
    return float(row[column])


def _cell(row: Optional[pd.Series], column: str = "time_ms") -> str:
    if row is None:
        return "–"
    if row["status"] not in TIMED:
        return row["status"]
    text = _number(row[column])
    return text + " !" if row["status"] == "mismatch" else text


def _speedup(slow: Optional[pd.Series], fast: Optional[pd.Series], column: str = "time_ms") -> Optional[float]:
    """``slow``'s time over ``fast``'s in ``column`` (rows of a file older than the column: None)."""
    if slow is not None and column not in slow.index:
        return None
    a, b = _time(slow, column), _time(fast, column)
    return a / b if a is not None and b else None


def _short_schedule(text: str) -> str:
    """``vertex:block_v=4,block_e=16,...`` as ``vertex v4 e16 f64 w4 s1``."""
    if ":" not in text:
        return text
    strategy, _, knobs = text.partition(":")
    short = {"block_v": "v", "block_e": "e", "block_f": "f", "group_size": "g", "num_warps": "w", "num_stages": "s"}
    parts = [short.get(k, k) + v for k, v in (item.split("=") for item in knobs.split(","))]
    return " ".join([strategy] + parts)


def _index(frame: pd.DataFrame, columns: Sequence[str]) -> Dict[tuple, pd.Series]:
    return {tuple(row[c] for c in columns): row for _, row in frame.iterrows()}


def _unique(frame: pd.DataFrame, columns: Sequence[str]) -> List[tuple]:
    """Distinct values of ``columns`` in order of first appearance (the order they ran)."""
    return list(dict.fromkeys(frame[list(columns)].itertuples(index=False, name=None)))


def _err(rows: Iterable[Optional[pd.Series]]) -> str:
    values = [r["max_rel_err"] for r in rows if r is not None and math.isfinite(r["max_rel_err"])]
    return f"{max(values):.1e}" if values else "–"


def _schedule(row: Optional[pd.Series]) -> str:
    return "–" if row is None or not row["schedule"] else _short_schedule(row["schedule"])


def _breaks(row: Optional[pd.Series]) -> str:
    if row is None or not math.isfinite(row["graph_breaks"]):
        return "–"
    return f"{int(row['graph_breaks'])} ({int(row['graphs'])} graphs)"


# -- tables ----------------------------------------------------------------------------------
def headline_tables(frame: pd.DataFrame) -> str:
    """The issue's setting: times, memory and speed-ups per (graph, op)."""
    at = _index(frame, ("graph", "op", "pass", "method"))
    get = lambda g, o, p, m: at.get((g, o, p, m))  # noqa: E731
    cases = _unique(frame, ("graph", "op"))
    times = []
    ratios = []
    for g, o in cases:
        row = [g, o]
        for pass_, methods in HEADLINE_METHODS.items():
            row += [_cell(get(g, o, pass_, m)) for m in methods]
        times.append(row)
        ours_b = get(g, o, "fwd+bwd", "ours")
        ratios.append(
            [g, o]
            + [_cell(get(g, o, "fwd+bwd", m), "peak_mib") for m in ("pyg", "pyg_compiled", "ours", "ours_compiled")]
            + [
                _ratio(_speedup(get(g, o, "fwd", "pyg_compiled"), get(g, o, "fwd", "ours"))),
                _ratio(_speedup(get(g, o, "fwd+bwd", "pyg_compiled"), ours_b)),
                _ratio(_speedup(get(g, o, "fwd+bwd", "pyg_compiled"), get(g, o, "fwd+bwd", "ours_compiled"))),
                _ratio(_speedup(get(g, o, "fwd", "cusparse"), get(g, o, "fwd", "ours"))),
                _schedule(get(g, o, "fwd", "ours")),
                _breaks(get(g, o, "fwd+bwd", "ours_compiled")),
                _err(get(g, o, p, m) for p in ("fwd", "fwd+bwd") for m in ("ours", "ours_compiled")),
            ]
        )
    time_header = [
        "graph",
        "op",
        "cuSPARSE fwd",
        "PyG fwd",
        "PyG comp. fwd",
        "ours fwd",
        "ours comp. fwd",
        "floor fwd",
        "PyG f+b",
        "PyG comp. f+b",
        "ours f+b",
        "ours comp. f+b",
        "floor f+b",
    ]
    ratio_header = [
        "graph",
        "op",
        "PyG MiB",
        "PyG comp. MiB",
        "ours MiB",
        "ours comp. MiB",
        "ours fwd vs PyG comp.",
        "ours f+b vs PyG comp.",
        "ours comp. f+b vs PyG comp.",
        "ours fwd vs cuSPARSE",
        "our schedule",
        "graph breaks (ours comp. f+b)",
        "max rel err",
    ]
    return (
        "### Operators: time (ms, median)\n\n"
        + markdown(time_header, times)
        + "\n\n### Operators: peak memory of fwd+bwd (MiB) and speed-ups (above 1: ours is faster)"
        "\n\n" + markdown(ratio_header, ratios)
    )


def layer_table(frame: pd.DataFrame) -> str:
    """One training step per layer: time, peak memory, speed-up over compiled PyG."""
    at = _index(frame, ("layer", "graph", "method"))
    methods = ("pyg", "pyg_compiled", "ours", "ours_compiled")
    rows = []
    for layer, graph in _unique(frame, ("layer", "graph")):
        got = {m: at.get((layer, graph, m)) for m in methods}
        rows.append(
            [layer, graph]
            + [_cell(got[m]) for m in methods]
            + [_cell(got[m], "peak_mib") for m in methods]
            + [
                _ratio(_speedup(got["pyg_compiled"], got["ours"])),
                _ratio(_speedup(got["pyg_compiled"], got["ours_compiled"])),
                _breaks(got["ours_compiled"]),
                _err(got[m] for m in methods[1:]),
                commits(pd.DataFrame([row for row in got.values() if row is not None])),
            ]
        )
    header = [
        "layer",
        "graph",
        "PyG ms",
        "PyG comp. ms",
        "ours ms",
        "ours comp. ms",
        "PyG MiB",
        "PyG comp. MiB",
        "ours MiB",
        "ours comp. MiB",
        "ours vs PyG comp.",
        "ours comp. vs PyG comp.",
        "graph breaks (ours comp.)",
        "max rel err",
        "commit",
    ]
    return "### Layers: one training step (forward, backward, Adam)\n\n" + markdown(header, rows)


def best_per_strategy(frame: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct sweep row per (graph, op, F, strategy)."""
    sweep = frame[(frame.method == "sweep") & (frame.status == "ok")]
    if sweep.empty:
        return sweep
    return sweep.loc[sweep.groupby(["graph", "op", "F", "strategy"]).time_ms.idxmin()]


def ops_tables(frame: pd.DataFrame) -> Tuple[str, str]:
    """(summary over graphs per op, pass and F; the full table per op and pass)."""
    at = _index(frame[frame.method != "sweep"], ("graph", "op", "F", "pass", "method"))
    best = _index(best_per_strategy(frame), ("graph", "op", "F", "strategy"))
    strategies = ("vertex", "edge", "group")
    sections, summary = [], []
    for op, pass_ in _unique(frame, ("op", "pass")):
        rows = []
        part = frame[(frame.op == op) & (frame["pass"] == pass_)]
        for F in sorted(part.F.unique(), key=int):
            speedups, vs_sparse, regrets, errors = [], [], [], []
            gpu_vs_sparse, gpu_vs_compiled, recorded_vs_compiled, oracle_vs_compiled = [], [], [], []
            for (graph,) in _unique(part[part.F == F], ("graph",)):
                get = lambda m: at.get((graph, op, F, pass_, m))  # noqa: E731
                ours = get("ours")
                bests = [best.get((graph, op, F, s)) for s in strategies] if pass_ == "fwd" else []
                best_time = min([t for t in map(_time, bests) if t is not None], default=None)
                regret = _time(ours) / best_time if _time(ours) and best_time else None
                speedups.append(_speedup(get("pyg"), ours))
                vs_sparse.append(_speedup(get("cusparse"), ours))
                gpu_vs_sparse.append(_speedup(get("cusparse"), ours, "gpu_ms"))
                gpu_vs_compiled.append(_speedup(get("pyg_compiled"), ours, "gpu_ms"))
                recorded_vs_compiled.append(_speedup(get("pyg_compiled"), get("ours_recorded"), "gpu_ms"))
                oracle_vs_compiled.append(_speedup(get("pyg_compiled"), get("oracle"), "gpu_ms"))
                regrets.append(regret)
                errors.append(ours)
                rows.append(
                    [graph, F]
                    + [_cell(get(m)) for m in ("floor", "cusparse", "pyg", "pyg_compiled", "ours", "ours_compiled")]
                    + [_cell(get("ours_recorded"), "gpu_ms"), _cell(get("oracle"), "gpu_ms")]
                    + [_schedule(ours), _schedule(get("ours_recorded"))]
                    + [f"{_cell(b)} ({_schedule(b)})" if b is not None else "–" for b in bests]
                    + [_ratio(speedups[-1]), _ratio(regret), _err([ours, get("ours_compiled"), get("ours_recorded")])]
                )
            sweep = part[(part.F == F) & (part.method == "sweep")]
            summary.append(
                [
                    op,
                    pass_,
                    F,
                    str(sum(s is not None for s in speedups)),
                    _ratio(_geomean(speedups)),
                    _ratio(_extreme(min, speedups)),
                    _ratio(_extreme(max, speedups)),
                    _ratio(_geomean(vs_sparse)),
                    _ratio(_geomean(gpu_vs_compiled)),
                    _ratio(_geomean(gpu_vs_sparse)),
                    _ratio(_geomean(recorded_vs_compiled)),
                    _ratio(_geomean(oracle_vs_compiled)),
                    _ratio(_geomean(regrets)),
                    _err(errors),
                    f"{(sweep.status != 'ok').sum()} / {len(sweep)}" if len(sweep) else "–",
                ]
            )
        header = (
            ["graph", "F", "floor", "cuSPARSE", "PyG", "PyG comp.", "ours", "ours comp.", "ours rec. (GPU)"]
            + ["oracle (GPU)"]
            + ["our schedule", "recorded schedule"]
            + ([f"best {s}" for s in strategies] if pass_ == "fwd" else [])
            + ["ours vs PyG", "ours / best sweep", "max rel err"]
        )
        sections.append(f"### {op}, {pass_} (ms)\n\n" + markdown(header, rows))
    summary_header = [
        "op",
        "pass",
        "F",
        "graphs",
        "ours vs PyG (geo-mean)",
        "min",
        "max",
        "ours vs cuSPARSE",
        "GPU time: ours vs PyG comp.",
        "GPU time: ours vs cuSPARSE",
        "GPU time: ours rec. vs PyG comp.",
        "GPU time: oracle vs PyG comp.",
        "ours / best sweep",
        "max rel err",
        "sweep rows not ok",
    ]
    summary_text = "### Operators over the corpus\n\n" + markdown(summary_header, summary)
    return summary_text, "\n\n".join(sections)


def _geomean(values: Sequence[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else None


def _extreme(pick: Callable, values: Sequence[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return pick(kept) if kept else None


#: PyG's numbers measured for the project's issue (H100, torch 2.11, PyG 2.8.0): the setup check.
#: (file kind, graph, op or layer, pass, method, column) -> value; operators at F = 128.
ISSUE_NUMBERS = {
    ("ops", "uniform-16M", "copy_u_sum", "fwd", "cusparse", "time_ms"): 3.54,
    ("ops", "uniform-16M", "copy_u_sum", "fwd", "pyg", "time_ms"): 19.5,
    ("ops", "uniform-16M", "copy_u_sum", "fwd", "pyg_compiled", "time_ms"): 9.69,
    ("ops", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg", "time_ms"): 45.5,
    ("ops", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg_compiled", "time_ms"): 19.7,
    ("ops", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg", "peak_mib"): 8789,
    ("ops", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg_compiled", "peak_mib"): 977,
    ("ops", "uniform-16M", "copy_u_max", "fwd", "pyg_compiled", "time_ms"): 21.1,
    ("ops", "uniform-16M", "copy_u_max", "fwd+bwd", "pyg_compiled", "time_ms"): 53.2,
    ("layers", "uniform-4M", "GCNConv", "step", "pyg", "time_ms"): 17.5,
    ("layers", "uniform-4M", "GCNConv", "step", "pyg_compiled", "time_ms"): 6.27,
}


def setup_check(ops: Optional[pd.DataFrame], layers: Optional[pd.DataFrame]) -> Optional[str]:
    """Our measurements of PyG next to the issue's, where both exist."""
    frames = {"ops": ops, "layers": layers}
    rows = []
    for (kind, graph, what, pass_, method, column), expected in ISSUE_NUMBERS.items():
        frame = frames[kind]
        if frame is None:
            continue
        if kind == "layers":
            match = frame[(frame.graph == graph) & (frame.layer == what) & (frame.method == method)]
        else:
            match = frame[
                (frame.graph == graph)
                & (frame.op == what)
                & (frame["pass"] == pass_)
                & (frame.method == method)
                & (frame.F == "128")
            ]
        if len(match):
            got = _time(match.iloc[-1], column)
            rows.append(
                [
                    graph,
                    what,
                    pass_,
                    method,
                    column,
                    _number(expected),
                    _cell(match.iloc[-1], column),
                    _ratio(got / expected if got is not None else None),
                ]
            )
    if not rows:
        return None
    return "### Setup check: PyG as measured for the issue\n\n" + markdown(
        ["graph", "op / layer", "pass", "method", "quantity", "issue", "here", "here / issue"], rows
    )


def side_by_side(frame: pd.DataFrame) -> pd.DataFrame:
    """Training rows as one row per (dataset, model, compile mode, batching): accuracy and epoch
    and step times of both implementations, and our speed-up."""
    index = ["dataset", "model", "compile_mode", "batch_size", "batch_graphs"]
    table = frame.pivot_table(
        index=index, columns="impl", values=["test_acc", "epoch_ms", "step_ms"], aggfunc="first", sort=False
    )
    table.columns = [f"{value}_{impl}" for value, impl in table.columns]
    table["commit"] = frame.groupby(index, sort=False, dropna=False).apply(commits)
    for column in ("epoch_ms_pyg", "epoch_ms_ours"):
        if column not in table:
            table[column] = math.nan
    table["speedup"] = table["epoch_ms_pyg"] / table["epoch_ms_ours"]
    return table.reset_index()


def _batching(batch_size: float, batch_graphs: str) -> str:
    if not batch_size or not math.isfinite(batch_size):
        return "full batch"
    return f"batches of {int(batch_size)}" + (", one graph" if batch_graphs == "same" else "")


def train_table(frame: pd.DataFrame) -> str:
    """Whole models: ms per step (per epoch for full batch) and test accuracy, ours / eager PyG."""
    rows = []
    for row in side_by_side(frame).itertuples(index=False):
        unit = "step_ms" if row.batch_size else "epoch_ms"
        rows.append(
            [
                row.dataset,
                row.model,
                row.compile_mode,
                _batching(row.batch_size, row.batch_graphs),
                _number(getattr(row, f"{unit}_ours", math.nan)),
                _number(getattr(row, f"{unit}_pyg", math.nan)),
                _ratio(row.speedup),
                _number(getattr(row, "test_acc_ours", math.nan)),
                _number(getattr(row, "test_acc_pyg", math.nan)),
                row.commit,
            ]
        )
    header = [
        "dataset",
        "model",
        "mode",
        "batching",
        "ours ms",
        "PyG ms",
        "ours vs PyG",
        "ours acc.",
        "PyG acc.",
        "commit",
    ]
    return "### Training: ms per step (mini-batches) or per epoch (full batch)\n\n" + markdown(header, rows)


def _distributed_case(row) -> str:
    compiled = "" if row.compile_mode == "eager" else f" {row.compile_mode}"
    return f"{row.graph}\n{row.model} {row.mode}{compiled}"


def distributed_table(frame: pd.DataFrame) -> str:
    """Training on several ranks: epoch time, throughput, and the partitioned runs' halo."""
    rows = []
    for row in frame.itertuples(index=False):
        timed = row.status in TIMED
        rows.append(
            [
                row.mode,
                row.graph,
                row.model,
                row.compile_mode,
                str(int(row.world_size)),
                _number(row.epoch_ms) if timed else row.status,
                _number(row.edges_per_s),
                _number(getattr(row, "scaling", math.nan)),
                _number(row.comm_ms_per_layer),
                _number(row.halo_mib_per_layer),
                _number(row.peak_mib),
                row.commit,
            ]
        )
    header = [
        "mode",
        "graph",
        "model",
        "compile",
        "ranks",
        "epoch ms",
        "edges/s",
        "scaling",
        "comm ms/layer",
        "halo MiB/layer",
        "peak MiB/rank",
        "commit",
    ]
    return "### Training on several ranks\n\n" + markdown(header, rows)


# -- plots -----------------------------------------------------------------------------------
#: One colour per method in every plot, whichever methods a panel shows.
COLORS = {"cusparse": "C0", "pyg": "C1", "pyg_compiled": "C2", "ours": "C3", "ours_compiled": "C4", "floor": "C7"}


def _save_figure(fig, title: str, path: Path) -> None:
    """Title ``fig``, lay it out, write it to ``path`` and close it."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(
    ax, groups: Sequence[str], series: Dict[str, Sequence[Optional[float]]], ylabel: str, log: bool = True
) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=label, color=COLORS.get(label))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log and any(v for values in series.values() for v in values):  # log of nothing warns
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.5, not 5 x 10^-1
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="y", alpha=0.3)


def headline_plot(frame: pd.DataFrame, path: Path) -> None:
    """Median ms per method of each (graph, op, F), a panel per pass."""
    frame = frame[frame.method != "sweep"]
    at = _index(frame, ("graph", "op", "F", "pass", "method"))
    cases = _unique(frame, ("graph", "op", "F"))
    labels = [f"{o}\n{g}, F={F}" for g, o, F in cases]
    fig, axes = plt.subplots(1, 2, figsize=(max(14.0, 1.4 * len(cases) + 4), 5))
    for ax, (pass_, methods) in zip(axes, HEADLINE_METHODS.items()):
        _bars(ax, labels, {m: [_time(at.get((g, o, F, pass_, m))) for g, o, F in cases] for m in methods}, "ms")
        ax.set_title(pass_)
        ax.legend(fontsize=8)
    _save_figure(fig, f"operators, {frame.gpu.iloc[0]}, commit {commits(frame)}", path)


def layer_plot(frame: pd.DataFrame, path: Path) -> None:
    at = _index(frame, ("layer", "graph", "method"))
    graphs = list(dict.fromkeys(frame.graph))
    layers = list(dict.fromkeys(frame.layer))
    fig, axes = plt.subplots(1, len(graphs), figsize=(7 * len(graphs), 5), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        _bars(
            ax,
            layers,
            {
                m: [_time(at.get((layer, graph, m))) for layer in layers]
                for m in ("pyg", "pyg_compiled", "ours", "ours_compiled")
            },
            "ms per step",
        )
        ax.set_title(f"training step, {graph}")
    axes[0][0].legend(fontsize=8)
    _save_figure(fig, f"layers, {frame.gpu.iloc[0]}, commit {commits(frame)}", path)


def ops_plot(frame: pd.DataFrame, path: Path) -> None:
    """Our speed-up over eager PyG per graph, one panel per (op, pass), one bar per F."""
    frame = frame[frame.method != "sweep"]
    at = _index(frame, ("graph", "op", "F", "pass", "method"))
    panels = _unique(frame, ("op", "pass"))
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax, (op, pass_) in zip(axes.flat, panels):
        part = frame[(frame.op == op) & (frame["pass"] == pass_)]
        graphs = list(dict.fromkeys(part.graph))
        features = sorted(part.F.unique(), key=int)
        speedups = {
            f"F={F}": [_speedup(at.get((g, op, F, pass_, "pyg")), at.get((g, op, F, pass_, "ours"))) for g in graphs]
            for F in features
        }
        _bars(ax, graphs, speedups, "speed-up vs PyG")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{op} {pass_}")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    _save_figure(fig, f"operators, {frame.gpu.iloc[0]}, commit {commits(frame)}", path)


def train_plot(frame: pd.DataFrame, path: Path) -> None:
    """Time per step or epoch and test accuracy per (dataset, model, batching), ours next to PyG."""
    table = side_by_side(frame)
    labels = [
        f"{r.dataset}\n{r.model} {r.compile_mode}\n{_batching(r.batch_size, r.batch_graphs)}"
        for r in table.itertuples(index=False)
    ]
    unit = ["step_ms" if b else "epoch_ms" for b in table.batch_size]
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(labels) + 2), 8), sharex=True)
    times = {
        impl: [getattr(r, f"{u}_{impl}", None) for r, u in zip(table.itertuples(index=False), unit)]
        for impl in ("pyg", "ours")
    }
    _bars(axes[0], labels, times, "ms per step (mini-batches) or epoch")
    accuracy = {impl: list(table.get(f"test_acc_{impl}", [None] * len(table))) for impl in ("pyg", "ours")}
    _bars(axes[1], labels, accuracy, "test accuracy", log=False)
    axes[0].legend(fontsize=8)
    _save_figure(fig, f"training, {frame.gpu.iloc[0]}, commit {commits(frame)}", path)


def steps_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, batching, model), one ``<impl> <mode>`` column of ms per step each."""
    timed = frame[frame.status.isin(TIMED)]
    table = timed.pivot_table(
        index=["dataset", "batching", "model"], columns=["impl", "mode"], values="step_ms", aggfunc="last"
    )
    table.columns = [f"{impl} {mode}" for impl, mode in table.columns]
    return table.reset_index()


def steps_plot(frame: pd.DataFrame, path: Path) -> None:
    """Speed-up of every way of running a step over eager PyG, per (dataset, batching, model)."""
    table = steps_table(frame)
    if "pyg eager" not in table:
        return
    labels = [f"{r.dataset}\n{r.model} {r.batching}" for r in table.itertuples(index=False)]
    columns = [c for c in table.columns[3:] if c != "pyg eager"]
    series = {c: [table["pyg eager"].iloc[i] / table[c].iloc[i] for i in range(len(table))] for c in columns}
    series = {c: [None if pd.isna(v) else v for v in values] for c, values in series.items()}
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(labels) + 3), 5))
    _bars(ax, labels, series, "speed-up over eager PyG (wall clock per step)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend(fontsize=7, ncol=2)
    _save_figure(fig, f"training steps, {frame.gpu.iloc[0]}, commit {commits(frame)}", path)


def small_graph_rule_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed rows of ``small_graph_rule.csv`` (``F`` as an int), each with ``ratio``: its time
    over the best of its case (commit, graph, edge order, op, ``F``)."""
    timed = frame[frame.status.isin(TIMED)].assign(F=lambda f: f.F.astype(float).astype(int))
    case = ["commit", "graph", "edge_order", "op", "F"]
    return timed.assign(ratio=timed.time_ms / timed.groupby(case).time_ms.transform("min"))


def small_graph_rule_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per commit, edge order and ``F``: the small-graph rule's time over the best edge-parallel
    schedule of its case (geometric mean and worst over the graphs and operators), and the same for
    the one schedule best in the geometric mean (``best_fixed``)."""
    timed = small_graph_rule_ratios(frame)
    records = []
    for (commit, order, F), part in timed.groupby(["commit", "edge_order", "F"], sort=False):
        per_config = part.groupby("config").ratio.agg(lambda r: _geomean(list(r)))
        rule = part[part.rule == 1].ratio
        best = per_config.idxmin()
        records.append(
            {
                "commit": commit,
                "edge_order": order,
                "F": F,
                "cases": part.groupby(["graph", "op"]).ngroups,
                "rule_geomean": _geomean(list(rule)) if len(rule) else np.nan,
                "rule_worst": float(rule.max()) if len(rule) else np.nan,
                "best_fixed": best,
                "best_fixed_geomean": float(per_config[best]),
                "best_fixed_worst": float(part[part.config == best].ratio.max()),
            }
        )
    return pd.DataFrame(records)


def small_graph_rule_table(frame: pd.DataFrame) -> str:
    """The :func:`small_graph_rule_summary` as markdown."""
    table = small_graph_rule_summary(frame)
    header = ["commit", "edge order", "F", "cases", "rule / best", "rule worst", "best fixed schedule", "its / best"]
    body = [
        [r.commit, r.edge_order, str(r.F), str(r.cases), _number(r.rule_geomean), _number(r.rule_worst)]
        + [f"`{r.best_fixed}`", _number(r.best_fixed_geomean)]
        for r in table.itertuples(index=False)
    ]
    return "### The small-graph rule\n\n" + markdown(header, body)


def small_graph_rule_plot(frame: pd.DataFrame, path: Path) -> None:
    """The rule's time over the best edge-parallel schedule of each graph (geometric mean over the
    operators), per width, of the newest commit, in each edge order."""
    timed = small_graph_rule_ratios(frame)
    timed = timed[timed.commit == timed.commit.iloc[-1]]
    rule = timed[timed.rule == 1].groupby(["edge_order", "graph", "F"]).ratio.agg(lambda r: _geomean(list(r)))
    orders = list(dict.fromkeys(timed.edge_order))
    fig, axes = plt.subplots(1, len(orders), figsize=(6.5 * len(orders), 4.5), squeeze=False)
    for ax, order in zip(axes[0], orders):
        part = rule.loc[order].unstack("F")
        series = {f"F = {F}": [None if pd.isna(v) else v for v in part[F]] for F in part.columns}
        _bars(ax, list(part.index), series, "rule / best edge-parallel schedule")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"edges in {order} order")
        ax.legend(fontsize=7)
    _save_figure(fig, f"small-graph rule, {frame.gpu.iloc[-1]}, commit {timed.commit.iloc[-1]}", path)


def host_calls_newest(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed rows of ``host_calls.csv`` of each case's newest commit (the commit of its last
    row), one per (graph, ``F``, case, pass): ``host_us`` of ``pyg`` and ``ours`` side by side, and
    that ``commit``. A run of a few cases leaves the others' newest rows in the table."""
    columns = ["graph", "F", "case", "pass"]
    timed = frame[frame.status.isin(TIMED)]
    if timed.empty:
        return pd.DataFrame(columns=columns + ["pyg", "ours", "commit"])
    timed = timed.assign(F=lambda f: f.F.astype(float).astype(int))
    timed = timed[timed.commit == timed.groupby(columns).commit.transform("last")]
    wide = timed.pivot_table(index=columns + ["commit"], columns="impl", values="host_us", aggfunc="last")
    return wide.reindex(columns=["pyg", "ours"]).reset_index()[columns + ["pyg", "ours", "commit"]]


def host_calls_table(frame: pd.DataFrame) -> str:
    """Host microseconds per call of each case's newest commit, PyG's against ours, as markdown."""
    table = host_calls_newest(frame)
    header = ["graph", "F", "case", "pass", "PyG host µs", "ours host µs", "PyG / ours", "commit"]
    body = [
        [
            r["graph"],
            str(r["F"]),
            r["case"],
            r["pass"],
            _number(r["pyg"]),
            _number(r["ours"]),
            _ratio(r["pyg"] / r["ours"]),
            str(r["commit"]),
        ]
        for r in table.to_dict("records")
    ]
    return "### Host time per call\n\n" + markdown(header, body)


def host_calls_plot(frame: pd.DataFrame, path: Path) -> None:
    """Host microseconds per call of each case's newest commit, PyG's and ours, per case and pass,
    a panel per graph and ``F``."""
    table = host_calls_newest(frame)
    if table.empty:
        return
    panels = list(dict.fromkeys(zip(table.graph, table.F)))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (graph, F) in zip(axes[0], panels):
        part = table[(table.graph == graph) & (table.F == F)]
        labels = [f"{c}\n{p}" for c, p in zip(part.case, part["pass"])]
        series = {impl: [None if pd.isna(v) else v for v in part[impl]] for impl in ("pyg", "ours")}
        _bars(ax, labels, series, "host µs per call")
        ax.set_title(f"{graph}, F = {F}")
        ax.legend(fontsize=7)
    commits = ", ".join(dict.fromkeys(table.commit.astype(str)))
    _save_figure(fig, f"host time per call, {frame.gpu.iloc[-1]}, commits {commits}", path)


def selection_timed(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed rows of ``selection.csv`` as :func:`load` reads it: the newest row of each (graph,
    op, ``F``, dtype), in the order of those rows."""
    return frame[frame.status.isin(TIMED)]


def selection_table(frame: pd.DataFrame) -> str:
    """Per graph, what chose the schedules and the median, over its cases, of each time, as markdown."""
    newest = selection_timed(frame)
    header = ["graph", "edges", "chooser", "cases", "statistics µs", "uncached µs (max)", "cached µs", "commit"]
    body = []
    for graph, part in newest.groupby("graph", sort=False):
        body.append(
            [
                str(graph),
                f"{int(part.num_edges.iloc[0]):,}",
                ", ".join(dict.fromkeys(part.chooser.astype(str))),
                str(len(part)),
                _number(part.stats_us.median()),
                f"{_number(part.uncached_us.median())} ({_number(part.uncached_us.max())})",
                _number(part.cached_us.median()),
                ", ".join(dict.fromkeys(part.commit.astype(str))),
            ]
        )
    return "### Choosing a schedule\n\n" + markdown(header, body)


def selection_plot(frame: pd.DataFrame, path: Path) -> None:
    """Microseconds of the statistics, an uncached and a cached decision per graph (median over its
    operators and widths), of each case's newest commit."""
    newest = selection_timed(frame)
    if newest.empty:
        return
    per_graph = newest.groupby("graph", sort=False)[["stats_us", "uncached_us", "cached_us"]].median()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(per_graph) + 2), 4.5))
    series = {
        "statistics": list(per_graph.stats_us),
        "uncached decision": list(per_graph.uncached_us),
        "cached decision": list(per_graph.cached_us),
    }
    _bars(ax, list(per_graph.index), series, "µs (median over operators and widths)")
    ax.legend(fontsize=8)
    _save_figure(fig, f"choosing a schedule, {frame.gpu.iloc[-1]}, commit {commits(newest)}", path)


def distributed_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed rows of each case's newest commit (the commit of its last row), one row per case
    and number of ranks: the median of that commit's launches of it (``launches`` counts them)."""
    case = ["mode", "graph", "model", "compile_mode"]
    timed = frame[frame.status.isin(TIMED)]
    timed = timed[timed.commit == timed.groupby(case).commit.transform("last")]
    grouped = timed.groupby(case + ["world_size", "commit"], sort=False)
    runs = grouped[["edges_per_s", "epoch_ms", "compute_ms", "comm_ms"]].median()
    runs["launches"] = grouped.size()
    return runs.reset_index()


def distributed_plot(frame: pd.DataFrame, path: Path) -> None:
    """Edges per second of every case per number of ranks, of each case's newest commit (median of
    its launches); the partitioned cases' epoch split into compute and halo exchanges."""
    runs = distributed_runs(frame)
    if runs.empty:
        return
    cases = _unique(runs, ("mode", "graph", "model", "compile_mode"))
    sizes = sorted({int(w) for w in runs.world_size})
    at = {(r.mode, r.graph, r.model, r.compile_mode, int(r.world_size)): r for r in runs.itertuples(index=False)}
    labels = [_distributed_case(at[case + (next(w for w in sizes if case + (w,) in at),)]) for case in cases]
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.2 * len(labels) + 2), 8))
    throughput = {
        f"{w} rank{'s' if w > 1 else ''}": [getattr(at.get(case + (w,)), "edges_per_s", None) for case in cases]
        for w in sizes
    }
    _bars(axes[0], labels, throughput, "edges per second (median of launches)")
    axes[0].legend(fontsize=8)
    split = [(case, w) for case in cases if case[0] == "partitioned" for w in sizes if case + (w,) in at]
    split_labels = [f"{_distributed_case(at[case + (w,)])}\n{w} rank{'s' if w > 1 else ''}" for case, w in split]
    parts = {
        "compute": [at[case + (w,)].compute_ms for case, w in split],
        "halo exchanges": [at[case + (w,)].comm_ms for case, w in split],
    }
    _bars(axes[1], split_labels, parts, "ms per epoch (slowest rank)", log=False)
    axes[1].legend(fontsize=8)
    _save_figure(fig, f"training on several ranks, {frame.gpu.iloc[0]}, commit {commits(runs)}", path)


def plot(csv: Path) -> Optional[Path]:
    """Draw the PNG beside a results CSV (same name, ``.png``) from the newest row of each case;
    returns its path, or ``None`` when the file has no rows to draw."""
    csv = Path(csv)
    kind = kind_of(csv)
    frame = load(csv)
    if frame is not None and kind == "ops":
        frame = frame[~frame.method.isin(["load", "sweep"])]
    if frame is None or frame.empty:
        return None
    png = csv.with_name(csv.name.split(".")[0] + ".png")
    if kind == "layers":
        layer_plot(frame, png)
    elif kind == "train_e2e":
        train_plot(frame, png)
    elif kind == "distributed":
        distributed_plot(frame, png)
    elif kind == "steps":
        steps_plot(frame, png)
    elif kind == "small_graph_rule":
        small_graph_rule_plot(frame, png)
    elif kind == "host_calls":
        host_calls_plot(frame, png)
    elif kind == "selection":
        selection_plot(frame, png)
    elif len(_unique(frame, ("graph", "op", "F"))) <= FEW_CASES:
        headline_plot(frame, png)
    else:
        ops_plot(frame, png)
    return png


# -- the report ------------------------------------------------------------------------------
def environment_line(name: str, frame: pd.DataFrame) -> str:
    newest = frame.iloc[-1]
    return (
        f"`{name}`: {newest['gpu']} ({newest['timer']} timer), commit {commits(frame)}, torch "
        f"{newest['torch']}, Triton {newest['triton']}, PyG {newest['torch_geometric']}, {newest['date']}."
    )


def write_report(out_dir: Path) -> str:
    """Tables of the newest row of each case of every results CSV in ``out_dir`` and their plots;
    returns the markdown, also written to ``out_dir/report.md``.

    ``ops.md`` holds the ops suite's per-graph tables, too long for the summary.
    """
    out_dir = Path(out_dir)
    frames = {kind: load(out_dir / f"{kind}.csv") for kind in KINDS}
    parts = ["## Benchmarks"]
    parts += [environment_line(f"{kind}.csv", f) for kind, f in frames.items() if f is not None] or ["No results yet."]
    ops = frames["ops"]
    if ops is not None:
        failed = ops[ops.method == "load"]
        if len(failed):
            parts.append(
                "Graphs that could not load: "
                + "; ".join(f"{r.graph} ({r.status}: {r.note})" for r in failed.itertuples())
            )
        ops = ops[ops.method != "load"]
        ops = ops if len(ops) else None
    check = setup_check(ops, frames["layers"])
    if check:
        parts.append(check)
    for kind in KINDS:
        png = plot(out_dir / f"{kind}.csv") if frames[kind] is not None else None
        if kind == "ops" and ops is not None:
            headline = ops[ops.suite == "headline"]
            if len(headline):
                parts.append(headline_tables(headline))
            corpus = ops[ops.suite == "ops"]
            if len(corpus):
                summary, full = ops_tables(corpus)
                parts.append(summary + "\n\nPer-graph tables: [ops.md](ops.md)")
                (out_dir / "ops.md").write_text(full + "\n")
        elif kind == "layers" and frames[kind] is not None:
            parts.append(layer_table(frames[kind]))
        elif kind == "train_e2e" and frames[kind] is not None:
            parts.append(train_table(frames[kind]))
        elif kind == "distributed" and frames[kind] is not None:
            parts.append(distributed_table(frames[kind]))
        elif kind == "small_graph_rule" and frames[kind] is not None:
            parts.append(small_graph_rule_table(frames[kind]))
        elif kind == "host_calls" and frames[kind] is not None:
            parts.append(host_calls_table(frames[kind]))
        elif kind == "selection" and frames[kind] is not None:
            parts.append(selection_table(frames[kind]))
        if png is not None:
            parts.append(f"![{kind}]({png.name})")
    text = "\n\n".join(parts) + "\n"
    (out_dir / "report.md").write_text(text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", help="a results folder: report.md and every plot")
    parser.add_argument("--plot", type=Path, nargs="+", metavar="CSV", help="redraw these CSVs' plots only")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.plot is None):
        parser.error("give a results folder or --plot CSV ..., not both")
    if args.plot:
        for csv in args.plot:
            if not csv.exists():
                parser.error(f"--plot: no file {csv}")
            print(plot(csv) or f"{csv}: no rows to plot")
        return
    print(write_report(args.out))


if __name__ == "__main__":
    main()
