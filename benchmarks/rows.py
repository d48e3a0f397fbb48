"""Result rows and the CSV files they are appended to.

Every suite appends its rows to one CSV per kind of measurement, by default
``benchmarks/results/<gpu>/<kind>.csv`` (:func:`default_out`): ``ops.csv`` (operators, the
``headline`` and ``ops`` suites), ``layers.csv`` (one layer's training step), ``train_e2e.csv``
(whole models, full batch or mini-batches), ``distributed.csv`` (training on several ranks,
``benchmarks.distributed``), ``steps.csv`` (training steps, ``benchmarks.steps``) and
``small_graph_rule.csv`` (edge-parallel schedules on small graphs,
``benchmarks.small_graph_rule``), ``host_calls.csv`` (host time per operator or layer call,
``benchmarks.host_calls``) and ``selection.csv`` (the time of choosing a schedule,
``benchmarks.selection``). A row is appended as soon as it is measured; a file is never
overwritten, its header is written once, and a file written with other columns is
rewritten in the current ones (old rows keep their values, new columns stay empty) before rows
are appended. Each row starts with :data:`ENV_COLUMNS`: when, with which code and where it was
measured.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd
import torch
import torch_geometric
import triton

from autotune.gpus import gpu_slug

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: Set to the commit a copied working tree was made from, where ``git`` cannot tell.
COMMIT_ENV = "PYG_UGRAPHER_COMMIT"

#: Where and with what a row was measured: UTC date, the code's commit (git short hash, ``+dirty``
#: when the working tree had changes, ``unknown`` without git), the device's name, the timer
#: (``cuda_event`` or ``wall``) and the versions of torch, Triton and PyG.
ENV_COLUMNS = ("date", "commit", "gpu", "timer", "torch", "triton", "torch_geometric")
#: Measured timings and peaks shared by the operator and layer files.
MEASURED = ("time_ms", "host_ms", "gpu_ms", "peak_mib", "first_call_s", "max_rel_err", "graphs", "graph_breaks")
STATUS = ("status", "note")
#: Speed-ups of a row over baselines of the same case: baseline ms / this row's ms (above 1: faster).
OPS_BASELINES = ("pyg", "pyg_compiled", "cusparse")
LAYER_BASELINES = ("pyg", "pyg_compiled")


def speedup_columns(baselines: Sequence[str]) -> Tuple[str, ...]:
    return tuple(f"speedup_vs_{b}" for b in baselines)


OPS_COLUMNS = (
    ENV_COLUMNS
    + (
        "suite",
        "graph",
        "graph_kind",
        "num_nodes",
        "num_edges",
        "op",
        "F",
        "dtype",
        "pass",
        "method",
        "config",
        "strategy",
        "schedule",
    )
    + MEASURED
    + speedup_columns(OPS_BASELINES)
    + STATUS
)
#: What identifies an operator measurement (``config``: the schedule a sweep row asked for).
OPS_KEY = ("commit", "suite", "graph", "op", "F", "pass", "method", "config")
LAYER_COLUMNS = (
    ENV_COLUMNS
    + ("suite", "layer", "graph", "graph_kind", "num_nodes", "num_edges", "F", "method")
    + MEASURED
    + speedup_columns(LAYER_BASELINES)
    + STATUS
)
LAYER_KEY = ("commit", "layer", "graph", "method")
TRAIN_COLUMNS = (
    ENV_COLUMNS
    + (
        "dataset",
        "model",
        "impl",
        "compile_mode",
        "num_nodes",
        "num_edges",
        "hidden",
        "batch_size",
        "batch_graphs",
        "epochs",
        "steps",
        "test_acc",
        "val_acc",
        "final_loss",
        "epoch_ms",
        "step_ms",
        "speedup_vs_pyg",
    )
    + STATUS
)
TRAIN_KEY = ("commit", "dataset", "model", "impl", "compile_mode", "batch_size", "batch_graphs")
#: ``benchmarks.distributed``: one training case on ``world_size`` ranks (data-parallel or partitioned).
DISTRIBUTED_COLUMNS = (
    ENV_COLUMNS
    + (
        "mode",
        "graph",
        "model",
        "compile_mode",
        "world_size",
        "launch_ranks",
        "host_gpus",
        "host_cpus",
        "gc_frozen",
        "partition",
        "num_nodes",
        "num_edges",
        "features",
        "hidden",
        "batch_size",
        "epochs",
        "steps",
        "epoch_ms",
        "step_ms",
        "edges_per_s",
        "scaling",
        "comm_ms",
        "compute_ms",
        "comm_ms_per_layer",
        "halo_rows",
        "halo_mib_per_layer",
        "cut_fraction",
        "peak_mib",
        "final_loss",
    )
    + STATUS
)
DISTRIBUTED_KEY = ("commit", "mode", "graph", "model", "compile_mode", "world_size")
#: ``benchmarks.steps``: wall-clock time of one training step, host included, per way of running it.
STEP_COLUMNS = (
    ENV_COLUMNS
    + (
        "dataset",
        "model",
        "impl",
        "mode",
        "batching",
        "num_nodes",
        "num_edges",
        "features",
        "hidden",
        "steps",
        "step_ms",
        "step_ms_iqr",
        "host_syncs",
        "python_calls",
        "kernels",
        "recordings",
        "final_loss",
    )
    + STATUS
)
STEP_KEY = ("commit", "dataset", "model", "impl", "mode", "batching")
#: ``benchmarks.small_graph_rule``: one edge-parallel schedule of a gather on a small graph, its
#: edges in the user's order or sorted (``edge_order``); ``rule``: 1 for the small-graph rule's.
SMALL_GRAPH_RULE_COLUMNS = (
    ENV_COLUMNS + ("graph", "num_nodes", "num_edges", "edge_order", "op", "F", "config", "rule", "time_ms") + STATUS
)
SMALL_GRAPH_RULE_KEY = ("commit", "graph", "edge_order", "op", "F", "config")
#: ``benchmarks.host_calls``: host and wall microseconds per call of an operator or a layer (on a
#: graph seen before, or a new one per call), ours or PyG's, and its Python function calls.
HOST_CALL_COLUMNS = (
    ENV_COLUMNS
    + ("graph", "num_nodes", "num_edges", "F", "case", "pass", "impl", "calls", "host_us", "wall_us", "python_calls")
    + STATUS
)
HOST_CALL_KEY = ("commit", "graph", "F", "case", "pass", "impl")
#: ``benchmarks.selection``: microseconds of choosing one operator's schedule on a graph: its
#: statistics, an uncached decision and a cached one, and what chose (``chooser``).
SELECTION_COLUMNS = (
    ENV_COLUMNS
    + ("graph", "num_nodes", "num_edges", "op", "F", "dtype", "repeats", "chooser", "candidates")
    + ("stats_us", "uncached_us", "cached_us")
    + STATUS
)
SELECTION_KEY = ("commit", "graph", "op", "F", "dtype")


#: File kind -> (columns, key, baselines of its speed-up columns).
KINDS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...], Tuple[str, ...]]] = {
    "ops": (OPS_COLUMNS, OPS_KEY, OPS_BASELINES),
    "layers": (LAYER_COLUMNS, LAYER_KEY, LAYER_BASELINES),
    "train_e2e": (TRAIN_COLUMNS, TRAIN_KEY, ("pyg",)),
    "distributed": (DISTRIBUTED_COLUMNS, DISTRIBUTED_KEY, ()),
    "steps": (STEP_COLUMNS, STEP_KEY, ()),
    "small_graph_rule": (SMALL_GRAPH_RULE_COLUMNS, SMALL_GRAPH_RULE_KEY, ()),
    "host_calls": (HOST_CALL_COLUMNS, HOST_CALL_KEY, ()),
    "selection": (SELECTION_COLUMNS, SELECTION_KEY, ()),
}
NUMERIC = frozenset(
    MEASURED
    + speedup_columns(OPS_BASELINES)
    + (
        "num_nodes",
        "num_edges",
        "hidden",
        "batch_size",
        "epochs",
        "steps",
        "test_acc",
        "val_acc",
        "final_loss",
        "rule",
        "epoch_ms",
        "step_ms",
        "world_size",
        "launch_ranks",
        "host_gpus",
        "host_cpus",
        "gc_frozen",
        "features",
        "edges_per_s",
        "scaling",
        "comm_ms",
        "compute_ms",
        "comm_ms_per_layer",
        "halo_rows",
        "halo_mib_per_layer",
        "cut_fraction",
        "step_ms_iqr",
        "host_syncs",
        "python_calls",
        "kernels",
        "recordings",
        "calls",
        "host_us",
        "wall_us",
        "repeats",
        "candidates",
        "stats_us",
        "uncached_us",
        "cached_us",
    )
)
#: Statuses of rows whose times count.
TIMED = ("ok", "mismatch")


def kind_of(path: Path) -> str:
    """The kind of a results file, from its name (``ops.csv``, ``layers.csv``, ``train_e2e.csv``)."""
    kind = Path(path).name.split(".")[0]
    if kind not in KINDS:
        raise ValueError(f"path: {path} is not a results file; expected one of {', '.join(k + '.csv' for k in KINDS)}")
    return kind


# -- where and with what ---------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def default_out(device: torch.device) -> Path:
    """``benchmarks/results/<gpu>/``, the folder of ``device``'s results."""
    return RESULTS / gpu_slug(device_name(device))


