"""``autotune.timing``, the one timer: wall-clock calls on the CPU, CUDA events with a busy-wait and a
cold L2 on a GPU, and the argument checks."""

import time

import pytest
import torch

from autotune import timing


def test_wall_ms_times_each_call_after_untimed_warmup():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.002)

    times = timing.wall_ms(step, warmup=2, reps=3)
    assert len(calls) == 5 and len(times) == 3
    assert all(t >= 1.5 for t in times)


def test_median_ms_on_the_cpu_is_the_wall_clock_median(monkeypatch):
    asked = []

    def wall_ms(fn, *, warmup, reps, device):
        asked.append((warmup, reps, torch.device(device).type))
        return [1.0, 9.0, 3.0]

    monkeypatch.setattr(timing, "wall_ms", wall_ms)
    assert timing.median_ms(lambda: None, warmup=2, reps=3, device="cpu") == 3.0
    assert asked == [(2, 3, "cpu")]


def test_cuda_options_are_refused_on_the_cpu():
    with pytest.raises(TypeError, match="busy_cycles"):
        timing.median_ms(lambda: None, device="cpu", busy_cycles=0)


@pytest.mark.parametrize(
    "warmup, reps, name", [(-1, 3, "warmup"), (1, 0, "reps"), (1, 2.0, "reps"), (True, 3, "warmup")]
)
def test_bad_counts_are_named(warmup, reps, name):
    with pytest.raises(ValueError, match=name):
        timing.wall_ms(lambda: None, warmup=warmup, reps=reps)
    with pytest.raises(ValueError, match=name):
        timing.cuda_ms(lambda: None, warmup=warmup, reps=reps)


def test_flush_covers_twice_the_l2_and_at_least_256_mib():
    assert timing.flush_bytes(50 << 20) == timing.MIN_FLUSH_BYTES == 256 << 20
    assert timing.flush_bytes(200 << 20) == 400 << 20
    with pytest.raises(ValueError, match="l2_cache_bytes"):
        timing.flush_bytes(-1)


def test_flush_buffer_needs_a_cuda_device():
    with pytest.raises(ValueError, match="device"):
        timing.flush_buffer("cpu")


@pytest.mark.cuda
def test_cuda_ms_times_the_gpu_work_not_the_flush_or_the_wait():
    """A GPU sleep of ~1e6 cycles (about half a millisecond) is timed as such; a tiny kernel is
    timed far below the flush and the busy-wait queued before it."""
    sleeping = timing.cuda_ms(lambda: torch.cuda._sleep(1_000_000), warmup=1, reps=5)
    assert len(sleeping) == 5 and all(0.1 < t < 20 for t in sleeping), sleeping
    x = torch.ones(8, device="cuda")
    tiny = timing.median_ms(lambda: x + 1, warmup=1, reps=5)
    assert tiny < 0.1


@pytest.mark.cuda
def test_busy_wait_hides_the_launch_but_not_host_time():
    """Without the busy-wait a call that spends 2 ms on the host before its kernel is timed with
    that host time (what a benchmark of a step wants); the busy-wait only covers launch overheads."""
    x = torch.ones(8, device="cuda")

    def host_bound():
        time.sleep(0.002)
        return x + 1

    assert timing.median_ms(host_bound, reps=3, busy_cycles=0, cold_l2=False) >= 1.5
    assert timing.median_ms(lambda: x + 1, reps=5, busy_cycles=timing.BUSY_CYCLES) < 0.1
