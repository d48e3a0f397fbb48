"""PyG's own unit tests of the layers :mod:`pyg_ugrapher.nn` replaces, run on PyG's layers and on ours.

    python -m benchmarks.pyg_tests --pyg-tests /tmp/pyg_src/test --out benchmarks/results/cpu/
    python -m benchmarks.pyg_tests --pyg-tests /tmp/pyg_src/test --modules gcn sage --executors reference
    python -m benchmarks.pyg_tests --pyg-tests /tmp/pyg_src/test --group explain

``--pyg-tests`` is the ``test/`` folder of a PyG source checkout (the repository holds none of PyG's
code), ideally at the tag of the installed ``torch_geometric``; ``git archive <tag> test | tar -x``
of a clone extracts just that folder. For every module ``test/nn/conv/test_<name>_conv.py``
of :data:`MODULES` (``--group explain``: every module of ``test/explain``, written to
``pyg_explain_tests.csv``/``.md``) pytest runs in a subprocess twice: once plain, PyG's layers (the baseline), and
once with :mod:`benchmarks.pyg_tests_plugin`, which hands the test module our classes under PyG's
names. Both runs report with ``-q -rA --no-fold-skipped --tb=short``; :func:`parse_report` reads
every test's outcome and first message line from the short summary and the test's failing statement
from the traceback. A test PyG skips itself (a missing optional package: ``torch_sparse``,
``pyg_lib``) is ``skipped`` in both runs.

Every run is repeated per *suite*: ``default`` (PyG's quick suite) and ``full`` (``FULL_TEST=1``,
PyG's full suite, which adds the TorchScript blocks of the tests), and our runs per *executor*:
``reference`` (``TRITON_INTERPRET=0``: on a CPU our graph operators run on the pure-PyTorch
reference executor) and ``interpreter`` (``TRITON_INTERPRET=1``: the Triton kernels through Triton's
interpreter). The baseline does not depend on the executor and runs once per suite.

``pyg_tests.csv`` has one row per test, suite and executor: PyG's outcome, ours, the :data:`REASONS`
label of a failure of ours, its message, the statement of PyG's test that failed, and PyG's own
message (why PyG skipped or failed the test). ``pyg_tests.md`` counts per module and groups the
failures of ours by reason.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd
from tqdm import tqdm

from benchmarks.rows import ROOT, commit

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu"
PLUGIN = "benchmarks.pyg_tests_plugin"
#: PyG's optional compiled packages: parts of PyG's tests run (or skip) only where they are installed.
EXTENSIONS = ("torch_sparse", "torch_scatter", "pyg_lib")
#: PyG's test modules of the replaced layers: ``test/nn/conv/test_<name>_conv.py``.
MODULES = ("gcn", "gat", "gatv2", "sage", "gin", "graph")
#: Group -> (its folder under ``test/``, the stem of its result files, what its modules are).
GROUPS: Dict[str, Tuple[str, str, str]] = {
    "conv": ("nn/conv", "pyg_tests", "PyG's test modules `test/nn/conv/test_<layer>_conv.py`"),
    "explain": (
        "explain",
        "pyg_explain_tests",
        "PyG's explain tests, every `test/explain/**/test_*.py` (their models are built from the layers: "
        "explainers set edge masks, register message hooks, run `to_hetero` copies)",
    ),
}
#: Suite -> environment: PyG's quick suite and its full one.
SUITES: Dict[str, Dict[str, str]] = {"default": {"FULL_TEST": "0"}, "full": {"FULL_TEST": "1"}}
#: Executor of our graph operators on a CPU -> environment.
EXECUTORS: Dict[str, Dict[str, str]] = {
    "reference": {"TRITON_INTERPRET": "0"},
    "interpreter": {"TRITON_INTERPRET": "1"},
}
PYTEST_OPTIONS = ("-p", "no:cacheprovider", "-q", "-rA", "--no-fold-skipped", "--tb=short", "--color=no")
#: Terminal width of the runs: pytest trims summary messages to it.
COLUMNS_WIDTH = "10000"
#: pytest's words in the short summary -> the outcome recorded.
WORDS = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "xfailed",
    "XPASS": "xpassed",
}
#: Outcomes that count as a failure: besides pytest's, ``crashed`` (pytest ended without reporting
#: the test) and ``timeout``.
FAILURES = ("failed", "error", "crashed", "timeout")
#: Label -> pattern (searched in ``message`` and ``where`` of a failure of ours), first match wins.
REASONS: Tuple[Tuple[str, str], ...] = (
    ("TorchScript (torch.jit.script)", r"torch\.jit|\bjit\(|ForwardRef|TorchScript|\bscript\b"),
    ("aggregation module or list as aggr", r"aggregation modules and lists|Aggregation"),
    ("static graph (x with a batch dimension)", r"batch dimension"),
    ("PyG's propagate internals (hooks, decomposed_layers)", r"propagate|decomposed_layers|_hook"),
    ("torch_sparse SparseTensor", r"SparseTensor|torch_sparse"),
    ("explain", r"explain"),
    ("numerical mismatch", r"allclose|assert_close|isclose"),
)
OTHER_REASON = "other"
COLUMNS = (
    "date",
    "commit",
    "torch",
    "triton",
    "torch_geometric",
    "pyg_tests",
    "extensions",
    "module",
    "test",
    "suite",
    "executor",
    "pyg",
    "ours",
    "reason",
    "message",
    "where",
    "pyg_message",
)

_SECTION = re.compile(r"^=+ (.+?) =+$")
_SUMMARY = re.compile(r"^(" + "|".join(WORDS) + r") (\S+?)(?: - (.*))?$")
_TEST_HEADER = re.compile(r"^_+ (.+?) _+$")
_FRAME = re.compile(r"^(\S+?):(\d+): in \S+$")


@dataclass(frozen=True)
class Outcome:
    """One test's result in one run."""

    outcome: str  #: a value of :data:`WORDS`, ``crashed`` or ``timeout``
    message: str = ""  #: first line of the failure, error or skip message
    where: str = ""  #: ``file:line: statement`` of the test that failed ("" if none did)


