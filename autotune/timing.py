"""Timing of GPU work: CUDA events around single calls, each started with a cold L2 cache and,
where kernels are ranked, behind a GPU busy-wait. The one timer of the project: runtime selection
(:func:`autotune.selection.fastest`), data collection (:class:`autotune.collect.Timer`) and the
benchmarks (:mod:`benchmarks.timing`) all time through it.

Two effects make timing a call back to back misleading:

* **The host's time to issue the call.** Queued behind nothing, a call whose GPU work is shorter
  than the time Python and the launcher take to queue it is timed as that host time and its
  jitter, whatever its kernels cost: of a shortlist of such schedules the fastest is noise. A GPU
  busy-wait of ``busy_cycles`` clock cycles (``torch.cuda._sleep``) queued before each start event
  keeps the GPU occupied while the host queues the call, so the events time the GPU work. Ranking
  kernels wants that; a benchmark of a whole training step does not (``busy_cycles=0``): there the
  host's time is part of the step.
* **Operands left in the L2 cache by the previous repeat.** In a training step each operator
  follows others that stream their own tensors through the L2, so a kernel that wins with a warm
  cache can lose in the step. A buffer larger than the L2 (:func:`flush_bytes`) is overwritten
  before each call, as ``triton.testing.do_bench`` does.

Neither the busy-wait nor the overwrite falls between a call's events. On a CPU there are no
events: :func:`wall_ms` times calls with ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, List, Optional, Union

import torch
from torch import Tensor

#: GPU clock cycles of busy-waiting queued before each timed call (a fraction of a millisecond):
#: longer than the host takes to queue one operator call.
BUSY_CYCLES = 300_000
#: The smallest buffer overwritten before a call (``triton.testing.do_bench``'s 256 MB).
MIN_FLUSH_BYTES = 256 << 20

Device = Union[str, int, torch.device, None]


def _check_counts(warmup: int, reps: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected a number of calls >= 0, got {warmup!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: expected a number of calls >= 1, got {reps!r}")


def flush_bytes(l2_cache_bytes: int) -> int:
    """Bytes to overwrite before a call so that the L2 cache of ``l2_cache_bytes`` holds none of
    its data: twice the cache, at least :data:`MIN_FLUSH_BYTES`."""
    if l2_cache_bytes < 0:
        raise ValueError(f"l2_cache_bytes: expected a size >= 0, got {l2_cache_bytes}")
    return max(2 * l2_cache_bytes, MIN_FLUSH_BYTES)


def _device(device: Device) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` is the current CUDA device, an int a CUDA index."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def flush_buffer(device: Device = None) -> Tensor:
    """A buffer of :func:`flush_bytes` for ``device``'s L2 cache (default: the current CUDA
    device), to pass to :func:`cuda_ms` as ``flush`` when many calls are timed."""
    device = _device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    size = flush_bytes(torch.cuda.get_device_properties(device).L2_cache_size)
    return torch.empty(size, dtype=torch.int8, device=device)


def cuda_ms(
    fn: Callable[[], Any],
    *,
    warmup: int = 1,
    reps: int = 3,
    cold_l2: bool = True,
    busy_cycles: int = BUSY_CYCLES,
    flush: Optional[Tensor] = None,
    device: Device = None,
) -> List[float]:
    r"""Milliseconds of each of ``reps`` calls of ``fn`` on the current CUDA stream, measured by CUDA
    events, after ``warmup`` untimed calls (the first compiles kernels).

    Args:
        fn (callable): the call to time; its result is dropped.
        warmup (int, optional): untimed calls first. (default: :obj:`1`)
        reps (int, optional): timed calls. (default: :obj:`3`)
        cold_l2 (bool, optional): overwrite ``flush`` (a new :func:`flush_buffer` if not given)
            before each timed call. (default: :obj:`True`)
        busy_cycles (int, optional): GPU clock cycles of busy-waiting queued before each timed
            call's start event; :obj:`0` times what the host adds too. (default:
            :data:`BUSY_CYCLES`)
        flush (torch.Tensor, optional): the buffer ``cold_l2`` overwrites. (default: :obj:`None`)
        device (torch.device, optional): the CUDA device whose L2 a new buffer covers.
            (default: the current one)

    All calls are queued before the host waits for the last one, so the host's time never falls
    between two calls unless the GPU runs out of work.
    """
    _check_counts(warmup, reps)
    if busy_cycles < 0:
        raise ValueError(f"busy_cycles: expected a number of cycles >= 0, got {busy_cycles}")
    for _ in range(warmup):
        fn()
    if cold_l2 and flush is None:
        flush = flush_buffer(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        if cold_l2:
            flush.zero_()
        if busy_cycles:
            torch.cuda._sleep(busy_cycles)
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(end) for start, end in events]


def wall_ms(fn: Callable[[], Any], *, warmup: int = 1, reps: int = 3, device: Device = "cpu") -> List[float]:
    """Wall-clock milliseconds of each of ``reps`` calls of ``fn`` after ``warmup`` untimed ones;
    on a CUDA ``device`` each call is timed from an idle GPU until its work is done (host time
    included)."""
    _check_counts(warmup, reps)
    device = _device(device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def median_ms(
    fn: Callable[[], Any], *, warmup: int = 1, reps: int = 3, device: Device = None, **cuda_options: Any
) -> float:
    """The median of :func:`cuda_ms` (``cuda_options`` passed on) on a CUDA device, of
    :func:`wall_ms` elsewhere. ``device`` ``None`` means the current CUDA device."""
    if _device(device).type == "cuda":
        return statistics.median(cuda_ms(fn, warmup=warmup, reps=reps, device=device, **cuda_options))
    if cuda_options:
        raise TypeError(f"median_ms: {', '.join(sorted(cuda_options))} only apply on a CUDA device")
    return statistics.median(wall_ms(fn, warmup=warmup, reps=reps, device=device))
