"""``benchmarks.timing``: what a measurement row holds on each kind of device."""
import math
import time

import pytest
import torch

from benchmarks import timing

SETTINGS = timing.Settings(warmup_ms=1.0, rep_ms=2.0, min_reps=3, max_cpu_reps=5)


def test_cpu_rows_have_no_host_column():
    """On a CPU every millisecond is host time: ``host_ms`` stays NaN, ``time_ms`` is wall-clock."""
    row = timing.measure(lambda: torch.ones(8).sum(), torch.device("cpu"), SETTINGS)
    assert row["status"] == "ok" and row["time_ms"] > 0 and math.isnan(row["host_ms"])


@pytest.mark.cuda
def test_host_time_of_a_host_bound_call():
    """A call that sleeps 2 ms on the host and launches one tiny kernel: its host time is at least
    the sleep, and ``time_ms`` (GPU events around the call) sees the same host time."""
    device = torch.device("cuda")
    x = torch.ones(8, device=device)

    def step():
        time.sleep(0.002)
        return x + 1

    row = timing.measure(step, device, SETTINGS)
    assert row["status"] == "ok"
    assert row["host_ms"] >= 2.0 and row["time_ms"] >= 1.5, row


@pytest.mark.cuda
def test_host_time_of_a_device_bound_call():
    """A call of one long kernel returns to the host long before the GPU finishes it."""
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    row = timing.measure(lambda: a @ a @ a, device, SETTINGS)
    assert row["status"] == "ok" and row["host_ms"] < row["time_ms"], row