def _git(*args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@lru_cache(maxsize=None)
def commit() -> str:
    """The code's git short hash, ``+dirty`` if tracked files have changes; ``unknown`` without git.

    :data:`COMMIT_ENV` overrides it (a working tree copied without its history)."""
    given = os.environ.get(COMMIT_ENV)
    if given:
        return given
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if changes else "")


def environment(device: torch.device) -> Dict[str, str]:
    """The :data:`ENV_COLUMNS` of the rows a run measures on ``device``."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "gpu": device_name(device),
        "timer": "cuda_event" if device.type == "cuda" else "wall",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "torch_geometric": torch_geometric.__version__,
    }


# -- files -----------------------------------------------------------------------------------------
def read(path: Path, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """A results CSV: text columns as str (``""`` when empty, so keys compare), numbers as floats."""
    columns = columns or KINDS[kind_of(path)][0]
    return pd.read_csv(
        path,
        dtype={c: str for c in columns if c not in NUMERIC},
        keep_default_na=False,
        na_values={c: [""] for c in columns if c in NUMERIC},
    )


def latest(frame: pd.DataFrame, key: Sequence[str]) -> pd.DataFrame:
    """The newest row of each case (``key`` without its commit), whatever its commit: a suite run
    for some cases only (one new layer, say) adds its rows to those of the cases it did not run,
    each row with its commit."""
    if frame.empty:
        return frame
    case = [column for column in key if column != "commit"]
    return frame.drop_duplicates(subset=case, keep="last").reset_index(drop=True)


def commits(frame: pd.DataFrame) -> str:
    """The commits of ``frame``'s rows, newest last (``"a77b0b5"``, ``"bbd18fd, a77b0b5"``)."""
    return ", ".join(dict.fromkeys(str(commit) for commit in frame["commit"]))


