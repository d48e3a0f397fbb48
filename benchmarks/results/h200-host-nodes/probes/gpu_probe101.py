"""Probe 101: mini-batch steps with the dense Functions from ``MIN_ELEMENTS`` on (B) against the
previous rule, from 32768 rows on (A).

``train_e2e``'s 2-layer models (hidden 64) on its sampled batches (1024 seeds, 10 + 10 neighbours)
of COLLAB and tolokers, a fresh batch every step. In one process, 5 alternating rounds of 40 steps
per variant: ms per step (CUDA-synchronised at the round's ends), and the dense Functions each
variant applied in one step.

    python3 gpu_probe101.py OUT.txt
"""
import collections
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from pyg_ugrapher.nn import _dense, gat_conv, gcn_conv  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


OLD_ROWS = 1 << 15
new_fused, new_add_bias, new_min = _dense._fused, _dense.add_bias, _dense.MIN_ELEMENTS


def old_fused(x, *maps):
    if x.dim() != 2 or x.shape[0] < OLD_ROWS:
        return False
    return len({x.dtype}.union(p.dtype for m in maps for p in (m.weight, m.bias) if p is not None)) == 1


def old_add_bias(out, bias):
    width = out.shape[-1] if out.dim() else 0
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not bias.requires_grad or width == 0 \
            or out.numel() < OLD_ROWS * width or out.dtype != bias.dtype:
        return out + bias
    return _dense._AddBias.apply(out, bias)


def variant(old):
    _dense._fused = old_fused if old else new_fused
    _dense.MIN_ELEMENTS = 0 if old else new_min
    gcn_conv.add_bias = gat_conv.add_bias = old_add_bias if old else new_add_bias


counted = collections.Counter()
for function in (_dense._Linear, _dense._AddBias):
    original = function.apply
    function.apply = (lambda *args, f=original, name=function.__name__: counted.update([name]) or f(*args))

dev = torch.device("cuda")
for dataset in ("collab", "tolokers"):
    task = te.make_task(dataset, dev, 0)
    batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
    fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731
    say(f"== {dataset}: {task.x.size(0)} nodes, batches of ~{batches[0].node_ids.numel()} nodes and "
        f"~{batches[0].edge_index.size(1)} edges")
    for model_name in ("gcn", "gat", "sage", "gin"):
        torch.manual_seed(0)
        model = te.build_model(model_name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        pyg = te.build_model(model_name, pygnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        steps = {}
        for label, m in (("ours", model), ("pyg", pyg)):
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)

            def step(b, m=m, opt=opt):
                opt.zero_grad()
                o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
                F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
                opt.step()
            steps[label] = step
        for old in (True, False):
            variant(old)
            for b in fresh(batches[:5]):
                steps["ours"](b)
        for b in fresh(batches[:5]):
            steps["pyg"](b)
        applied = {}
        for old in (True, False):
            variant(old)
            counted.clear()
            steps["ours"](fresh(batches[5:6])[0])
            applied[old] = dict(counted)
        results = collections.defaultdict(list)
        for _ in range(5):
            for label, old in (("A rows rule", True), ("B elements rule", False), ("PyG eager", None)):
                if old is not None:
                    variant(old)
                step = steps["pyg" if old is None else "ours"]
                items = fresh(batches[5:45])
                torch.cuda.synchronize()
                t = time.perf_counter()
                for b in items:
                    step(b)
                torch.cuda.synchronize()
                results[label].append((time.perf_counter() - t) / len(items) * 1e3)
        say(f"  {model_name}: Functions per step A {applied[True]} B {applied[False]}")
        for label, v in results.items():
            say(f"    {label:16s} ms/step {statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]")
        variant(False)
        del model, pyg, steps
    del task, batches
    torch.cuda.empty_cache()
say("done")
