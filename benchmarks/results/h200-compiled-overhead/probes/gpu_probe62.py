"""Probe 62: GCNConv(aggr="max") on the GPU: ours eager, ours compiled (Inductor), PyG, and ours on
the CPU (reference executor), on the test suite's graph (hub, self loops, duplicates); relative
errors between each pair, with and without the unit-weight cache.

    python3 gpu_probe62.py <repo>
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
x, edge_index, _, _ = layer_inputs(200, 2000)
for kwargs in ({"aggr": "max"}, {"aggr": "max", "normalize": False, "add_self_loops": False}, {"aggr": "mean"}, {}):
    torch.manual_seed(0)
    theirs = pygnn.GCNConv(6, 4, **kwargs)
    ours = ugnn.GCNConv(6, 4, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    results = {"pyg_cpu": theirs(x, edge_index), "ours_cpu": ours(x, edge_index)}
    g_theirs, g_ours = copy.deepcopy(theirs).to(dev), copy.deepcopy(ours).to(dev)
    xd, eid = x.to(dev), edge_index.to(dev)
    results["pyg_gpu"] = g_theirs(xd, eid).cpu()
    results["ours_gpu"] = g_ours(xd, eid).cpu()
    results["ours_gpu_compiled"] = torch.compile(copy.deepcopy(g_ours))(xd, eid).cpu()
    results["ours_gpu_aot_eager"] = torch.compile(copy.deepcopy(g_ours), backend="aot_eager")(xd, eid).cpu()
    ref = results["pyg_cpu"].detach().double()
    print(kwargs, {k: f"{((v.detach().double() - ref).norm() / ref.norm()).item():.1e}" for k, v in results.items()})
    torch._dynamo.reset()
