"""Host cost of a new graph, piece by piece, on 40 fresh COLLAB mini-batch graphs (GPU mostly
idle: host time), and an interleaved A/B of 2-layer training steps: endpoint validation with its
sync vs without (device-side assert). argv[1]: tree."""
import os, sys, time, statistics
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import pyg_ugrapher as ug, pyg_ugrapher.nn as ugnn, pyg_ugrapher.graph as ggraph
import torch_geometric.nn as pygnn
from torch_geometric.utils import scatter
from benchmarks import train_e2e as te
dev = torch.device("cuda")
task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in batches[5:45]]

def per_graph(fn, label, reps=3):
    out = []
    for _ in range(reps):
        items = fresh(); torch.cuda.synchronize(); t = time.perf_counter()
        for b in items: fn(b)
        torch.cuda.synchronize(); out.append((time.perf_counter() - t) / len(items) * 1e6)
    print(f"  {label:60s} {statistics.median(out):8.1f} us per graph  (runs {[round(v) for v in out]})", flush=True)

x64 = torch.randn(task.x.size(0), 64, device=dev)
xs = {id(b): None for b in batches}
def nodes(b): return b.node_ids.numel()
print("== pieces, code from", os.path.dirname(ug.__file__), flush=True)
per_graph(lambda b: ggraph.GraphTensor(b.edge_index[0], b.edge_index[1], nodes(b), nodes(b)), "GraphTensor(validate=True)")
per_graph(lambda b: ggraph.GraphTensor(b.edge_index[0], b.edge_index[1], nodes(b), nodes(b), validate=False), "GraphTensor(validate=False)")
per_graph(lambda b: ggraph.GraphTensor(b.edge_index[0], b.edge_index[1], nodes(b), nodes(b), validate=False).structure(dev), "GraphTensor(validate=False).structure()")
per_graph(lambda b: b.edge_index.sort(), "one torch.sort of the [2, E] index (reference)")
def ours_fb(b, g=None):
    x = x64[b.node_ids].requires_grad_()
    g = g or ggraph.GraphTensor(b.edge_index[0], b.edge_index[1], nodes(b), nodes(b))
    ug.compute(g, "copy_u_mean", x).sum().backward()
same = ggraph.GraphTensor(batches[0].edge_index[0], batches[0].edge_index[1], nodes(batches[0]), nodes(batches[0]))
ours_fb(batches[0], same)
per_graph(lambda b: ours_fb(batches[0], same), "ug.compute copy_u_mean fwd+bwd, same graph")
per_graph(ours_fb, "ug.compute copy_u_mean fwd+bwd, new graph")
def pyg_fb(b):
    x = x64[b.node_ids].requires_grad_()
    scatter(x[b.edge_index[0]], b.edge_index[1], 0, dim_size=nodes(b), reduce="mean").sum().backward()
per_graph(pyg_fb, "PyG scatter mean fwd+bwd, new graph")
def sage(layer, b):
    layer(x64[b.node_ids], b.edge_index).sum().backward()
ls, lp = ugnn.SAGEConv(64, 64).to(dev), pygnn.SAGEConv(64, 64).to(dev)
sage(ls, batches[0]); sage(lp, batches[0])
per_graph(lambda b: sage(ls, batches[0]), "our SAGEConv fwd+bwd, same graph")
per_graph(lambda b: sage(ls, b), "our SAGEConv fwd+bwd, new graph")
per_graph(lambda b: sage(lp, b), "PyG SAGEConv fwd+bwd, new graph")
lg, lpg = ugnn.GCNConv(64, 64).to(dev), pygnn.GCNConv(64, 64).to(dev)
sage(lg, batches[0]); sage(lpg, batches[0])
per_graph(lambda b: sage(lg, batches[0]), "our GCNConv fwd+bwd, same graph")
per_graph(lambda b: sage(lg, b), "our GCNConv fwd+bwd, new graph")
per_graph(lambda b: sage(lpg, b), "PyG GCNConv fwd+bwd, new graph")
la, lpa = ugnn.GATConv(64, 8, heads=8).to(dev), pygnn.GATConv(64, 8, heads=8).to(dev)
sage(la, batches[0]); sage(lpa, batches[0])
per_graph(lambda b: sage(la, batches[0]), "our GATConv fwd+bwd, same graph")
per_graph(lambda b: sage(la, b), "our GATConv fwd+bwd, new graph")
per_graph(lambda b: sage(lpa, b), "PyG GATConv fwd+bwd, new graph")
if os.environ.get("PIECES_ONLY"):
    sys.exit(0)

orig_validate = ggraph._validate_endpoints
def no_sync_validate(src, dst, ns, nd):
    if src.is_cuda and src.numel():
        torch._assert_async((torch.minimum(src.min(), dst.min()) >= 0) & (src.max() < ns) & (dst.max() < nd))
        return
    orig_validate(src, dst, ns, nd)
print("== interleaved A/B, 2-layer steps on 40 fresh COLLAB batches, ms/step", flush=True)
for model_name in ("sage", "gcn", "gin", "gat"):
    res = {"pyg": [], "ours": [], "ours_nosync": []}
    models = {}
    for label, layers in (("pyg", pygnn), ("ours", ugnn), ("ours_nosync", ugnn)):
        torch.manual_seed(0)
        m = te.build_model(model_name, layers, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
        models[label] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
    for rnd in range(3):
        for label, (m, opt) in models.items():
            ggraph._validate_endpoints = no_sync_validate if label == "ours_nosync" else orig_validate
            items = fresh()
            def step(b):
                opt.zero_grad()
                out = m(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
                F.cross_entropy(out, task.y[b.node_ids[:b.num_seeds]]).backward(); opt.step()
            for b in items[:3]: step(b)
            torch.cuda.synchronize(); t = time.perf_counter()
            for b in items[3:]: step(b)
            torch.cuda.synchronize(); res[label].append((time.perf_counter() - t) / (len(items) - 3) * 1e3)
    ggraph._validate_endpoints = orig_validate
    print(f"  {model_name}: " + ", ".join(f"{k} {statistics.median(v):.3f} ({', '.join(f'{x:.2f}' for x in v)})" for k, v in res.items()), flush=True)
