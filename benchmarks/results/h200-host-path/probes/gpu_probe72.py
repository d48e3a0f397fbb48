"""Probe 72: where host time goes now, on the small graphs where every step is host-bound.

A. Host time per call (GPU idle between loops) of one ``copy_u_sum`` forward on a COLLAB
   mini-batch graph at F = 64, through each layer of our path (``ug.compute``, ``run_graph_op``,
   the decision's plan, ``DirectKernel.run``, the compiled binary's ``run``), against PyG's ATen
   path (``index_select`` + ``index_add_``) and cuSPARSE (``torch.sparse.mm``).
B. 2-layer training steps (train_e2e's models, hidden 64) on fresh COLLAB mini-batches, ours and
   PyG alternating, 3 rounds; then the same models on one batch graph every step.
C. cProfile (internal time) and torch.profiler (self CPU) of 20 new-graph steps, SAGE and GAT.

    python3 gpu_probe72.py OUT.txt
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
import torch_geometric.nn as pygnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from pyg_ugrapher import ops as ugops  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

out = open(sys.argv[1], "w")


def say(*args):
    print(*args, flush=True)
    print(*args, file=out, flush=True)


dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:60]
say(f"COLLAB batches: {len(batches)}, edges per batch {statistics.median(b.edge_index.size(1) for b in batches):.0f}, "
    f"nodes {statistics.median(b.node_ids.numel() for b in batches):.0f}")


def host_us(fn, reps=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn()
        times.append((time.perf_counter() - t) / (reps // 5) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


# -- A: one operator's host path ---------------------------------------------------------------
b0 = batches[0]
n0 = b0.node_ids.numel()
graph = ug.GraphTensor(b0.edge_index[0], b0.edge_index[1], n0, n0)
x = torch.randn(n0, 64, device=dev)
structure = graph.structure(dev)
text = ugops.serialized(ug.OpInfo.from_name("copy_u_sum"))
arrays = ugops._arrays(structure)
info, layout, chosen, dtype, plan = ugops._decision(arrays, [x], text, ugops.AUTO)
say(f"copy_u_sum decision on batch 0: {chosen}")
kernel = plan.kernel
captured = {}
orig_run = type(kernel).run


def capture(self, grid, args, kwargs):
    captured.update(grid=grid, args=args, kwargs=kwargs)
    return orig_run(self, grid, args, kwargs)


type(kernel).run = capture
plan(arrays, [x])
type(kernel).run = orig_run
binary = next(iter(kernel.binaries.values()))
g, a, kw = captured["grid"], captured["args"], captured["kwargs"]
tail = [kw[name] for name in kernel.names[len(a):]]
stream = torch.cuda.current_stream().cuda_stream
src, dst = b0.edge_index
csr = torch.sparse_csr_tensor(structure[0], structure[1], torch.ones(structure[1].numel(), device=dev), (n0, n0))
rows = [
    ("binary.run (Triton's compiled launcher alone)",
     lambda: binary.run(g[0], g[1] if len(g) > 1 else 1, 1, stream, binary.function, binary.packed_metadata,
                        None, None, None, *a, *tail)),
    ("DirectKernel.run", lambda: kernel.run(g, a, kw)),
    ("Triton's own launcher: fn[grid](...)", lambda: kernel.fn[g](*a, **kw)),
    ("plan(arrays, [x])", lambda: plan(arrays, [x])),
    ("run_graph_op", lambda: ugops.run_graph_op(structure, [x], text, ugops.AUTO)),
    ("ug.compute(graph, 'copy_u_sum', x)", lambda: ug.compute(graph, "copy_u_sum", x)),
    ("ug.compute, x requires grad (autograd node)", None),
    ("torch.empty([N, 64])", lambda: torch.empty(n0, 64, device=dev)),
    ("PyG path: x.index_select + zeros + index_add_", lambda: torch.zeros(n0, 64, device=dev).index_add_(0, dst, x.index_select(0, src))),
    ("cuSPARSE: torch.sparse.mm(csr, x)", lambda: torch.sparse.mm(csr, x)),
]
xg = x.clone().requires_grad_()
rows[6] = (rows[6][0], lambda: ug.compute(graph, "copy_u_sum", xg))
say("\n== A. host us per call, copy_u_sum forward, batch 0 (GPU idle between loops)")
for label, fn in rows:
    say(f"  {label:55s} {host_us(fn):7.1f}")

# -- B: 2-layer steps ---------------------------------------------------------------------------
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]


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


say("\n== B. 2-layer steps on fresh COLLAB batches (new graph every step) / on batch 0 every step, ms per step "
    "(median of 3 alternating rounds; rounds in brackets)")
for model_name in ("gcn", "sage", "gin", "gat"):
    steps = {"pyg": make(model_name, pygnn), "ours": make(model_name, ugnn)}
    res = {k: [] for k in steps}
    same = {k: [] for k in steps}
    for rnd in range(3):
        for label, step in steps.items():
            items = fresh(batches[:45])
            for b in items[:5]:
                step(b)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for b in items[5:]:
                step(b)
            torch.cuda.synchronize()
            res[label].append((time.perf_counter() - t) / (len(items) - 5) * 1e3)
            b = fresh(batches[:1])[0]
            for _ in range(5):
                step(b)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(40):
                step(b)
            torch.cuda.synchronize()
            same[label].append((time.perf_counter() - t) / 40 * 1e3)
    fmt = lambda v: f"{statistics.median(v):.3f} [{', '.join(f'{t:.2f}' for t in v)}]"
    say(f"  {model_name:5s} new graph: ours {fmt(res['ours'])}  pyg {fmt(res['pyg'])}   "
        f"same graph: ours {fmt(same['ours'])}  pyg {fmt(same['pyg'])}")

# -- C: profiles of new-graph steps -------------------------------------------------------------
for model_name in ("sage", "gat"):
    step = make(model_name, ugnn)
    for b in fresh(batches[:5]):
        step(b)
    torch.cuda.synchronize()
    seq = fresh(batches[5:25])
    pr = cProfile.Profile()
    pr.enable()
    for b in seq:
        step(b)
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    say(f"\n== C. {model_name}: cProfile of 20 new-graph steps, internal time\n" + s.getvalue()[-7000:])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    say(s.getvalue()[-9000:])
    seq = fresh(batches[25:45])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for b in seq:
            step(b)
        torch.cuda.synchronize()
    say(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
say("done")