def _test_id(nodeid: str) -> str:
    """``test/nn/conv/test_x.py::TestA::test_b[p]`` -> ``TestA::test_b[p]`` (``""``: the module)."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else ""


def _header_test_id(header: str) -> str:
    """The test id of a traceback's header: ``TestA.test_b[p]`` or ``ERROR at setup of test_b``."""
    header = re.sub(r"^ERROR (?:at \w+ of |collecting )", "", header)
    name, bracket, params = header.partition("[")
    return name.replace(".", "::") + bracket + params


def _tracebacks(lines: Sequence[str]) -> Dict[str, Tuple[str, List[str]]]:
    """Test id -> (``file:line: statement`` of the first frame, the test's own; the ``E`` lines) of
    each traceback in the ``FAILURES`` and ``ERRORS`` sections of a ``--tb=short`` report."""
    tracebacks: Dict[str, Tuple[str, List[str]]] = {}
    section, test = "", None
    for i, line in enumerate(lines):
        match = _SECTION.match(line)
        if match:
            section, test = match.group(1), None
            continue
        if section not in ("FAILURES", "ERRORS"):
            continue
        match = _TEST_HEADER.match(line)
        if match:
            test = _header_test_id(match.group(1))
            continue
        if test is None:
            continue
        where, errors = tracebacks.setdefault(test, ("", []))
        match = _FRAME.match(line)
        if match and not where:
            statement = lines[i + 1].strip() if i + 1 < len(lines) else ""
            tracebacks[test] = (f"{Path(match.group(1)).name}:{match.group(2)}: {statement}", errors)
        elif line.startswith("E "):
            errors.append(line[1:].strip())
    return tracebacks


