"""Where a mini-batch step's time goes: 2-layer models of train_e2e on sampled batches (new graph
every step), ours vs PyG eager, with variants of ours (endpoint validation without its sync; the
same graph every step), and a profiler summary (host ms per step, GPU kernel ms per step, sync
wait, top host ops). argv[1]: tree. Env PROBE_SETS (datasets), PROBE_MODELS."""
import os, sys, time, statistics, collections
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import torch_geometric.nn as pygnn
import pyg_ugrapher, pyg_ugrapher.nn as ugnn, pyg_ugrapher.graph as ggraph
from benchmarks import train_e2e as te
print("code from", os.path.dirname(pyg_ugrapher.__file__), flush=True)
dev = torch.device("cuda")
SETS = os.environ.get("PROBE_SETS", "collab tolokers").split()
MODELS = os.environ.get("PROBE_MODELS", "gcn gat sage gin").split()
orig_validate = ggraph._validate_endpoints
def no_sync_validate(src, dst, ns, nd):
    if src.is_cuda and src.numel():
        low = torch.minimum(src.min(), dst.min()) >= 0
        torch._assert_async(low & (src.max() < ns) & (dst.max() < nd))
        return
    orig_validate(src, dst, ns, nd)

def run_steps(model, task, batches, same):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    def step(b):
        opt.zero_grad()
        out = model(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(out, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    seq = [batches[0]] * len(batches) if same else [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches]
    for b in seq[:5]: step(b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in seq[5:]: step(b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (len(seq) - 5) * 1e3, step, seq

def profile(step, seq):
    from torch.profiler import profile as prof, ProfilerActivity
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t = time.perf_counter()
        for b in seq[5:25]: step(b)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 20 * 1e3
    ev = p.key_averages()
    kern = sum(e.device_time_total for e in p.events() if e.device_type.name == "CUDA") / 20 / 1e3
    sync = sum(e.self_cpu_time_total for e in ev if "Synchronize" in e.key or "cudaMemcpy" in e.key) / 20 / 1e3
    top = sorted((e for e in ev if e.device_type.name == "CPU"), key=lambda e: -e.self_cpu_time_total)[:14]
    return wall, kern, sync, [(e.key, round(e.self_cpu_time_total / 20 / 1e3, 3), e.count // 20) for e in top]

for name in SETS:
    task = te.make_task(name, dev, 0)
    epochs = te.sample_epochs(task, 1, 1024, [10, 10], 0)
    batches = epochs[0][:45]
    print(f"== {name}: {len(batches)} batches, edges per batch ~{statistics.mean(b.edge_index.size(1) for b in batches):.0f}", flush=True)
    for model_name in MODELS:
        row = {}
        for label, layers, same, patch in [("pyg", pygnn, False, False), ("ours", ugnn, False, False),
                                           ("ours_nosync_validate", ugnn, False, True), ("ours_same_graph", ugnn, True, False)]:
            torch.manual_seed(0)
            model = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
            ggraph._validate_endpoints = no_sync_validate if patch else orig_validate
            ms, step, seq = run_steps(model, task, batches, same)
            row[label] = round(ms, 3)
            if label in ("pyg", "ours"):
                wall, kern, sync, top = profile(step, seq)
                print(f"  {model_name} {label} profiled: wall {wall:.3f} ms/step, GPU kernels {kern:.3f} ms/step, sync/memcpy host {sync:.3f} ms/step", flush=True)
                for k, t, c in top: print(f"      {t:8.3f} ms x{c:<4d} {k}")
        ggraph._validate_endpoints = orig_validate
        print(f"  {model_name} step ms: {row}", flush=True)
