"""Probe 92: does leaving ``nn._graph.derived``'s context managers cost a new graph time? Probes
81 and 90 put 0.23-0.79 ms per new-graph step into ``grad_mode.py:293(__exit__)`` under cProfile.

A. The context managers alone, with a tensor made inside: us per entry and exit (perf_counter,
   20000 times), with the GPU idle and with a queue of kernels in flight.
B. Each ``derived`` miss of new-graph steps timed in pieces (perf_counter, no sync): enter, build,
   exit; GCN, GAT and SAGE 2-layer models (train_e2e's, hidden 64) on fresh COLLAB batches.
C. 2-layer mini-batch steps with ``derived`` as it is and with a variant that enters only the
   context managers it needs (``no_grad`` under grad mode, ``inference_mode(False)`` in inference
   mode), alternating, 5 rounds of 40 steps (ms per step).

    python3 gpu_probe92.py OUT.txt
"""
import os
import statistics
import sys
import time
from contextlib import ExitStack

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher.nn import _graph, gat_conv, gcn_conv  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")

# -- A ------------------------------------------------------------------------------------------
say("== A. the context managers alone, us per use")
big = torch.randn(4096, 4096, device=dev)
for label, busy in (("GPU idle", False), ("kernels in flight", True)):
    torch.cuda.synchronize()
    if busy:
        for _ in range(50):
            big = big @ big * 1e-3
    t = time.perf_counter()
    for _ in range(20000):
        with torch.inference_mode(False), torch.no_grad():
            torch.empty(1, device=dev)
    both = (time.perf_counter() - t) / 20000 * 1e6
    t = time.perf_counter()
    for _ in range(20000):
        torch.empty(1, device=dev)
    bare = (time.perf_counter() - t) / 20000 * 1e6
    say(f"  {label}: with both context managers {both:.2f}, without {bare:.2f}")
torch.cuda.synchronize()

original = _graph.derived
pieces = {}


def derived_timed(graph, key, build):
    version = _graph._version(graph)
    slot = _graph._DERIVED.get(graph)
    if slot is None or slot[0] != version:
        slot = (version, {})
        _graph._DERIVED[graph] = slot
    entries = slot[1]
    if key not in entries:
        t0 = time.perf_counter()
        inference = torch.inference_mode(False)
        grad = torch.no_grad()
        inference.__enter__()
        grad.__enter__()
        t1 = time.perf_counter()
        entries[key] = build()
        t2 = time.perf_counter()
        grad.__exit__(None, None, None)
        t3 = time.perf_counter()
        inference.__exit__(None, None, None)
        t4 = time.perf_counter()
        record = pieces.setdefault(key[0], [0, 0.0, 0.0, 0.0, 0.0])
        record[0] += 1
        for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            record[1 + i] += d
    return entries[key]


def derived_lean(graph, key, build):
    version = _graph._version(graph)
    slot = _graph._DERIVED.get(graph)
    if slot is None or slot[0] != version:
        slot = (version, {})
        _graph._DERIVED[graph] = slot
    entries = slot[1]
    if key not in entries:
        with ExitStack() as stack:
            if torch.is_inference_mode_enabled():
                stack.enter_context(torch.inference_mode(False))
            if torch.is_grad_enabled():
                stack.enter_context(torch.no_grad())
            entries[key] = build()
    return entries[key]


def use(variant):
    for module in (_graph, gat_conv, gcn_conv):
        module.derived = variant


task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731


def make(model_name):
    torch.manual_seed(0)
    m = te.build_model(model_name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    return step


def timed(step, items):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in items:
        step(b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / len(items) * 1e3


# -- B ------------------------------------------------------------------------------------------
say("== B. derived misses of new-graph steps: us per step (calls per step): enter / build / exit no_grad / "
    "exit inference_mode")
for model_name in ("gcn", "gat", "sage"):
    step = make(model_name)
    use(original)
    for b in fresh(batches[:5]):
        step(b)
    use(derived_timed)
    pieces.clear()
    items = fresh(batches[5:45])
    timed(step, items)
    for key, (calls, *times) in pieces.items():
        say(f"  {model_name} {key}: ({calls / len(items):.0f}) " + " / ".join(f"{t / len(items) * 1e6:.1f}"
                                                                               for t in times))
use(original)

# -- C ------------------------------------------------------------------------------------------
say("== C. 2-layer mini-batch steps on fresh COLLAB batches, ms per step, median [rounds]")
VARIANTS = {"derived as is": original, "lean derived": derived_lean}
for model_name in ("gcn", "gat", "sage"):
    step = make(model_name)
    for variant in VARIANTS.values():
        use(variant)
        for b in fresh(batches[:5]):
            step(b)
    res = {k: [] for k in VARIANTS}
    for rnd in range(5):
        for label, variant in VARIANTS.items():
            use(variant)
            res[label].append(timed(step, fresh(batches[5:45])))
    say(f"  {model_name}: " + "; ".join(f"{k} {statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]"
                                        for k, v in res.items()))
use(original)
say("done")
