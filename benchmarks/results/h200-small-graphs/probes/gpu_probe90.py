"""Probe 90: what a new mini-batch graph costs a GAT, GCN or SAGE step beyond its graph pieces, and
where a new-graph step spends its host time (probe 81's script, with GAT and the self times).

For each model (train_e2e's, hidden 64) in one process: 2-layer steps on fresh COLLAB batches and
on one batch every step, alternating, 3 rounds (ms per step, no sync inside the loop); the time
the garbage collector ran per step (gc.callbacks); host syncs of one new-graph step; and
cProfile's cumulative times per step, new graph minus same graph, the 30 largest.

    python3 gpu_probe90.py OUT.txt
"""
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731

gc_time = [0.0]
gc_start = [0.0]


def on_gc(phase, info):
    if phase == "start":
        gc_start[0] = time.perf_counter()
    else:
        gc_time[0] += time.perf_counter() - gc_start[0]


gc.callbacks.append(on_gc)


def make(model_name, layers):
    torch.manual_seed(0)
    m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    return step


def timed(step, items):
    torch.cuda.synchronize()
    gc_time[0] = 0.0
    t = time.perf_counter()
    for b in items:
        step(b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / len(items) * 1e3, gc_time[0] / len(items) * 1e3


def profile_steps(step, items):
    pr = cProfile.Profile()
    pr.enable()
    for b in items:
        step(b)
    torch.cuda.synchronize()
    pr.disable()
    stats = pstats.Stats(pr).stats
    return {f"{os.path.basename(k[0])}:{k[1]}({k[2]})": v[3] / len(items) * 1e3 for k, v in stats.items()}


for model_name in ("gat", "gcn", "sage"):
    say(f"\n######## {model_name}")
    ours, pyg = make(model_name, ugnn), make(model_name, pygnn)
    for step in (ours, pyg):
        for b in fresh(batches[:5]):
            step(b)
    res = {k: [] for k in ("ours new", "ours same", "pyg new", "pyg same")}
    gcs = {k: [] for k in res}
    for rnd in range(3):
        for label, step in (("ours", ours), ("pyg", pyg)):
            ms, g = timed(step, fresh(batches[5:45]))
            res[f"{label} new"].append(ms)
            gcs[f"{label} new"].append(g)
            same = fresh(batches[:1]) * 40
            ms, g = timed(step, same)
            res[f"{label} same"].append(ms)
            gcs[f"{label} same"].append(g)
    for k, v in res.items():
        say(f"  {k:10s} ms/step {statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]   "
            f"gc ms/step {statistics.median(gcs[k]):.3f}")
    b = fresh(batches[10:11])[0]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        ours(b)
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    say(f"  ours: {len(syncs)} host syncs in one new-graph step")
    new = profile_steps(ours, fresh(batches[5:25]))
    same = profile_steps(ours, fresh(batches[:1]) * 20)
    diff = sorted(((new[k] - same.get(k, 0.0), k) for k in new), reverse=True)[:30]
    say("  cumulative ms per step under cProfile, new graph minus same graph (top 30):")
    for d, k in diff:
        say(f"    {d:7.3f}  (new {new[k]:7.3f})  {k}")
    pr = cProfile.Profile()
    pr.enable()
    for b in fresh(batches[5:25]):
        ours(b)
    torch.cuda.synchronize()
    pr.disable()
    own = sorted(((v[2] / 20 * 1e3, f"{os.path.basename(k[0])}:{k[1]}({k[2]}) x{v[1] / 20:.0f}")
                  for k, v in pstats.Stats(pr).stats.items()), reverse=True)[:40]
    say("  self (tottime) ms per new-graph step under cProfile (top 40):")
    for t, k in own:
        say(f"    {t:7.3f}  {k}")
say("done")