def _complete(message: str, errors: Sequence[str]) -> str:
    """A summary message that names only the exception (``RuntimeError:``, its text starting on the
    next line), completed with the first non-empty ``E`` line after it."""
    if not message.endswith(":") or message not in errors:
        return message
    start = len(errors) - 1 - errors[::-1].index(message)
    rest = next((line for line in errors[start + 1 :] if line), "")
    return f"{message} {rest}".strip()


def parse_report(text: str) -> Dict[str, Outcome]:
    """Test id -> :class:`Outcome` from the output of ``pytest -rA --no-fold-skipped --tb=short``.

    A test id is the node id past its file (``test_x[p]``, ``TestA::test_b``); a module that failed
    to import is the id ``""``. A test that failed and then errored in its teardown stays failed.
    """
    lines = text.splitlines()
    tracebacks = _tracebacks(lines)
    outcomes: Dict[str, Outcome] = {}
    in_summary = False
    for line in lines:
        match = _SECTION.match(line)
        if match:
            in_summary = match.group(1) == "short test summary info"
            continue
        match = _SUMMARY.match(line) if in_summary else None
        if match is None:
            continue
        word, nodeid, message = match.groups()
        test = _test_id(nodeid)
        if test in outcomes and outcomes[test].outcome == "failed":
            continue
        outcome = WORDS[word]
        message = (message or "").strip()
        if outcome == "skipped":
            message = message.removeprefix("Skipped: ")
        if outcome in ("failed", "error"):
            where, errors = tracebacks.get(test, ("", []))
            outcomes[test] = Outcome(outcome, _complete(message, errors), where)
        else:
            outcomes[test] = Outcome(outcome, message)
    return outcomes


