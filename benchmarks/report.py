"""Results files, markdown tables and plots.

Every suite writes one tidy CSV (one row per measurement) into the output folder, a row as soon
as it is measured, so a run cut short keeps what it measured and ``--resume`` measures only the
rest. The report is rebuilt from those CSVs alone::

    python -m benchmarks.report DIR      # DIR/report.md and DIR/*.png; prints the markdown

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
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

OPS_COLUMNS = ("suite", "graph", "graph_kind", "num_nodes", "num_edges", "op", "F", "dtype", "pass",
               "method", "config", "strategy", "schedule", "time_ms", "host_ms", "peak_mib", "first_call_s",
               "max_rel_err", "graphs", "graph_breaks", "status", "note", "device", "timer", "torch",
               "triton", "pyg", "date")
#: What identifies an operator measurement (``config``: the schedule a sweep row asked for).
OPS_KEY = ("graph", "op", "F", "pass", "method", "config")
LAYER_COLUMNS = ("suite", "layer", "graph", "graph_kind", "num_nodes", "num_edges", "F", "method",
                 "time_ms", "host_ms", "peak_mib", "first_call_s", "max_rel_err", "graphs", "graph_breaks",
                 "status", "note", "device", "timer", "torch", "triton", "pyg", "date")
LAYER_KEY = ("layer", "graph", "method")
NUMERIC = ("num_nodes", "num_edges", "time_ms", "host_ms", "peak_mib", "first_call_s", "max_rel_err", "graphs",
           "graph_breaks")
#: Suite -> (file, columns, key).
FILES = {"headline": ("headline.csv", OPS_COLUMNS, OPS_KEY), "ops": ("ops.csv", OPS_COLUMNS, OPS_KEY),
         "layers": ("layers.csv", LAYER_COLUMNS, LAYER_KEY)}
TIMED = ("ok", "mismatch")
#: The headline's columns per pass.
HEADLINE_METHODS = {"fwd": ("cusparse", "pyg", "pyg_compiled", "ours", "ours_compiled", "floor"),
                    "fwd+bwd": ("pyg", "pyg_compiled", "ours", "ours_compiled", "floor")}


def read(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """A results CSV: text columns as str ("" when empty, so keys compare), numbers as floats."""
    numeric = [c for c in columns if c in NUMERIC]
    return pd.read_csv(path, dtype={c: str for c in columns if c not in NUMERIC},
                       keep_default_na=False, na_values={c: [""] for c in numeric})


class ResultsFile:
    """One suite's CSV, appended row by row.

    Without ``resume`` an existing file is replaced; with it, its rows count as done and
    :meth:`done` tells the suite what to skip.
    """

    def __init__(self, path: Path, columns: Sequence[str], key: Sequence[str], resume: bool) -> None:
        self.path, self.columns, self.key = Path(path), tuple(columns), tuple(key)
        self._done = set()
        if self.path.exists():
            if resume:
                frame = read(self.path, self.columns)
                if list(frame.columns) != list(self.columns):
                    # Written by a version with other columns: rewrite it in these before appending.
                    frame = frame.reindex(columns=list(self.columns))
                    frame.to_csv(self.path, index=False)
                self._done = {tuple(r) for r in frame[list(self.key)].itertuples(index=False)}
            else:
                self.path.unlink()

    def done(self, key: Tuple[str, ...]) -> bool:
        return key in self._done

    def write(self, row: dict) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"row: unknown columns {sorted(unknown)}")
        frame = pd.DataFrame([{c: row.get(c, "") for c in self.columns}])
        frame.to_csv(self.path, mode="a", header=not self.path.exists(), index=False)
        self._done.add(tuple(str(row.get(c, "")) for c in self.key))


def load(out_dir: Path, suite: str) -> Optional[pd.DataFrame]:
    """A suite's rows, the last one of each key (a resumed run may repeat a key), or ``None``."""
    name, columns, key = FILES[suite]
    path = Path(out_dir) / name
    if not path.exists():
        return None
    frame = read(path, columns).drop_duplicates(subset=list(key), keep="last")
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


def _speedup(slow: Optional[pd.Series], fast: Optional[pd.Series]) -> Optional[float]:
    a, b = _time(slow), _time(fast)
    return a / b if a is not None and b else None


