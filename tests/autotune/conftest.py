"""Fixtures of the autotune tests: a tiny table collected through the CLI on the Triton interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The two smallest corpus graphs (1000 edges: uniform and power law), one op, one width.
SMOKE_GRAPHS = "uni-n1e2-e1e3,pl0.8-n1e2-e1e3"


def run_collect(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python -m autotune collect`` on the CPU (Triton interpreter) into ``out``."""
    command = [
        sys.executable,
        "-m",
        "autotune",
        "collect",
        "--device",
        "cpu",
        "--graphs",
        SMOKE_GRAPHS,
        "--ops",
        "copy_u_sum",
        "--no-backward",
        "--features",
        "16",
        "--configs",
        "2",
        "--reps",
        "1",
        "--out",
        str(out),
        *extra,
    ]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYG_UGRAPHER_CACHE": str(out.parent / "kernels")}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def collect_cli():
    """:func:`run_collect`, for tests that run the command again."""
    return run_collect


@pytest.fixture(scope="session")
def collected(tmp_path_factory) -> Path:
    """A folder with the smoke collection: two graphs x copy_u_sum x F=16, 2 sampled schedules
    plus the anchors and the heuristic's choice."""
    out = tmp_path_factory.mktemp("collect") / "raw"
    run_collect(out)
    return out