def run_pytest(
    test_file: Path,
    rootdir: Path,
    plugin: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 600.0,
) -> Tuple[Dict[str, Outcome], int, str]:
    """Runs pytest on ``test_file`` in a subprocess (from ``rootdir``, with ``-p plugin`` if given);
    returns :func:`parse_report` of its output, its exit status (``-1``: timed out) and the output.

    ``env`` is added to this process' environment; the repository root goes first on
    ``PYTHONPATH`` so that ``-p benchmarks.<plugin>`` imports.
    """
    environment = dict(os.environ, COLUMNS=COLUMNS_WIDTH, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", str(test_file), "--rootdir", str(rootdir), *PYTEST_OPTIONS]
    if plugin:
        command += ["-p", plugin]
    try:
        done = subprocess.run(command, cwd=rootdir, env=environment, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout if isinstance(expired.stdout, str) else (expired.stdout or b"").decode(errors="replace")
        return parse_report(output), -1, output
    output = done.stdout + done.stderr
    return parse_report(output), done.returncode, output


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def compare(baseline: Mapping[str, Outcome], ours: Mapping[str, Outcome], returncode: int, output: str) -> List[dict]:
    """One row per test of the baseline (and any only ours reported): the two outcomes, the reason,
    message and failing statement of ours.

    A test the run of ours did not report is ``timeout`` (``returncode`` -1), ``error`` (its module
    failed to import: the message is the import error) or ``crashed`` (pytest ended without a
    summary: the message is the last line of the output).
    """
    module_error = ours.get("")
    rows = []
    for test in list(baseline) + [test for test in ours if test not in baseline]:
        if not test:
            continue
        mine = ours.get(test)
        if mine is None:
            if returncode == -1:
                mine = Outcome("timeout", "pytest did not finish in time")
            elif module_error is not None:
                mine = Outcome("error", module_error.message, module_error.where)
            else:
                mine = Outcome("crashed", f"exit status {returncode}: {_last_line(output)}")
        theirs = baseline.get(test, Outcome("missing"))
        reason = classify(mine) if mine.outcome in FAILURES else ""
        rows.append(
            {
                "test": test,
                "pyg": theirs.outcome,
                "ours": mine.outcome,
                "reason": reason,
                "message": mine.message,
                "where": mine.where,
                "pyg_message": theirs.message,
            }
        )
    return rows


def classify(outcome: Outcome) -> str:
    """The first :data:`REASONS` label whose pattern occurs in the outcome's message or statement."""
    text = f"{outcome.message}\n{outcome.where}"
    return next((label for label, pattern in REASONS if re.search(pattern, text)), OTHER_REASON)


def module_path(pyg_tests: Path, name: str) -> Path:
    return pyg_tests / "nn" / "conv" / f"test_{name}_conv.py"


def test_files(pyg_tests: Path, group: str, modules: Sequence[str] = MODULES) -> List[Path]:
    """The test modules of ``group``: the conv modules named ``modules``, or every explain module."""
    if group == "conv":
        return [module_path(pyg_tests, name) for name in modules]
    return sorted((pyg_tests / GROUPS[group][0]).rglob("test_*.py"))


def run(
    pyg_tests: Path,
    paths: Sequence[Path],
    suites: Sequence[str],
    executors: Sequence[str],
    timeout: float,
    source: str,
    group: str = "conv",
) -> pd.DataFrame:
    """Every test module of ``paths``, suite and executor: the baseline once per suite, ours once per
    executor. A module is named by its path under ``group``'s folder."""
    environment = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "torch": version("torch"),
        "triton": version("triton"),
        "torch_geometric": version("torch_geometric"),
        "pyg_tests": source,
        "extensions": ", ".join(name for name in EXTENSIONS if find_spec(name)) or "none",
    }
    rootdir = pyg_tests.resolve().parent
    folder = pyg_tests.resolve() / GROUPS[group][0]
    rows = []
    cases = [(Path(path).resolve(), suite) for path in paths for suite in suites]
    for path, suite in tqdm(cases, desc="pyg_tests", unit="module"):
        baseline, returncode, output = run_pytest(path, rootdir, env=SUITES[suite], timeout=timeout)
        if not any(baseline):
            raise RuntimeError(f"{path}: PyG's own run reported no test (exit status {returncode}):\n{output[-3000:]}")
        for executor in executors:
            env = {**SUITES[suite], **EXECUTORS[executor]}
            ours, returncode, output = run_pytest(path, rootdir, PLUGIN, env, timeout)
            for row in compare(baseline, ours, returncode, output):
                module = path.relative_to(folder).as_posix()
                rows.append({**environment, "module": module, "suite": suite, "executor": executor, **row})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _table(header: Sequence[str], body: Sequence[Sequence[object]]) -> List[str]:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(value) for value in line) + " |" for line in body]


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per suite and executor, per module and for ``all`` of them: tests, passed with PyG, passed with
    ours, skipped in both, failed with ours where PyG's passed, failed with both."""
    bad = frame.ours.isin(FAILURES)
    counts = frame.assign(
        tests=1,
        pyg_passed=frame.pyg == "passed",
        ours_passed=frame.ours == "passed",
        skipped_both=(frame.pyg == "skipped") & (frame.ours == "skipped"),
        ours_failed=bad & (frame.pyg == "passed"),
        both_failed=bad & frame.pyg.isin(FAILURES),
    )
    columns = ["tests", "pyg_passed", "ours_passed", "skipped_both", "ours_failed", "both_failed"]
    blocks = []
    for (suite, executor), block in counts.groupby(["suite", "executor"], sort=False):
        per_module = block.groupby("module", sort=False)[columns].sum().reset_index()
        total = pd.DataFrame([{"module": "all", **block[columns].sum()}])
        blocks.append(pd.concat([per_module, total]).assign(suite=suite, executor=executor))
    return pd.concat(blocks, ignore_index=True)[["suite", "executor", "module", *columns]]


