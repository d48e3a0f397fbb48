"""Benchmark-level timing, memory and failure helpers shared by every suite, on top of
:mod:`autotune.timing`.

On CUDA, :func:`bench` times a call as a user's loop runs it: the median of CUDA events around
each call (:func:`autotune.timing.cuda_ms`) with a cold L2 cache and *no* busy-wait, so that a
call bound by the host is timed at the host's pace (:func:`host_ms` shows how much of it the host
takes to issue). Small graphs are not flattered by inputs left in L2 by the previous call.
:func:`device_ms` times the same calls behind a GPU busy-wait, which hides the host: the GPU work
alone, by which the kernels (a schedule against cuSPARSE's, say) compare on a small graph whose
``time_ms`` is host time.
Warm-up is never timed: :func:`measure` makes the first call (compilation, Triton JIT, structure
building) and the correctness call itself, and :func:`bench` warms up again before its timed
calls. :class:`Stopwatch` times a block of several calls (a training epoch), host included.

On a CPU (tests, ``--tiny``), times are wall-clock medians and rows say so in their ``timer``
column.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import Tensor
from torch._dynamo.utils import counters

from autotune.timing import BUSY_CYCLES, cuda_ms, wall_ms

#: A result whose normwise relative error to the reference exceeds this is marked ``mismatch``.
#: float32 sums in another order differ by ~1e-6 relative; a wrong kernel differs by O(1).
TOLERANCE = 1e-3

NAN = float("nan")


@dataclass(frozen=True)
class Settings:
    """How long to time each measurement.

    The number of timed calls follows from a time (``rep_ms``) and a first estimate of one call;
    ``min_reps`` keeps slow cases (tens of ms per call) from being timed from one or two calls.
    """

    warmup_ms: float = 5.0
    rep_ms: float = 25.0
    min_reps: int = 5
    #: The CPU timer's cap on calls, so that a slow CPU case ends.
    max_cpu_reps: int = 50


class Budget:
    """A wall-clock allowance for a whole run; ``None`` means unlimited."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self._deadline = None if seconds is None else time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    """Return cached blocks to the driver, so the next graph starts from an empty allocator.

    Only CUDA's allocator caches blocks: on a CPU there is nothing to return, and a full collection
    costs 0.1 s per call in a process as large as the test suite's."""
    if is_cuda(device):
        gc.collect()  # tensors that only reference cycles hold go back to the cache first
        torch.cuda.empty_cache()


def bench(fn: Callable[[], Any], device: torch.device, settings: Settings) -> float:
    """Median milliseconds per call of an already warmed-up ``fn``: CUDA events, a cold L2 and
    the host's time included on a GPU (see the module's documentation), wall clock on a CPU."""
    estimate = max(wall_ms(fn, warmup=0, reps=1, device=device)[0], 1e-3)
    reps = max(settings.min_reps, math.ceil(settings.rep_ms / estimate))
    if is_cuda(device):
        warmup = max(1, math.ceil(settings.warmup_ms / estimate))
        return statistics.median(cuda_ms(fn, warmup=warmup, reps=reps, busy_cycles=0, device=device))
    return statistics.median(wall_ms(fn, warmup=0, reps=min(settings.max_cpu_reps, reps), device=device))


def host_ms(fn: Callable[[], Any], device: torch.device, settings: Settings) -> float:
    """Host milliseconds to issue one call of an already warmed-up ``fn`` when calls run back to
    back, as in a training loop (NaN on a CPU, where all time is host time). The GPU hides this
    time only while it is shorter than the call's GPU work: a ``time_ms`` close to it means the
    call is bound by the host (Python, launches), whatever its kernels cost. The machines of one
    GPU service can differ by 2x in host speed, which this column makes visible."""
    if not is_cuda(device):
        return NAN
    calls = settings.min_reps  # few: the suites time thousands of rows within a device budget
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize(device)
    return issued / calls * 1e3


#: GPU clock cycles of busy-waiting per millisecond of a call's host time in :func:`device_ms`:
#: twice a millisecond at 2 GHz, so that the wait outlasts the host on slower clocks too.
BUSY_CYCLES_PER_HOST_MS = 4_000_000


def device_ms(fn: Callable[[], Any], device: torch.device, settings: Settings, host: float = NAN) -> float:
    """Median milliseconds of GPU work per call of an already warmed-up ``fn``: CUDA events
    around each call with a cold L2, each call queued behind a GPU busy-wait longer than the
    ``host`` milliseconds it takes to issue (:func:`host_ms`; at least
    :data:`autotune.timing.BUSY_CYCLES`), so that the host has issued all of it before its start
    event runs (NaN on a CPU)."""
    if not is_cuda(device):
        return NAN
    cycles = BUSY_CYCLES if math.isnan(host) else max(BUSY_CYCLES, int(host * BUSY_CYCLES_PER_HOST_MS))
    return statistics.median(cuda_ms(fn, warmup=1, reps=max(settings.min_reps, 10), busy_cycles=cycles, device=device))


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float:
    """Peak memory of one call above what was allocated before it, in MiB (NaN on a CPU).

    The call starts from an emptied cache: the allocator hands out a cached block larger than a
    request whole, and counts it whole, so the peak of one and the same step would read above the
    blocks it asked for, by however much earlier steps, of any method, left cached."""
    if not is_cuda(device):
        return NAN
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return peak / 2**20


