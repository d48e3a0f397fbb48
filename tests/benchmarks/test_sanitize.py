"""The compute-sanitizer driver (``benchmarks.sanitize``) and its workload
(``benchmarks.sanitize_cases``) stay runnable: the workload's tiny matrix passes through Triton's
interpreter, a wrong result fails its case, the driver's dry run writes a report, the tools' output
is parsed, and a missing ``compute-sanitizer`` is reported."""

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import sanitize, sanitize_cases
from pyg_ugrapher import reference

ROOT = Path(__file__).resolve().parents[2]

MEMCHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at vertex_parallel_sum_mul_u_e+0x1b0 in /cache/ug_0123.py:41
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0000000200 is out of bounds
========= Invalid __global__ read of size 4 bytes
=========     at vertex_parallel_sum_mul_u_e+0x1b0 in /cache/ug_0123.py:41
=========     by thread (4,0,0) in block (0,0,0)
FAIL op/u_mul_e_sum/vertex/hub/float32/int32/sorted: output under vertex(...): relative error inf > 1e-05
SANITIZE cases=5 failed=1 launched=17 seconds=3.0
========= ERROR SUMMARY: 2 errors
"""
RACECHECK_OUTPUT = """\
========= COMPUTE-SANITIZER
SANITIZE cases=5 failed=0 launched=17 seconds=3.0
========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)
"""


def test_every_kind_of_case_passes_through_the_interpreter(interpret):
    """A case of each kind of the tiny matrix (an op with its backward, the one-pass softmax, a
    gather with an edge output, a layer, the hand-written kernels) runs and matches, and kernels
    were launched. (The dry run below runs its first two op cases.)"""
    tiny = sanitize_cases.cases("tiny")
    selected = [case for i, case in enumerate(tiny) if case.kind != "op" or i == 2]
    assert {case.kind for case in selected} == set(sanitize_cases.RUNNERS)
    summary = sanitize_cases.run_cases(selected, torch.device("cpu"))
    assert (summary.cases, summary.failed) == (len(selected), 0)
    assert summary.launched >= len(selected)


def test_a_wrong_result_fails_its_case(monkeypatch, capsys):
    """With the reference off by one, the case fails and says why (the op itself runs on the
    reference executor here: no interpreter)."""
    wrong = SimpleNamespace(execute=lambda graph, op, operands: reference.execute(graph, op, operands) + 1)
    monkeypatch.setattr(sanitize_cases, "reference", wrong)
    case = sanitize_cases.Case("op", "u_mul_e_sum", "mixed", strategy="vertex")
    summary = sanitize_cases.run_cases([case], torch.device("cpu"))
    assert (summary.cases, summary.failed) == (1, 1)
    assert f"FAIL {case.id}: output under" in capsys.readouterr().out


def test_matrices_cover_every_template_and_type():
    """The reduced matrix has each (strategy, gather op or message creation, dtype, index dtype)
    among its operator cases, both edge orders and every graph; the full one every graph for each."""
    reduced = sanitize_cases.cases("reduced")
    ops = [case for case in reduced if case.kind == "op"]
    seen = {
        (
            c.strategy,
            c.name.rsplit("_", 1)[-1] if c.name.endswith(sanitize_cases.GATHERS) else None,
            c.dtype,
            c.index_dtype,
        )
        for c in ops
    }
    assert len(seen) == len(sanitize_cases.STRATEGIES) * 5 * len(sanitize_cases.DTYPES) * 2
    assert {c.graph for c in ops} == set(sanitize_cases.GRAPHS) and {c.sort for c in ops} == {True, False}
    assert {(c.kind, c.strategy) for c in reduced if c.kind in ("softmax", "pair")} == {
        (k, s) for k in ("softmax", "pair") for s in ("vertex", "group")
    }
    full = sanitize_cases.cases("full")
    assert len([c for c in full if c.kind == "op"]) == len(ops) * len(sanitize_cases.GRAPHS) * 2


def test_dry_run_writes_a_report(tmp_path, interpreter_env):
    """The driver on the CPU: the workload (two cases) runs through the interpreter, the tools are
    listed, not run, and the report says so."""
    out = tmp_path / "sanitizer.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.sanitize",
            "--dry-run",
            "--matrix",
            "tiny",
            "--limit",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=interpreter_env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = out.read_text()
    assert "| none | `python -m benchmarks.sanitize_cases --matrix tiny --device cpu --limit 2` |" in report
    assert "| 2 | 0 |" in report
    for tool in sanitize.TOOLS:
        assert f"| {tool} | `compute-sanitizer --tool {tool} --print-limit" in report
    assert report.count("not run (--dry-run)") == len(sanitize.TOOLS)
    record = json.loads(out.with_suffix(".json").read_text())
    assert [run["tool"] for run in record["runs"]] == ["none", *sanitize.TOOLS]


def test_runs_of_earlier_invocations_are_kept(tmp_path):
    """A record of the same commit, device and matrix gives back its runs; another one none."""
    header = {"commit": "abc", "device": "NVIDIA H200", "matrix": "reduced"}
    record = tmp_path / "sanitizer.json"
    run = sanitize.Run("memcheck", ["compute-sanitizer", "--tool", "memcheck"], status="ok", errors=0, cases=3)
    record.write_text(json.dumps({"header": header, "runs": [sanitize.asdict(run)]}))
    assert sanitize.load_previous(record, header) == {"memcheck": run}
    assert sanitize.load_previous(record, {**header, "commit": "def"}) == {}
    assert sanitize.load_previous(tmp_path / "missing.json", header) == {}


def test_tool_output_is_parsed():
    run = sanitize.Run("memcheck", ["compute-sanitizer"])
    sanitize.parse_output(run, MEMCHECK_OUTPUT)
    assert (run.errors, run.cases, run.failed, run.launched) == (2, 5, 1, 17)
    assert run.summary == ["ERROR SUMMARY: 2 errors"]
    assert len(run.reports) == 2 and run.reports[0].startswith("Invalid __global__ read of size 4 bytes | at vertex")
    assert run.failures == [
        "op/u_mul_e_sum/vertex/hub/float32/int32/sorted: output under vertex(...): relative error inf > 1e-05"
    ]
    run = sanitize.Run("racecheck", ["compute-sanitizer"])
    sanitize.parse_output(run, RACECHECK_OUTPUT)
    assert (run.errors, run.failed, run.reports) == (3, 0, [])
    run.status, run.errors = "ok", 0
    assert run.clean


def test_compute_sanitizer_is_found_or_reported(tmp_path, monkeypatch, capsys):
    assert (
        sanitize.find_sanitizer(environ={"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path)}) is None
        or Path("/usr/local/cuda/bin/compute-sanitizer").exists()
    )
    tool = tmp_path / "cuda" / "bin" / "compute-sanitizer"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert sanitize.find_sanitizer(environ={"PATH": "", "CUDA_HOME": str(tmp_path / "cuda")}) == tool
    assert sanitize.find_sanitizer(str(tmp_path / "missing")) is None
    if not torch.cuda.is_available():
        assert sanitize.main(["--out", str(tmp_path / "report.md")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda explicit=None, environ=None: None)
    assert sanitize.main(["--out", str(tmp_path / "report.md")]) == 2
    assert "compute-sanitizer not found" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


@pytest.mark.cuda
@pytest.mark.slow
def test_reduced_matrix_passes_on_the_gpu():
    """The plain run the driver starts with: every case of the reduced matrix matches on the GPU."""
    summary = sanitize_cases.run_cases(sanitize_cases.cases("reduced"), torch.device("cuda"))
    assert summary.failed == 0 and summary.cases == len(sanitize_cases.cases("reduced"))


def test_a_gradient_that_cancels_to_zero_is_compared_at_the_layer_scale():
    """Rounding noise against an exact zero fails a plain relative error and passes against the
    layer's gradient scale; an error of that scale's size fails either way."""
    zero, noise = torch.zeros(4), torch.full((4,), 3e-7)
    assert sanitize_cases.compare(noise, zero, torch.float32, "g", 100.0)
    assert not sanitize_cases.compare(noise, zero, torch.float32, "g", 100.0, scale=1.0)
    assert sanitize_cases.compare(torch.full((4,), 0.5), zero, torch.float32, "g", 100.0, scale=1.0)
    assert sanitize_cases.relative_error(torch.tensor([math.nan]), torch.zeros(1), scale=1.0) == math.inf