def markdown(frame: pd.DataFrame, group: str = "conv") -> str:
    """Counts per module, then every failure of ours grouped by reason."""
    first = frame.iloc[0]
    lines = [
        "# PyG's own tests on pyg_ugrapher.nn" + ("" if group == "conv" else f": {group}"),
        "",
        f"{GROUPS[group][2]} ({first.pyg_tests}), torch_geometric "
        f"{first.torch_geometric}, torch {first.torch}, Triton {first.triton}, commit {first.commit}, "
        f"{first.date}; PyG's optional packages installed: {first.extensions} (a test's "
        "`if torch_geometric.typing.WITH_TORCH_SPARSE:` blocks and tests marked for them run only "
        "with them). Each module runs with PyG's layers and with ours in their place "
        "(`python -m benchmarks.pyg_tests`). Suites: `default` is PyG's quick suite, `full` sets "
        "`FULL_TEST=1` (PyG's full suite: adds the TorchScript checks). Executors of ours on the CPU: "
        "`reference` (`TRITON_INTERPRET=0`, the pure-PyTorch reference executor), `interpreter` "
        "(`TRITON_INTERPRET=1`, the Triton kernels in Triton's interpreter). PyG's tests draw unseeded "
        "random inputs: a check close to its tolerance can pass in one run and fail in another.",
        "",
        "## Per module",
        "",
    ]
    counts = summary(frame)
    lines += _table(
        [
            "suite",
            "executor",
            "module",
            "tests",
            "passed with PyG",
            "passed with ours",
            "skipped in both",
            "failed with ours only",
            "failed with both",
        ],
        counts.values.tolist(),
    )
    failures = frame[frame.ours.isin(FAILURES)]
    lines += ["", "## Failures with ours, by reason", ""]
    if failures.empty:
        return "\n".join(lines + ["None.", ""])
    order = [label for label, _ in REASONS] + [OTHER_REASON]
    by_reason = sorted(failures.groupby("reason", sort=False), key=lambda item: order.index(item[0]))
    lines += _table(
        ["reason", "failing runs (test, suite, executor)", "distinct tests"],
        [[reason, len(group), len(group[["module", "test"]].drop_duplicates())] for reason, group in by_reason],
    )
    for reason, group in by_reason:
        lines += ["", f"### {reason}", ""]
        merged = (
            group.assign(run=group.suite + "/" + group.executor)
            .groupby(["module", "test", "pyg", "message", "where"], sort=False)
            .agg(runs=("run", ", ".join))
            .reset_index()
        )
        lines += _table(
            ["module", "test", "runs (suite/executor)", "with PyG", "failing statement", "message"],
            merged[["module", "test", "runs", "pyg", "where", "message"]].values.tolist(),
        )
    return "\n".join(lines + [""])


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pyg_tests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pyg-tests", type=Path, required=True, help="the test/ folder of a PyG source checkout")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of pyg_tests.csv/.md")
    parser.add_argument("--group", default="conv", choices=list(GROUPS), help="PyG's conv tests or its explain tests")
    parser.add_argument("--modules", nargs="+", default=list(MODULES), help=f"conv: of test_<name>_conv.py ({MODULES})")
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES))
    parser.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=list(EXECUTORS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one pytest run may take")
    parser.add_argument("--source", default="", help="what the tests are, for the table (e.g. PyG's tag)")
    args = parser.parse_args(argv)
    paths = test_files(args.pyg_tests, args.group, args.modules)
    missing = [str(path) for path in paths if not path.is_file()]
    if missing or not paths:
        parser.error(f"--pyg-tests: {args.pyg_tests} has no test module {missing or GROUPS[args.group][0]}")
    frame = run(args.pyg_tests, paths, args.suites, args.executors, args.timeout, args.source, args.group)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = GROUPS[args.group][1]
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    (args.out / f"{stem}.md").write_text(markdown(frame, args.group))
    print(summary(frame).to_string(index=False), file=sys.stderr)
    return frame


if __name__ == "__main__":
    main()
