"""Probe 33: where a training step's host time goes, and whether anything in it waits for the GPU.

For each layer of ``PROBE_LAYERS`` on the 4e6-edge graphs, ours eager and compiled (and PyG
compiled for reference), after 5 warm-up steps:

* ``sync``: the device synchronisations of one step (``torch.cuda.set_sync_debug_mode``), each
  with the innermost frame of this repository that caused it;
* ``host``: the host time to issue 10 steps while the GPU is held busy by a long ``_sleep`` (so no
  launch waits for the GPU; a step that synchronises shows the sleep in its time), per step;
* ``gpu``: the step's kernel time (profiler) for comparison;
* the 20 functions with the most host time of their own (cProfile over 10 steps, same trick).

``PROBE_MEASURE_LOG=1`` also prints how long each measured selection took. Run from the
repository root: ``python benchmarks/results/h100-refine/probes/gpu_probe33.py``.
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F
import torch_geometric.nn

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn  # noqa: E402
from autotune import selection  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from benchmarks.layers import LAYERS, WIDTH  # noqa: E402

layers = os.environ.get("PROBE_LAYERS", "GATConv GCNConv").split()
methods = os.environ.get("PROBE_METHODS", "ours ours_compiled pyg_compiled").split()
out = open(os.path.join(os.environ.get("OUT", "."), "probe33.txt"), "w")
ROOT = os.getcwd()


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


_fastest = selection.fastest


def timed_fastest(candidates, run, *args, **kwargs):
    start = time.perf_counter()
    try:
        return _fastest(candidates, run, *args, **kwargs)
    finally:
        say(f"    measured selection: {len(candidates)} candidates + refinement, {time.perf_counter() - start:6.1f} s")


selection.fastest = timed_fastest


def busy_host_ms(step, steps):
    """Host ms per step while the GPU sleeps through all of them (about 2 s of cycles)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(4_000_000_000)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = (time.perf_counter() - start) / steps * 1e3
    torch.cuda.synchronize()
    return elapsed


cuda = torch.device("cuda")
say(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
for spec in layer_graphs():
    loaded = spec.load(cuda)
    x = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    target = torch.randn(loaded.num_nodes, WIDTH, device=cuda)
    for name in layers:
        for method in methods:
            ns = torch_geometric.nn if method.startswith("pyg") else pyg_ugrapher.nn
            torch.manual_seed(0)
            model = LAYERS[name](ns, WIDTH).to(cuda)
            runner = torch.compile(model, dynamic=False) if method.endswith("compiled") else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(runner(x, loaded.edge_index), target).backward()
                opt.step()

            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            for _ in range(4):
                step()
            torch.cuda.synchronize()
            syncs = []

            def record(message, category, filename, lineno, file=None, line=None):
                frames = [f for f in traceback.extract_stack() if f.filename.startswith(ROOT)
                          and "probes" not in f.filename]
                where = f"{frames[-1].filename[len(ROOT) + 1:]}:{frames[-1].lineno} {frames[-1].line}" \
                    if frames else "(outside the repository)"
                syncs.append(f"{str(message)[:60]} at {where}")

            shown = warnings.showwarning
            warnings.showwarning = record
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")
                step()
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
            torch.cuda.synchronize()
            host = statistics.median(busy_host_ms(step, 10) for _ in range(3))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            gpu = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0) / 10 / 1e3
            walls = []
            for _ in range(5):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    step()
                e.record()
                torch.cuda.synchronize()
                walls.append(s.elapsed_time(e) / 20)
            say(f"{spec.name:14s} {name:9s} {method:13s} first step {first:6.1f} s  step {statistics.median(walls):6.3f} ms"
                f"  host {host:6.3f} ms  gpu {gpu:6.3f} ms  syncs {len(syncs)}")
            for s in syncs[:8]:
                say(f"    sync: {s}")
            torch.cuda.synchronize()
            torch.cuda._sleep(4_000_000_000)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(10):
                step()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
            for line in text.getvalue().splitlines():
                if line.strip() and line.strip()[0].isdigit():
                    say("    " + line[:160])
            del model, opt, runner
            torch._dynamo.reset()
    del loaded, x, target
    torch.cuda.empty_cache()
out.close()
