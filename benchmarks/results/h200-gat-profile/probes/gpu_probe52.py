"""Probe 52: GAT's attention kernels with head-split tiles (the weight computed once per head) or
flat tiles (once per feature), and the schedules around the cost model's choice.

Per graph (4e6 edges, 128 -> 4 x 32, as the layer suite), the attention operators of one training
step are recorded (their structure, operands and decision). Then:
1. each operator under its decided schedule, split and flat tiles (``do_bench`` median);
2. the forward output and the backward gather + edge-output pair under sampled vertex and group
   schedules, split tiles; the 5 best also flat;
3. the whole eager training step, split and flat (CUDA events, back to back).

    python3 gpu_probe52.py <repo> OUT
"""
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm
from triton.testing import do_bench

import pyg_ugrapher.nn as ugnn
import triton_kernels
from pyg_ugrapher import attention, datasets, ops
from pyg_ugrapher.ops import AUTO
from pyg_ugrapher.parallel import ParallelInfo
from triton_kernels import codegen, dispatch, space

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
N, E, W = 200_000, 4_000_000, 128


def variant(split):
    codegen.SPLIT_TILES = split
    dispatch._kernel.cache_clear()
    dispatch._spec.cache_clear()
    ops._SHARED_DECISIONS.clear()


def record(ei, x):
    calls = []
    run_graph_op, run_pair = attention.run_graph_op, attention.run_gather_with_edge_output

    def graph_op(structure, operands, op, schedule):
        calls.append(("op", structure, list(operands), op))
        return run_graph_op(structure, operands, op, schedule)

    def pair(structure, g_ops, g, m_ops, m, gs, ms):
        calls.append(("pair", structure, (list(g_ops), list(m_ops)), (g, m)))
        return run_pair(structure, g_ops, g, m_ops, m, gs, ms)

    attention.run_graph_op, attention.run_gather_with_edge_output = graph_op, pair
    torch.manual_seed(0)
    model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
    model(x, ei).square().mean().backward()
    attention.run_graph_op, attention.run_gather_with_edge_output = run_graph_op, run_pair
    return calls


def runner(call, info=None):
    """A zero-argument function running ``call`` under ``info`` (its decision when ``None``)."""
    kind, structure, operands, op = call
    arrays = ops._arrays(structure)
    if kind == "op":
        d = ops._decision(arrays, operands, op, AUTO)
        chosen = info or d[2]
        return chosen, d[1].message_width, (lambda: triton_kernels.run(d[0], d[1], arrays, operands, chosen, d[3]))
    (g_ops, m_ops), (g, m) = operands, op
    d = ops._decision(arrays, g_ops, g, AUTO, (m, m_ops))
    chosen = info or d[2]
    m_layout = ops._layout_of(m, m_ops)

    def fn():
        both = triton_kernels.run_with_edge_output(d[0], d[1], ops._op(m), m_layout, arrays, g_ops, m_ops, chosen,
                                                   (d[3], torch.float32))
        assert both is not None, chosen
        return both
    return chosen, d[1].message_width, fn


def bench(fn):
    fn()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def candidates(kind):
    found = []
    tiles = (128,) if kind == "pair" else (64, 128)
    limit = 4096 if kind == "pair" else 8192
    for bf, bv, be in itertools.product(tiles, (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16)):
        tile = bf * bv * be
        if tile > limit or tile < 256:
            continue
        for w in sorted({max(1, min(8, tile // 512)), max(1, min(8, tile // 1024))}):
            found.append(ParallelInfo("vertex", block_f=bf, block_v=bv, block_e=be, num_warps=w, num_stages=1))
    for bf, g, bv, be in itertools.product(tiles, (32, 128), (4, 16), (1, 2, 4)):
        tile = bf * bv * be
        if tile > limit or tile < 512:
            continue
        found.append(ParallelInfo("group", block_f=bf, group_size=g, block_v=bv, block_e=be,
                                  num_warps=4 if tile <= 4096 else 8, num_stages=1))
    return found


def step_time(ei, x, target):
    torch.manual_seed(0)
    model = ugnn.GATConv(W, W // 4, heads=4).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x, ei), target).backward()
        opt.step()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); step(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 2)
    return statistics.median(times)


rows, sweep, steps = [], [], []
for kind in ("uniform", "power_law"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    torch.manual_seed(0)
    x = torch.randn(N, W, device=dev)
    target = torch.randn(N, W, device=dev)
    variant(True)
    calls = record(ei, x)
    for i, call in enumerate(calls):
        name = ops._op(call[3] if call[0] == "op" else call[3][0]).name[:70]
        for split in (True, False):
            variant(split)
            chosen, width, fn = runner(call)
            rows.append(dict(graph=kind, call=i, kind=call[0], op=name, split=split, schedule=str(chosen),
                             ms=bench(fn)))
            print(rows[-1], flush=True)
    # the forward output (third forward call) and the backward pair
    heavy = [i for i, c in enumerate(calls) if c[0] == "pair"] + [2]
    for i in heavy:
        call = calls[i]
        variant(True)
        for info in tqdm(candidates(call[0]), desc=f"{kind} call {i}", mininterval=30):
            try:
                _, _, fn = runner(call, info)
                ms = bench(fn)
            except Exception as error:  # noqa: BLE001
                ms, info = float("nan"), f"{info} {type(error).__name__}"
            sweep.append(dict(graph=kind, call=i, kind=call[0], split=True, schedule=str(info), ms=ms))
        best = sorted((r for r in sweep if r["graph"] == kind and r["call"] == i and r["ms"] == r["ms"]),
                      key=lambda r: r["ms"])[:5]
        print(f"{kind} call {i} best split:", *[(r["schedule"], round(r["ms"], 4)) for r in best], sep="\n  ")
        variant(False)
        for r in best:
            info = next(c for c in candidates(call[0]) if str(c) == r["schedule"])
            _, _, fn = runner(call, info)
            sweep.append(dict(graph=kind, call=i, kind=call[0], split=False, schedule=r["schedule"], ms=bench(fn)))
            print("  flat", r["schedule"], round(sweep[-1]["ms"], 4), flush=True)
    for split in (True, False, True, False):
        variant(split)
        steps.append(dict(graph=kind, split=split, step_ms=step_time(ei.clone(), x, target)))
        print(steps[-1], flush=True)
    del calls
    torch.cuda.empty_cache()

pd.DataFrame(rows).to_csv(out / "probe52_ops.csv", index=False)
pd.DataFrame(sweep).to_csv(out / "probe52_sweep.csv", index=False)
pd.DataFrame(steps).to_csv(out / "probe52_steps.csv", index=False)
