"""Probe 104: host us per call with the package of TREE, on a random graph of COLLAB batch size
(47500 nodes, 1e5 edges, F = 64): ``copy_u_sum`` forward + backward through ``ug.compute``, a
``u_mul_e_sum`` forward with a static weight, and a GATConv(64, 8, heads=8) forward + backward;
7 repetitions of 300 calls (no sync inside), the median. Appends to OUT.csv.

    python3 gpu_probe104.py TREE LABEL OUT.csv
"""
import os
import statistics
import sys
import time

tree, label, out_csv = sys.argv[1:4]
sys.path.insert(0, os.path.abspath(tree))
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
import pyg_ugrapher.nn as ugnn  # noqa: E402

assert os.path.dirname(ug.__file__).startswith(os.path.abspath(tree)), ug.__file__
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
n, e = 47500, 100000
edge_index = torch.randint(0, n, (2, e), device=dev, generator=gen)
graph = ug.GraphTensor.from_edge_index(edge_index, n)
x = torch.randn(n, 64, device=dev, generator=gen, requires_grad=True)
w = torch.rand(e, 1, device=dev, generator=gen)
grad = torch.ones(n, 64, device=dev)
gat = ugnn.GATConv(64, 8, heads=8).to(dev)
cases = {
    "copy_u_sum fwd+bwd": lambda: ug.compute(graph, "copy_u_sum", x).backward(grad),
    "u_mul_e_sum fwd, static weight": lambda: ug.compute(graph, "u_mul_e_sum", x.detach(), w),
    "GATConv fwd+bwd": lambda: gat(x, edge_index).backward(grad),
}
rows = []
for name, call in cases.items():
    for _ in range(30):
        call()
    torch.cuda.synchronize()
    reps = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(300):
            call()
        reps.append((time.perf_counter() - t) / 300 * 1e6)
        torch.cuda.synchronize()
    rows.append((name, label, statistics.median(reps)))
frame = pd.DataFrame(rows, columns=["name", "tree", "us"])
frame.to_csv(out_csv, mode="a", header=not os.path.exists(out_csv), index=False)
print(frame.to_string(), flush=True)