@lru_cache(maxsize=None)
def copy_bandwidth(device: torch.device) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read plus bytes written).

    1 GiB on a GPU, far beyond any L2; 64 MiB on a CPU, enough to leave its caches.
    """
    numel = (2**30 if is_cuda(device) else 2**26) // 4
    src = torch.rand(numel, device=device)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    copy()
    ms = bench(copy, device, Settings())
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def max_rel_err(got: Sequence[Tensor], want: Sequence[Tensor]) -> float:
    """Normwise relative error ``max|got - want| / max|want|``, the worst over tensor pairs.

    Normwise rather than elementwise, so that outputs near zero (sums of random signs) do not turn
    rounding noise into huge ratios. Computed in chunks: ``[E, F]`` outputs of the largest graphs
    take gigabytes, and a full-size difference would double that.
    """
    if len(got) != len(want):
        raise ValueError(f"got: {len(got)} tensors to compare with {len(want)}")
    worst = 0.0
    chunk = 1 << 24
    for g, w in zip(got, want):
        if g.shape != w.shape:
            raise ValueError(f"got: shape {list(g.shape)} differs from the reference's {list(w.shape)}")
        g, w = g.detach().reshape(-1), w.detach().reshape(-1)
        diff = scale = 0.0
        for a, b in zip(g.split(chunk), w.split(chunk)):
            if not a.numel():
                continue
            part = (a.float() - b.float()).abs().max().item()
            if math.isnan(part):  # Python's max() would drop a NaN: any NaN is an error
                return math.inf
            diff = max(diff, part)
            scale = max(scale, b.float().abs().max().item())
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst


def _compile_counts() -> Dict[str, int]:
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}


def _break_reasons(before: Dict[str, int]) -> str:
    """The graph-break reasons Dynamo counted since its counts were ``before`` (Dynamo's reset
    keeps them: a row would list every earlier row's): each one's summary and debug context."""
    reasons = []
    for text, count in counters["graph_break"].items():
        if count <= before.get(text, 0):
            continue
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        context = [line for line in lines if line.startswith("Developer debug context")]
        reasons.append(" ".join(lines[:1] + context[:1]))
    return ("graph breaks: " + " | ".join(reasons))[:400] if reasons else ""


def failure(error: BaseException) -> Dict[str, str]:
    """A row's ``status`` and ``note`` for an exception; CUDA out-of-memory is its own status."""
    message = str(error).strip().splitlines()
    note = f"{type(error).__name__}: {message[0] if message else ''}"[:300]
    return {"status": "oom" if isinstance(error, torch.OutOfMemoryError) else "error", "note": note}


def measure(
    step: Callable[[], Any],
    device: torch.device,
    settings: Settings,
    *,
    compare: Optional[Callable[[Any], float]] = None,
    compiled: bool = False,
) -> Dict[str, Any]:
    """Time one step and check its result; never raises.

    1. The first call is timed alone (``first_call_s``: compilation and JIT included). For a
       compiled step, Dynamo is reset first and the graphs it compiles and the graph breaks it
       meets during that call are counted.
       ``compare`` maps that call's result to its error against the reference (the first call,
       because a training step changes the weights it is compared on).
    2. After one more call, which may still settle what later calls do (ours decides again for
       static edge weights it now reads in CSR order), the peak memory of one call, then the
       median time, then the host time per call (:func:`host_ms`) and the GPU time per call
       (:func:`device_ms`).

    Returns the measurement columns of a row; an exception (out of memory, compile error) gives
    ``status`` ``oom`` / ``error`` and NaN for what was not measured.
    """
    row: Dict[str, Any] = {
        "time_ms": NAN,
        "host_ms": NAN,
        "gpu_ms": NAN,
        "peak_mib": NAN,
        "first_call_s": NAN,
        "max_rel_err": NAN,
        "graphs": NAN,
        "graph_breaks": NAN,
        "status": "ok",
        "note": "",
    }
    try:
        if compiled:
            # Dynamo stops re-tracing code it already failed on, so breaks would only be counted
            # for whichever compiled step ran first: start each compiled step from a clean slate.
            torch._dynamo.reset()
        before, breaks_before = _compile_counts(), dict(counters["graph_break"])
        synchronize(device)
        start = time.perf_counter()
        result = step()
        synchronize(device)
        row["first_call_s"] = time.perf_counter() - start
        if compiled:
            after = _compile_counts()
            row.update({k: after[k] - before[k] for k in after})
            row["note"] = _break_reasons(breaks_before)
        if compare is not None:
            row["max_rel_err"] = compare(result)
            if row["max_rel_err"] > TOLERANCE:
                row["status"] = "mismatch"
        del result
        step()  # settles: a second call may still decide (ours: static edge weights read in CSR order)
        row["peak_mib"] = peak_mib(step, device)
        row["time_ms"] = bench(step, device, settings)
        row["host_ms"] = host_ms(step, device, settings)
        row["gpu_ms"] = device_ms(step, device, settings, row["host_ms"])
    except Exception as error:  # noqa: BLE001 - every failure becomes a row, the run goes on
        row.update(failure(error))
    if row["status"] in ("oom", "error"):
        # Outside the handler: the traceback's frames hold the failed call's tensors until then.
        free_memory(device)
    return row


class Stopwatch:
    """Milliseconds of a block of calls (a training epoch), host included: CUDA events around it
    on a GPU, ``perf_counter`` on a CPU; ``ms`` once the block is left.

    Example::

        with Stopwatch(device) as watch:
            for batch in batches:
                step(batch)
        epoch_ms = watch.ms
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = is_cuda(device)
        self.ms = NAN

    def __enter__(self) -> "Stopwatch":
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._begin = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.ms = self._start.elapsed_time(self._end)
        else:
            self.ms = (time.perf_counter() - self._begin) * 1e3
