"""Probe 73: what a new mini-batch graph costs our 2-layer models on the host, against the same
graph every step: the host synchronisations of one new-graph step (``torch.cuda`` sync debug
mode, with the line that caused each), and the functions whose cumulative time grows most
between 20 new-graph steps and 20 same-graph steps (cProfile of each, difference per function).

    python3 gpu_probe73.py OUT.txt
"""
import cProfile
import os
import pstats
import sys
import traceback
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:50]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]


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


def cumulative(pr):
    stats = pstats.Stats(pr).stats
    return {f"{os.path.basename(k[0])}:{k[1]}({k[2]})": v[3] for k, v in stats.items()}


for model_name in ("gcn", "sage", "gin", "gat"):
    step = make(model_name)
    for b in fresh(batches[:5]):
        step(b)
    torch.cuda.synchronize()
    seen = []

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/work/main/" in f.filename or "site-packages" not in f.filename]
        ours = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames if "pyg_ugrapher" in f.filename
                or "triton_kernels" in f.filename or "autotune" in f.filename]
        seen.append(f"{str(message)[:60]} <- {' <- '.join(reversed(ours[-4:]))}")

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode(1)
    step(fresh(batches[5:6])[0])
    torch.cuda.set_sync_debug_mode(0)
    warnings.showwarning = warnings._showwarning_orig if hasattr(warnings, "_showwarning_orig") else warnings.showwarning
    say(f"\n== {model_name}: {len(seen)} host synchronisations in one new-graph step")
    for s in seen:
        say("   ", s)
    profiles = {}
    for label, items in (("new", fresh(batches[6:26])), ("same", fresh(batches[6:7]) * 20)):
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for b in items:
            step(b)
        torch.cuda.synchronize()
        pr.disable()
        profiles[label] = cumulative(pr)
    diff = {k: profiles["new"][k] - profiles["same"].get(k, 0.0) for k in profiles["new"]}
    say(f"   cumulative ms per step under cProfile, new graph minus same graph (top 30):")
    for k, v in sorted(diff.items(), key=lambda kv: -kv[1])[:30]:
        say(f"    {v / 20 * 1e3:8.3f}  (new {profiles['new'][k] / 20 * 1e3:8.3f})  {k}")
say("done")
