"""A/B of mini-batch training steps (2-layer models of train_e2e, 40 fresh COLLAB batches per
round), two code trees alternating in subprocesses, ROUNDS rounds each (env, default 5); the host's
speed drifts between and within runs, so the minimum is the steadier figure. argv: tree_a tree_b."""
import os, subprocess, sys, json, statistics
CHILD = r'''
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import pyg_ugrapher.nn as ugnn, torch_geometric.nn as pygnn
from benchmarks import train_e2e as te
dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
out = {}
for name in sys.argv[2].split(","):
    for label, layers in (("ours", ugnn), ("pyg", pygnn)):
        if label == "pyg" and sys.argv[3] != "1": continue
        torch.manual_seed(0)
        m = te.build_model(name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        def step(b):
            opt.zero_grad()
            o = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
            F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward(); opt.step()
        for rep in range(2):
            items = [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches]
            for b in items[:5]: step(b)
            torch.cuda.synchronize(); t = time.perf_counter()
            for b in items[5:]: step(b)
            torch.cuda.synchronize()
            out[f"{name}/{label}"] = (time.perf_counter() - t) / (len(items) - 5) * 1e3
print(json.dumps(out))
'''
trees = sys.argv[1:3]
models = "sage,gcn,gin,gat"
res = {}
for rnd in range(int(os.environ.get("ROUNDS", 5))):
    for i, tree in enumerate(trees):
        r = subprocess.run([sys.executable, "-c", CHILD, tree, models, "1" if i == 0 else "0"], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-3000:]); sys.exit(1)
        for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items():
            res.setdefault((k, tree if "ours" in k else "pyg"), []).append(v)
for (k, tree), v in sorted(res.items()):
    print(f"{k:14s} {tree:12s} min {min(v):7.3f} median {statistics.median(v):7.3f} ms/step  runs {[round(x, 2) for x in v]}")
