"""A/B of two trees: two-layer GCN / SAGE full-batch training step on cora and tolokers (median of 40 steps, CUDA events); prints the schedules chosen. Run: PYTHONPATH=<tree> python gpu_fullbatch_ab.py <tag>."""
import sys, statistics, json
import torch, torch.nn.functional as F
import pyg_ugrapher.nn as ugnn
from pyg_ugrapher.datasets import load_dataset
from autotune import selection

tag = sys.argv[1]
dev = torch.device("cuda")
rows = []
for name in ["cora", "tolokers"]:
    data = load_dataset(name)
    x = data.x.float().to(dev); ei = data.edge_index.to(dev)
    y = data.y.long().view(-1).to(dev) if data.y is not None else torch.zeros(x.size(0), dtype=torch.long, device=dev)
    ncls = int(y.max()) + 1
    for model in ["gcn", "sage"]:
        selection.clear_cache()
        if model == "gcn":
            l1, l2 = ugnn.GCNConv(x.size(1), 64, cached=True), ugnn.GCNConv(64, ncls, cached=True)
        else:
            l1, l2 = ugnn.SAGEConv(x.size(1), 64), ugnn.SAGEConv(64, ncls)
        net = torch.nn.ModuleList([l1, l2]).to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        def step():
            opt.zero_grad()
            h = F.relu(l1(x, ei)); out = l2(h, ei)
            loss = F.cross_entropy(out, y); loss.backward(); opt.step()
        for _ in range(5): step()
        torch.cuda.synchronize()
        ts = []
        for _ in range(40):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        med = statistics.median(ts)
        decisions = {str((k[1].name if hasattr(k[1], 'name') else k[1], k[2], k[3])): str(v) for k, v in selection._CACHE.items()}
        print(f"RESULT {tag} {name} {model} {med:.3f} ms  E={ei.size(1)}")
        for k, v in decisions.items():
            print(f"   DEC {tag} {name} {model} {k} -> {v}")