def _short_schedule(text: str) -> str:
    """``vertex:block_v=4,block_e=16,...`` as ``vertex v4 e16 f64 w4 s1``."""
    if ":" not in text:
        return text
    strategy, _, knobs = text.partition(":")
    short = {"block_v": "v", "block_e": "e", "block_f": "f", "group_size": "g", "num_warps": "w",
             "num_stages": "s"}
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
        ratios.append([g, o] + [_cell(get(g, o, "fwd+bwd", m), "peak_mib")
                                for m in ("pyg", "pyg_compiled", "ours", "ours_compiled")] + [
            _ratio(_speedup(get(g, o, "fwd", "pyg_compiled"), get(g, o, "fwd", "ours"))),
            _ratio(_speedup(get(g, o, "fwd+bwd", "pyg_compiled"), ours_b)),
            _ratio(_speedup(get(g, o, "fwd+bwd", "pyg_compiled"), get(g, o, "fwd+bwd", "ours_compiled"))),
            _ratio(_speedup(get(g, o, "fwd", "cusparse"), get(g, o, "fwd", "ours"))),
            _schedule(get(g, o, "fwd", "ours")),
            _breaks(get(g, o, "fwd+bwd", "ours_compiled")),
            _err(get(g, o, p, m) for p in ("fwd", "fwd+bwd") for m in ("ours", "ours_compiled"))])
    time_header = ["graph", "op", "cuSPARSE fwd", "PyG fwd", "PyG comp. fwd", "ours fwd",
                   "ours comp. fwd", "floor fwd", "PyG f+b", "PyG comp. f+b", "ours f+b",
                   "ours comp. f+b", "floor f+b"]
    ratio_header = ["graph", "op", "PyG MiB", "PyG comp. MiB", "ours MiB", "ours comp. MiB",
                    "ours fwd vs PyG comp.", "ours f+b vs PyG comp.", "ours comp. f+b vs PyG comp.",
                    "ours fwd vs cuSPARSE", "our schedule", "graph breaks (ours comp. f+b)", "max rel err"]
    return ("### Operators: time (ms, median)\n\n" + markdown(time_header, times) +
            "\n\n### Operators: peak memory of fwd+bwd (MiB) and speed-ups (above 1: ours is faster)"
            "\n\n" + markdown(ratio_header, ratios))


def layer_table(frame: pd.DataFrame) -> str:
    """One training step per layer: time, peak memory, speed-up over compiled PyG."""
    at = _index(frame, ("layer", "graph", "method"))
    methods = ("pyg", "pyg_compiled", "ours", "ours_compiled")
    rows = []
    for layer, graph in _unique(frame, ("layer", "graph")):
        got = {m: at.get((layer, graph, m)) for m in methods}
        rows.append([layer, graph] + [_cell(got[m]) for m in methods] +
                    [_cell(got[m], "peak_mib") for m in methods] +
                    [_ratio(_speedup(got["pyg_compiled"], got["ours"])),
                     _ratio(_speedup(got["pyg_compiled"], got["ours_compiled"])),
                     _breaks(got["ours_compiled"]), _err(got[m] for m in methods[1:])])
    header = ["layer", "graph", "PyG ms", "PyG comp. ms", "ours ms", "ours comp. ms", "PyG MiB",
              "PyG comp. MiB", "ours MiB", "ours comp. MiB", "ours vs PyG comp.",
              "ours comp. vs PyG comp.", "graph breaks (ours comp.)", "max rel err"]
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
            for (graph,) in _unique(part[part.F == F], ("graph",)):
                get = lambda m: at.get((graph, op, F, pass_, m))  # noqa: E731
                ours = get("ours")
                bests = [best.get((graph, op, F, s)) for s in strategies] if pass_ == "fwd" else []
                best_time = min([t for t in map(_time, bests) if t is not None], default=None)
                regret = _time(ours) / best_time if _time(ours) and best_time else None
                speedups.append(_speedup(get("pyg"), ours))
                vs_sparse.append(_speedup(get("cusparse"), ours))
                regrets.append(regret)
                errors.append(ours)
                rows.append([graph, F] + [_cell(get(m)) for m in ("floor", "cusparse", "pyg", "pyg_compiled",
                                                                   "ours", "ours_compiled")] +
                            [_schedule(ours)] +
                            [f"{_cell(b)} ({_schedule(b)})" if b is not None else "–" for b in bests] +
                            [_ratio(speedups[-1]), _ratio(regret), _err([ours, get("ours_compiled")])])
            sweep = part[(part.F == F) & (part.method == "sweep")]
            summary.append([op, pass_, F, str(sum(s is not None for s in speedups)),
                            _ratio(_geomean(speedups)), _ratio(_extreme(min, speedups)),
                            _ratio(_extreme(max, speedups)), _ratio(_geomean(vs_sparse)),
                            _ratio(_geomean(regrets)), _err(errors),
                            f"{(sweep.status != 'ok').sum()} / {len(sweep)}" if len(sweep) else "–"])
        header = ["graph", "F", "floor", "cuSPARSE", "PyG", "PyG comp.", "ours", "ours comp.",
                  "our schedule"] + ([f"best {s}" for s in strategies] if pass_ == "fwd" else []) + \
                 ["ours vs PyG", "ours / best sweep", "max rel err"]
        sections.append(f"### {op}, {pass_} (ms)\n\n" + markdown(header, rows))
    summary_header = ["op", "pass", "F", "graphs", "ours vs PyG (geo-mean)", "min", "max",
                      "ours vs cuSPARSE", "ours / best sweep", "max rel err", "sweep rows not ok"]
    summary_text = "### Operators over the corpus\n\n" + markdown(summary_header, summary)
    return summary_text, "\n\n".join(sections)