def _speedup(baseline: Optional[float], time: float) -> float:
    if baseline is None or not (math.isfinite(baseline) and math.isfinite(time)) or time <= 0:
        return math.nan
    return baseline / time


class ResultsFile:
    """One CSV of results, appended row by row.

    With ``resume``, rows of the current commit already in the file count as done (:meth:`done`)
    and serve as baselines of the speed-up columns; otherwise every row is measured again and
    appended after the old ones.
    """

    def __init__(self, path: Path, resume: bool = False, kind: Optional[str] = None) -> None:
        self.path = Path(path)
        self.kind = kind or kind_of(self.path)
        self.columns, self.key, self.baselines = KINDS[self.kind]
        self._done = set()
        self._times: Dict[Tuple[str, ...], float] = {}
        if self.path.exists():
            frame = read(self.path, self.columns)
            if list(frame.columns) != list(self.columns):
                # Written by a version with other columns: rewrite it in these before appending.
                frame = frame.reindex(columns=list(self.columns))
                frame.to_csv(self.path, index=False)
            if resume:
                for _, row in frame[frame["commit"] == commit()].iterrows():
                    self._remember(row.to_dict())

    @property
    def _time_column(self) -> str:
        return "epoch_ms" if self.kind == "train_e2e" else "time_ms"

    @property
    def _method_column(self) -> str:
        return "impl" if self.kind == "train_e2e" else "method"

    def _key(self, row: dict, **override: str) -> Tuple[str, ...]:
        row = {**row, **override}
        return tuple(_text(row.get(c, "")) for c in self.key)

    def _remember(self, row: dict) -> None:
        key = self._key(row)
        self._done.add(key)
        time = row.get(self._time_column)
        if row.get("status") in TIMED and time is not None and time != "":
            self._times[key] = float(time)
        else:
            self._times.pop(key, None)

    def done(self, row: dict) -> bool:
        """Whether ``row``'s key (the current commit's) is in the file already."""
        return self._key({"commit": commit(), **row}) in self._done

    def write(self, row: dict) -> dict:
        """Append ``row`` (its speed-up columns filled from the baselines' rows of the same case
        that this file has seen); returns the row as written."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"row: unknown columns {sorted(unknown)}")
        row = dict(row)
        time = row.get(self._time_column)
        if row.get("status") in TIMED and isinstance(time, (int, float)):
            for baseline in self.baselines:
                other = self._times.get(self._key(row, **{self._method_column: baseline, "config": ""}))
                row[f"speedup_vs_{baseline}"] = _speedup(other, float(time))
        frame = pd.DataFrame([{c: row.get(c, "") for c in self.columns}])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(self.path, mode="a", header=not self.path.exists(), index=False)
        self._remember(row)
        return row


def _text(value: object) -> str:
    """A key cell as the CSV reads it back (``128``, not ``128.0``; empty for NaN)."""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    return str(value)


def write_rows(path: Path, rows: Iterable[dict]) -> List[dict]:
    """Append ``rows`` to the results file ``path``; returns them as written."""
    results = ResultsFile(path)
    return [results.write(row) for row in rows]
