"""The structure kernel (triton_kernels.csr_pair) against the torch build, on the H100 host:
outputs equal on sampled COLLAB batches and a 1.6e7-edge graph; host time per new graph; GPU time
on the large graph; interleaved 2-layer training steps on fresh COLLAB batches with the kernel on
and off (same process, rounds alternate). argv[1]: tree."""
import os, sys, time, statistics
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import triton.testing
import pyg_ugrapher as ug, pyg_ugrapher.nn as ugnn, pyg_ugrapher.graph as ggraph
import torch_geometric.nn as pygnn
from benchmarks import train_e2e as te

dev = torch.device("cuda")
KERNEL, TORCH = ggraph._triton_builds, (lambda device: False)
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:48]
fresh = lambda: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches[8:48]]
nodes = lambda b: b.node_ids.numel()

def build(src, dst, ns, nd, mode):
    ggraph._triton_builds = mode
    try:
        return ggraph.build_csr_pair(src, dst, ns, nd, src.dtype)
    finally:
        ggraph._triton_builds = KERNEL

def same(a, b):
    return all(torch.equal(getattr(x, f), getattr(y, f)) for x, y in zip(a, b) for f in ("rowptr", "col", "eid", "rows"))

print("== equal outputs", flush=True)
for b in batches[:8]:
    src, dst = b.edge_index[0].int(), b.edge_index[1].int()
    assert same(build(src, dst, nodes(b), nodes(b), KERNEL), build(src, dst, nodes(b), nodes(b), TORCH))
n, e = 10**6, 16 * 10**6
g = torch.Generator(device=dev).manual_seed(0)
src = torch.randint(0, n, (e,), device=dev, generator=g, dtype=torch.int32)
dst = torch.randint(0, n, (e,), device=dev, generator=g, dtype=torch.int32)
assert same(build(src, dst, n, n, KERNEL), build(src, dst, n, n, TORCH))
print("  8 COLLAB batches and a uniform 1.6e7-edge graph: equal", flush=True)
for label, mode in (("kernel", KERNEL), ("torch", TORCH)):
    ms = triton.testing.do_bench(lambda: build(src, dst, n, n, mode), warmup=50, rep=500)
    print(f"  GPU time, 1.6e7 edges, {label}: {ms:.3f} ms", flush=True)
del src, dst

def per_graph(fn, reps=5):
    out = []
    for _ in range(reps):
        items = fresh(); torch.cuda.synchronize(); t = time.perf_counter()
        for b in items: fn(b)
        torch.cuda.synchronize(); out.append((time.perf_counter() - t) / len(items) * 1e6)
    return out

print("== host time per new COLLAB batch graph (us), rounds alternate", flush=True)
res = {"kernel": [], "torch": []}
for rnd in range(3):
    for label, mode in (("kernel", KERNEL), ("torch", TORCH)):
        ggraph._triton_builds = mode
        res[label] += per_graph(lambda b: ggraph.GraphTensor(b.edge_index[0], b.edge_index[1], nodes(b), nodes(b), validate=False).structure(dev))
ggraph._triton_builds = KERNEL
for label, v in res.items():
    print(f"  GraphTensor(validate=False).structure(), {label}: median {statistics.median(v):.1f} min {min(v):.1f}", flush=True)
sorts = per_graph(lambda b: torch.sort(torch.cat([b.edge_index[1], b.edge_index[0]]).int(), stable=True))
print(f"  for scale, cat + one stable sort: median {statistics.median(sorts):.1f}", flush=True)

print("== 2-layer steps on 40 fresh COLLAB batches, ms/step, 5 rounds alternating", flush=True)
rows = []
for model_name in ("sage", "gcn", "gin", "gat"):
    res = {"pyg": [], "kernel": [], "torch": []}
    models = {}
    for label, layers in (("pyg", pygnn), ("kernel", ugnn), ("torch", ugnn)):
        torch.manual_seed(0)
        m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        models[label] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
    for rnd in range(5):
        for label, (m, opt) in models.items():
            ggraph._triton_builds = TORCH if label == "torch" else KERNEL
            items = fresh()
            def step(b):
                opt.zero_grad()
                out = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
                F.cross_entropy(out, task.y[b.node_ids[:b.num_seeds]]).backward(); opt.step()
            for b in items[:3]: step(b)
            torch.cuda.synchronize(); t = time.perf_counter()
            for b in items[3:]: step(b)
            torch.cuda.synchronize(); res[label].append((time.perf_counter() - t) / (len(items) - 3) * 1e3)
    ggraph._triton_builds = KERNEL
    print(f"  {model_name}: " + "; ".join(f"{k} median {statistics.median(v):.3f} min {min(v):.3f} ({', '.join(f'{x:.2f}' for x in v)})" for k, v in res.items()), flush=True)
