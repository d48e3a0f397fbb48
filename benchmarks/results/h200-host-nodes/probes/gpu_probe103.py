"""Probe 103 (one process of ``gpu_ab103.py``): host-bound steps with the package of ``TREE``.

Layer steps (GAT 4 x 32, GIN, SAGE on the suite's 4e6-edge graphs: 30 steps, 3 rounds), mini-batch
steps (``train_e2e``'s 2-layer models on COLLAB batches, a fresh one per step: 40 steps, 3 rounds),
and the host time of one ``copy_u_sum`` forward + backward on a COLLAB batch graph (500 calls, no
sync inside). Appends rows ``part, name, tree, value`` (ms per step, us per call) to OUT.csv.

    python3 gpu_probe103.py TREE LABEL OUT.csv
"""
import os
import statistics
import sys
import time

tree, label, out_csv = sys.argv[1:4]
sys.path.insert(0, os.path.abspath(tree))
sys.path.insert(1, os.getcwd())
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402
from benchmarks import train_e2e as te  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402

assert os.path.dirname(ug.__file__).startswith(os.path.abspath(tree)), ug.__file__
rows = []
dev = torch.device("cuda")


def rounds(step, items_of, count=3):
    times = []
    for _ in range(count):
        items = items_of()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for item in items:
            step(item)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / len(items) * 1e3)
    return statistics.median(times)


makers = {"GATConv": lambda: ugnn.GATConv(128, 32, heads=4),
          "GINConv": lambda: ugnn.GINConv(torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                                               torch.nn.Linear(128, 128))),
          "SAGEConv": lambda: ugnn.SAGEConv(128, 128)}
for spec in layer_graphs():
    loaded = spec.load(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    target = torch.randn(loaded.num_nodes, 128, generator=gen, device=dev)
    for name, make in makers.items():
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(_):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x, loaded.edge_index), target).backward()
            opt.step()
        for _ in range(5):
            step(None)
        rows.append(("layer", f"{name} {spec.name}", label, rounds(step, lambda: [None] * 30)))
        del model, opt
    del loaded, x, target
    torch.cuda.empty_cache()

task = te.make_task("collab", dev, 0)
batches = te.sample_epochs(task, 1, 1024, [10, 10], 0)[0][:45]
fresh = lambda bs: [te.Batch(b.node_ids, b.edge_index.clone(), b.num_seeds) for b in bs]  # noqa: E731
for model_name in ("gcn", "gat", "sage", "gin"):
    torch.manual_seed(0)
    model = te.build_model(model_name, ugnn, task.x.size(1), 64, task.num_classes, full_batch=False).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        o = model(task.x[b.node_ids], b.edge_index)[:b.num_seeds]
        F.cross_entropy(o, task.y[b.node_ids[:b.num_seeds]]).backward()
        opt.step()
    for b in fresh(batches[:5]):
        step(b)
    rows.append(("minibatch", model_name, label, rounds(step, lambda: fresh(batches[5:45]))))
    del model, opt

graph = ug.GraphTensor.from_edge_index(batches[0].edge_index, batches[0].node_ids.numel())
xs = torch.randn(graph.num_src, 64, device=dev, requires_grad=True)
grad = torch.ones(graph.num_dst, 64, device=dev)
for _ in range(20):
    ug.compute(graph, "copy_u_sum", xs).backward(grad)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(500):
    ug.compute(graph, "copy_u_sum", xs).backward(grad)
rows.append(("op", "copy_u_sum fwd+bwd host", label, (time.perf_counter() - t) / 500 * 1e6))
torch.cuda.synchronize()
frame = pd.DataFrame(rows, columns=["part", "name", "tree", "value"])
frame.to_csv(out_csv, mode="a", header=not os.path.exists(out_csv), index=False)
print(frame.to_string(), flush=True)
