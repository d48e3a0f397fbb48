"""Probe 64: weighted GCNConv(aggr="max") under torch.compile(mode="reduce-overhead") against eager,
on the test suite's graph as it is (four self loops of different weights at its hub) and with
every self loop but the first of each node removed; three calls each.

    python3 gpu_probe64.py <repo>
"""
import copy
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/tests/pyg_ugrapher")
import torch

import pyg_ugrapher.nn as ugnn
from test_compile import layer_inputs

dev = torch.device("cuda")
x, edge_index, weight, _ = layer_inputs(200, 2000)
is_loop = edge_index[0] == edge_index[1]
first = torch.ones(edge_index.size(1), dtype=torch.bool)
seen = set()
for i in is_loop.nonzero().flatten().tolist():
    node = edge_index[0, i].item()
    first[i] = node not in seen
    seen.add(node)
for label, keep in (("as is", torch.ones_like(first)), ("one loop per node", first)):
    ei, w, xd = edge_index[:, keep].to(dev), weight[keep].to(dev), x.to(dev)
    torch.manual_seed(0)
    model = ugnn.GCNConv(6, 4, aggr="max").to(dev)
    compiled = torch.compile(copy.deepcopy(model), mode="reduce-overhead")
    errors = []
    for call in range(3):
        a = compiled(xd, ei, w).detach().clone().double()
        b = model(xd, ei, w).detach().double()
        errors.append(f"{((a - b).norm() / b.norm()).item():.1e} (rows differing: {(a - b).abs().amax(1).gt(1e-5).sum().item()})")
    print(label, errors, flush=True)
    torch._dynamo.reset()
