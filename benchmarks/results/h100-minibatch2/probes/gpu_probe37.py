"""Host profile of new-graph mini-batch steps (ours): cProfile (cumulative) and torch.profiler
(self CPU per op) over 20 steps on fresh COLLAB batches. argv[1]: tree; env PROBE_MODELS."""
import os, sys, time, cProfile, pstats, io
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import pyg_ugrapher.nn as ugnn
from benchmarks import train_e2e as te
from torch.profiler import profile, ProfilerActivity
dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]
for name in os.environ.get("PROBE_MODELS", "sage gcn gat").split():
    torch.manual_seed(0)
    model = te.build_model(name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    def step(b):
        opt.zero_grad()
        out = model(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(out, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    for b in fresh(batches[:5]): step(b)
    torch.cuda.synchronize()
    seq = fresh(batches[5:25])
    pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
    for b in seq: step(b)
    torch.cuda.synchronize(); pr.disable()
    print(f"=== {name}: {(time.perf_counter() - t) / 20 * 1e3:.3f} ms/step under cProfile", flush=True)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40); print(s.getvalue()[-9000:])
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[-5000:])
    seq = fresh(batches[25:45])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for b in seq: step(b)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
