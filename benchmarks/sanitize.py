"""Run the kernels under NVIDIA's ``compute-sanitizer`` and write what its tools found.

    python -m benchmarks.sanitize                          # memcheck, racecheck, initcheck; reduced matrix
    python -m benchmarks.sanitize --tools memcheck --matrix full
    python -m benchmarks.sanitize --dry-run --matrix tiny  # the CPU, through Triton's interpreter, no tools

The workload is :mod:`benchmarks.sanitize_cases` (every template, gather op, message creation,
dtype and index dtype under explicit schedules on small graphs of hubs, isolated vertices, self
loops, duplicate edges and no edges, with the backward ops, the one-pass softmax, the gathers with
an edge output, GCN and GAT layers and the hand-written kernels, each checked against the reference
executor). One plain run comes first: it checks the results and compiles every kernel into
Triton's cache, which the runs under the tools then load instead of compiling under
instrumentation. Each tool then runs the workload in a process of its own::

    compute-sanitizer --tool <tool> --print-limit 200 python -m benchmarks.sanitize_cases --matrix <m> --device cuda

with PyTorch's caching allocator off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``): every tensor is then an
allocation of its own, so a read past a tensor's end is outside every allocation (memcheck reports
it) and a read of memory no kernel wrote is a read of fresh memory (initcheck reports it); inside the
allocator's pooled blocks neither would show. racecheck checks the shared memory of Triton's
reductions and scans.

``compute-sanitizer`` is looked for as ``--sanitizer``, on ``PATH``, in ``$CUDA_HOME/bin`` and in
``/usr/local/cuda/bin``; without it the driver says so and exits with status 2. The report
(``benchmarks/results/<gpu>/sanitizer.md`` by default) has one row per run: the tool, its command,
the Triton kernels launched, the cases and those that failed, the errors the tool counted and the
seconds taken, then the tool's summary lines and its first error reports. Its runs are also kept in
a JSON record beside it (``sanitizer.json``): a later invocation for the same commit, device and
matrix replaces the runs it makes and keeps the others, so the tools can run one invocation each::

    python -m benchmarks.sanitize --tools memcheck
    python -m benchmarks.sanitize --tools racecheck --skip-plain
    python -m benchmarks.sanitize --tools initcheck --skip-plain

The exit status is 1 if a run of this invocation found an error or a failed case, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import torch

from .rows import ROOT, commit, default_out

TOOLS = ("memcheck", "racecheck", "initcheck")
#: Errors each tool prints in full (its summary counts them all).
PRINT_LIMIT = 200
#: Error reports copied into the report per run.
REPORTED_ERRORS = 20
#: Seconds one run may take before it is stopped (the reduced matrix takes about two minutes a tool
#: on an H200).
TIMEOUT_S = 1200
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_HAZARDS = re.compile(r"RACECHECK SUMMARY:.*\((\d+) errors?, (\d+) warnings?\)")
_WORKLOAD = re.compile(r"SANITIZE cases=(\d+) failed=(\d+) launched=(\d+)")


def find_sanitizer(explicit: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """The ``compute-sanitizer`` executable: ``explicit`` if given, else the first found on
    ``PATH``, in ``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``) and in ``/usr/local/cuda/bin``."""
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which("compute-sanitizer", path=environ.get("PATH", ""))
    if found:
        return Path(found)
    homes = [environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in homes:
        if home:
            path = Path(home) / "bin" / "compute-sanitizer"
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


@dataclass
class Run:
    """One run of the workload: plain (``tool`` ``"none"``) or under a tool."""

    tool: str
    command: List[str]
    status: str = "not run"
    returncode: Optional[int] = None
    seconds: float = 0.0
    cases: Optional[int] = None
    failed: Optional[int] = None
    launched: Optional[int] = None
    errors: Optional[int] = None
    summary: List[str] = field(default_factory=list)
    reports: List[str] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.status == "ok" and not self.failed and not self.errors


def workload_command(matrix: str, device: str, only: str = "", limit: int = 0) -> List[str]:
    command = [sys.executable, "-m", "benchmarks.sanitize_cases", "--matrix", matrix, "--device", device]
    if only:
        command += ["--only", only]
    if limit:
        command += ["--limit", str(limit)]
    return command


def tool_command(sanitizer: Path, tool: str, workload: Sequence[str]) -> List[str]:
    return [str(sanitizer), "--tool", tool, "--print-limit", str(PRINT_LIMIT), *workload]


def parse_output(run: Run, output: str) -> None:
    """Fill ``run``'s counts and lines from the combined output of the workload and of its tool."""
    lines = output.splitlines()
    for line in lines:
        workload = _WORKLOAD.search(line)
        if workload:
            run.cases, run.failed, run.launched = (int(g) for g in workload.groups())
        elif line.startswith("FAIL "):
            run.failures.append(line[len("FAIL ") :])
    # Each process the tool follows prints its own summary; racecheck counts hazards as errors and
    # warnings, and both are hazards.
    counts = [int(m.group(1)) for m in map(_ERROR_SUMMARY.search, lines) if m]
    hazards = [int(m.group(1)) + int(m.group(2)) for m in map(_HAZARDS.search, lines) if m]
    if counts or hazards:
        run.errors = sum(hazards) if hazards else sum(counts)
    run.summary = [line.strip("= ").strip() for line in lines if "SUMMARY" in line and line.startswith("=")]
    # An error report starts with an unindented line after the prefix, details follow indented.
    for i, line in enumerate(lines):
        if (
            line.startswith("========= ")
            and not line.startswith("=========  ")
            and "SUMMARY" not in line
            and "COMPUTE-SANITIZER" not in line
            and len(run.reports) < REPORTED_ERRORS
        ):
            details = [d.strip("= ").strip() for d in lines[i + 1 : i + 3] if d.startswith("=========  ")]
            run.reports.append(" | ".join([line.strip("= ").strip()] + details))


