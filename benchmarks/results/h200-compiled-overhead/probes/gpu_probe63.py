"""Probe 63: weighted GCNConv(aggr="max") on the GPU, compiled (Inductor) against eager and PyG, on
the test suite's graph as it is (its hub has several self loops of different weights) and with
every self loop but the first of each node removed.

    python3 gpu_probe63.py <repo>
"""
import copy
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/tests/pyg_ugrapher")
import torch
import torch_geometric.nn as pygnn

import pyg_ugrapher.nn as ugnn
from test_compile import layer_inputs

dev = torch.device("cuda")
x, edge_index, weight, _ = layer_inputs(200, 2000)
loops = (edge_index[0] == edge_index[1]).nonzero().flatten()
nodes = edge_index[0, loops]
print("self loops per node:", torch.bincount(nodes).max().item(), "at", torch.bincount(nodes).argmax().item())
first = torch.ones(edge_index.size(1), dtype=torch.bool)
seen = set()
for i, n in zip(loops.tolist(), nodes.tolist()):
    if n in seen:
        first[i] = False
    seen.add(n)
for label, keep in (("as is", torch.ones_like(first)), ("one loop per node", first)):
    ei, w = edge_index[:, keep].to(dev), weight[keep].to(dev)
    torch.manual_seed(0)
    theirs = pygnn.GCNConv(6, 4, aggr="max").to(dev)
    ours = ugnn.GCNConv(6, 4, aggr="max").to(dev)
    ours.load_state_dict(theirs.state_dict())
    xd = x.to(dev)
    ref = theirs(xd, ei, w).detach().double()
    eager = ours(xd, ei, w).detach().double()
    compiled = torch.compile(copy.deepcopy(ours))(xd, ei, w).detach().double()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    print(label, f"eager vs PyG {rel(eager, ref):.1e}, compiled vs PyG {rel(compiled, ref):.1e}, "
                 f"compiled vs eager {rel(compiled, eager):.1e}")
    torch._dynamo.reset()
