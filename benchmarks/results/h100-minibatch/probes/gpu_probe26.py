"""Mini-batch step cost: a new graph every step vs the same graph; ours vs PyG. argv[1]: tree."""
import sys, os, time
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import torch_geometric.nn as pygnn
import pyg_ugrapher, pyg_ugrapher.nn as ugnn
from pyg_ugrapher import GraphTensor, OpInfo
from autotune import selection
print("code from", os.path.dirname(pyg_ugrapher.__file__))
dev = torch.device("cuda")
data = torch.load("/tmp/batches.pt")
def bench(model, batches, new_graph):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs = [torch.randn(n, 128, device=dev) for _, n in batches]
    def step(i):
        b, n = batches[i] if new_graph else batches[4]
        x = xs[i] if new_graph else xs[4]
        opt.zero_grad(set_to_none=True)
        model(x, b.clone() if new_graph else b).square().mean().backward()
        opt.step()
    for i in range(5): step(i)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(5, 60): step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / 55 * 1e3
for kind in ("sampled", "subsets"):
    batches = data[kind]
    for name, make in [("GCN", lambda ns: ns.GCNConv(128, 128)), ("SAGE", lambda ns: ns.SAGEConv(128, 128)),
                       ("GAT", lambda ns: ns.GATConv(128, 32, heads=4))]:
        selection.clear_cache()
        ours, theirs = make(ugnn).to(dev), make(pygnn).to(dev)
        a = bench(ours, batches, True); b_ = bench(ours, batches, False)
        c = bench(theirs, batches, True); d = bench(theirs, batches, False)
        print(f"{kind} {name}: ours new-graph {a:.3f} ms, same-graph {b_:.3f}; PyG new-graph {c:.3f}, same {d:.3f}", flush=True)
op = OpInfo.from_name("copy_u_sum")
for kind in ("sampled", "subsets"):
    parts = {"graph": 0.0, "stats": 0.0, "select": 0.0, "select_again": 0.0}
    selection.clear_cache()
    for b, n in data[kind][5:45]:
        b = b.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter(); gt = GraphTensor.from_edge_index(b, n); gt.csr(); torch.cuda.synchronize()
        t1 = time.perf_counter(); gt.stats()
        t2 = time.perf_counter(); selection.select(gt, op, 128)
        t3 = time.perf_counter(); selection.select(gt, op, 128)
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)): parts[k] += v / 40 * 1e6
    print(kind, "per new graph, us:", {k: round(v, 1) for k, v in parts.items()}, flush=True)