def _geomean(values: Sequence[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else None


def _extreme(pick: Callable, values: Sequence[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return pick(kept) if kept else None


#: PyG's numbers measured for the project's issue (H100, torch 2.11, PyG 2.8.0): the setup check.
#: (suite, graph, op or layer, pass, method, column) -> value.
ISSUE_NUMBERS = {
    ("headline", "uniform-16M", "copy_u_sum", "fwd", "cusparse", "time_ms"): 3.54,
    ("headline", "uniform-16M", "copy_u_sum", "fwd", "pyg", "time_ms"): 19.5,
    ("headline", "uniform-16M", "copy_u_sum", "fwd", "pyg_compiled", "time_ms"): 9.69,
    ("headline", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg", "time_ms"): 45.5,
    ("headline", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg_compiled", "time_ms"): 19.7,
    ("headline", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg", "peak_mib"): 8789,
    ("headline", "uniform-16M", "copy_u_sum", "fwd+bwd", "pyg_compiled", "peak_mib"): 977,
    ("headline", "uniform-16M", "copy_u_max", "fwd", "pyg_compiled", "time_ms"): 21.1,
    ("headline", "uniform-16M", "copy_u_max", "fwd+bwd", "pyg_compiled", "time_ms"): 53.2,
    ("layers", "uniform-4M", "GCNConv", "step", "pyg", "time_ms"): 17.5,
    ("layers", "uniform-4M", "GCNConv", "step", "pyg_compiled", "time_ms"): 6.27,
}


def setup_check(frames: Dict[str, Optional[pd.DataFrame]]) -> Optional[str]:
    """Our measurements of PyG next to the issue's, where both exist (the F = 128 settings)."""
    rows = []
    for (suite, graph, what, pass_, method, column), expected in ISSUE_NUMBERS.items():
        frame = frames[suite]
        if frame is None:
            continue
        if suite == "layers":
            match = frame[(frame.graph == graph) & (frame.layer == what) & (frame.method == method)]
        else:
            match = frame[(frame.graph == graph) & (frame.op == what) & (frame["pass"] == pass_) &
                          (frame.method == method) & (frame.F == "128")]
        if len(match):
            got = _time(match.iloc[-1], column)
            rows.append([graph, what, pass_, method, column, _number(expected), _cell(match.iloc[-1], column),
                         _ratio(got / expected if got is not None else None)])
    if not rows:
        return None
    return "### Setup check: PyG as measured for the issue\n\n" + markdown(
        ["graph", "op / layer", "pass", "method", "quantity", "issue", "here", "here / issue"], rows)


# -- plots -----------------------------------------------------------------------------------
#: One colour per method in every plot, whichever methods a panel shows.
COLORS = {"cusparse": "C0", "pyg": "C1", "pyg_compiled": "C2", "ours": "C3", "ours_compiled": "C4",
          "floor": "C7"}


def _bars(ax, groups: Sequence[str], series: Dict[str, Sequence[Optional[float]]], ylabel: str,
          log: bool = True) -> None:
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
    at = _index(frame, ("graph", "op", "pass", "method"))
    cases = _unique(frame, ("graph", "op"))
    labels = [f"{o}\n{g}" for g, o in cases]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for ax, (pass_, methods) in zip(axes, HEADLINE_METHODS.items()):
        _bars(ax, labels, {m: [_time(at.get((g, o, pass_, m))) for g, o in cases] for m in methods}, "ms")
        ax.set_title(pass_)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def layer_plot(frame: pd.DataFrame, path: Path) -> None:
    at = _index(frame, ("layer", "graph", "method"))
    graphs = list(dict.fromkeys(frame.graph))
    layers = list(dict.fromkeys(frame.layer))
    fig, axes = plt.subplots(1, len(graphs), figsize=(7 * len(graphs), 5), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        _bars(ax, layers, {m: [_time(at.get((layer, graph, m))) for layer in layers]
                           for m in ("pyg", "pyg_compiled", "ours", "ours_compiled")}, "ms per step")
        ax.set_title(f"training step, {graph}")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ops_plot(frame: pd.DataFrame, path: Path) -> None:
    """Our speed-up over eager PyG per graph, one panel per (op, pass), one bar per F."""
    frame = frame[frame.method != "sweep"]
    at = _index(frame, ("graph", "op", "F", "pass", "method"))
    panels = _unique(frame, ("op", "pass"))
    if not panels:  # only sweep rows so far
        return
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax, (op, pass_) in zip(axes.flat, panels):
        part = frame[(frame.op == op) & (frame["pass"] == pass_)]
        graphs = list(dict.fromkeys(part.graph))
        features = sorted(part.F.unique(), key=int)
        speedups = {f"F={F}": [_speedup(at.get((g, op, F, pass_, "pyg")), at.get((g, op, F, pass_, "ours")))
                               for g in graphs] for F in features}
        _bars(ax, graphs, speedups, "speed-up vs PyG")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{op} {pass_}")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the report ------------------------------------------------------------------------------
def environment_line(frames: Sequence[pd.DataFrame]) -> str:
    first = next(f.iloc[0] for f in frames)
    return (f"Measured on {first['device']} ({first['timer']} timer), torch {first['torch']}, "
            f"Triton {first['triton']}, PyG {first['pyg']}, {first['date']}.")


def write_report(out_dir: Path) -> str:
    """Tables and plots of every suite found in ``out_dir``; returns the markdown (``report.md``).

    ``ops.md`` holds the full per-graph operator tables, which are too long for the README.
    """
    out_dir = Path(out_dir)
    frames = {suite: load(out_dir, suite) for suite in FILES}
    present = [f for f in frames.values() if f is not None]
    parts = ["## Benchmarks", environment_line(present) if present else "No results yet."]
    for suite in ("headline", "ops"):
        frame = frames[suite]
        if frame is None:
            continue
        failed = frame[frame.method == "load"]
        if len(failed):
            parts.append(f"Graphs the {suite} suite could not load: " + "; ".join(
                f"{r.graph} ({r.status}: {r.note})" for r in failed.itertuples()))
        measured = frame[frame.method != "load"]
        frames[suite] = measured if len(measured) else None
    check = setup_check(frames)
    if check:
        parts.append(check)
    if frames["headline"] is not None:
        parts.append(headline_tables(frames["headline"]))
        headline_plot(frames["headline"], out_dir / "headline.png")
        parts.append("![headline](headline.png)")
    if frames["layers"] is not None:
        parts.append(layer_table(frames["layers"]))
        layer_plot(frames["layers"], out_dir / "layers.png")
        parts.append("![layers](layers.png)")
    if frames["ops"] is not None:
        summary, full = ops_tables(frames["ops"])
        parts.append(summary)
        (out_dir / "ops.md").write_text(full + "\n")
        ops_plot(frames["ops"], out_dir / "ops.png")
        parts.append("Per-graph tables: [ops.md](ops.md)\n\n![ops](ops.png)")
    text = "\n\n".join(parts) + "\n"
    (out_dir / "report.md").write_text(text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder a benchmark run wrote")
    print(write_report(parser.parse_args(argv).out))


if __name__ == "__main__":
    main()