def execute(run: Run, env: Mapping[str, str], timeout: float) -> None:
    """Run ``run.command`` in the repository root, echoing nothing; record its outcome."""
    start = time.perf_counter()
    try:
        done = subprocess.run(run.command, cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        run.status = f"timed out after {timeout:.0f} s"
        output = "\n".join(_text(part) for part in (expired.stdout, expired.stderr))
    else:
        run.returncode = done.returncode
        output = done.stdout + "\n" + done.stderr
        finished = (
            _WORKLOAD.search(output) if run.tool == "none" else _ERROR_SUMMARY.search(output) or _HAZARDS.search(output)
        )
        last = output.strip().splitlines()[-1:] or ["no output"]
        run.status = "ok" if finished else f"exit status {done.returncode}: {last[0][:200]}"
    run.seconds = time.perf_counter() - start
    parse_output(run, output)


def _text(output: object) -> str:
    """Captured output as text (a timed-out run's may come as bytes)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _cell(value: object) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def shown(command: Sequence[str]) -> str:
    """``command`` as the report shows it: the executable by its name, this Python as ``python``."""
    return " ".join(
        "python" if part == sys.executable else Path(part).name if i == 0 else part for i, part in enumerate(command)
    )


def render(runs: Sequence[Run], header: Dict[str, str]) -> str:
    """The markdown report of ``runs``."""
    lines = ["# compute-sanitizer", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += [
        "",
        "| tool | command | Triton kernels launched | cases | failed cases | errors | seconds | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        lines.append(
            f"| {run.tool} | `{_cell(shown(run.command))}` | {_cell(run.launched)} | {_cell(run.cases)} | "
            f"{_cell(run.failed)} | {_cell(run.errors)} | {run.seconds:.0f} | {_cell(run.status)} |"
        )
    for run in runs:
        if not (run.summary or run.reports or run.failures):
            continue
        lines += ["", f"## {run.tool}", ""]
        lines += [f"- summary: {line}" for line in run.summary]
        lines += [f"- error: {line}" for line in run.reports]
        lines += [f"- failed case: {line}" for line in run.failures[:REPORTED_ERRORS]]
    return "\n".join(lines) + "\n"


def sanitizer_version(sanitizer: Path) -> str:
    try:
        done = subprocess.run([str(sanitizer), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    versions = [line for line in done.stdout.splitlines() if "Version" in line or "version" in line]
    return versions[-1].strip() if versions else "unknown"


def load_previous(record: Path, header: Mapping[str, str]) -> Dict[str, Run]:
    """The runs kept in the JSON ``record`` by tool, if it was written for the commit, device and
    matrix of ``header``; none otherwise."""
    try:
        kept = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    if any(kept.get("header", {}).get(key) != header[key] for key in ("commit", "device", "matrix")):
        return {}
    return {run["tool"]: Run(**run) for run in kept.get("runs", [])}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sanitize", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--matrix", default="reduced", choices=("reduced", "full", "tiny"))
    parser.add_argument(
        "--out", type=Path, default=None, help="the report file (default: benchmarks/results/<gpu>/sanitizer.md)"
    )
    parser.add_argument("--sanitizer", default=None, help="the compute-sanitizer executable (default: searched)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run")
    parser.add_argument("--only", default="", help="only the cases whose id contains this text")
    parser.add_argument("--limit", type=int, default=0, help="at most this many cases (0: all)")
    parser.add_argument(
        "--skip-plain",
        action="store_true",
        help="no plain run first (an earlier one compiled the kernels into Triton's cache)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run the workload once on the CPU through Triton's interpreter, list the tool "
        "commands without running them (no GPU or compute-sanitizer needed)",
    )
    args = parser.parse_args(argv)

    env = dict(os.environ)
    if args.dry_run:
        device = torch.device("cpu")
        env["TRITON_INTERPRET"] = "1"
        sanitizer: Optional[Path] = find_sanitizer(args.sanitizer) or Path("compute-sanitizer")
    else:
        if not torch.cuda.is_available():
            print("benchmarks.sanitize: no CUDA device; use --dry-run for the CPU", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        sanitizer = find_sanitizer(args.sanitizer)
        if sanitizer is None:
            print(
                "benchmarks.sanitize: compute-sanitizer not found (looked at --sanitizer, PATH, $CUDA_HOME/bin, "
                "$CUDA_PATH/bin, /usr/local/cuda/bin); install the CUDA toolkit or pass --sanitizer PATH",
                file=sys.stderr,
            )
            return 2
    workload = workload_command(args.matrix, device.type, args.only, args.limit)
    header = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton's interpreter)",
        "compute-sanitizer": f"{sanitizer} ({sanitizer_version(sanitizer)})" if not args.dry_run else "not run",
        "matrix": args.matrix
        + (f", only {args.only!r}" if args.only else "")
        + (f", first {args.limit}" if args.limit else ""),
        "torch": torch.__version__,
    }
    runs = [] if args.skip_plain else [Run("none", workload)]
    runs += [Run(tool, tool_command(sanitizer, tool, workload)) for tool in args.tools]
    tool_env = {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    for run in runs:
        if args.dry_run and run.tool != "none":
            run.status = "not run (--dry-run)"
            continue
        execute(run, env if run.tool == "none" else tool_env, args.timeout)
        print(
            f"{run.tool}: {run.status}; {run.cases} cases, {run.failed} failed, {run.launched} kernels, "
            f"{run.errors} errors, {run.seconds:.0f} s",
            flush=True,
        )

    out = args.out or default_out(device) / "sanitizer.md"
    record = out.with_suffix(".json")
    merged = {**load_previous(record, header), **{run.tool: run for run in runs}}
    ordered = [merged[tool] for tool in ("none",) + TOOLS if tool in merged]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(ordered, header))
    record.write_text(json.dumps({"header": header, "runs": [asdict(run) for run in ordered]}, indent=1) + "\n")
    print(f"report: {out}")
    return 0 if all(run.clean for run in runs if not run.status.startswith("not run")) else 1


if __name__ == "__main__":
    sys.exit(main())
