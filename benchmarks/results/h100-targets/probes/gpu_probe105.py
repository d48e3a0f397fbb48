"""Probe 105: max / min with NaN messages on the GPU, and what propagating NaN costs.

1. torch's CUDA scatter_reduce (PyG's max and min aggregation) against ours under every strategy, on
   a graph with a 1e5-edge hub (split rows, runs across blocks), float32 / float64 / bfloat16:
   NaN elements must match exactly, the others to the dtype's tolerance.
2. GraphConv(aggr="max") ours against PyG's with NaN input features.
3. copy_u_max on the issue's 1.6e7-edge graphs at F = 128 under this morning's chosen schedules,
   the NaN-propagating kernels (new) against the previous kernel text (old: codegen's combine,
   reduction and atomic put back), alternating in one process, median of do_bench.

    python3 benchmarks/results/h100-targets/probes/gpu_probe105.py OUT.txt
"""
import sys

import torch
import triton
from torch_geometric.nn import GraphConv as PyGGraphConv
from torch_geometric.utils import scatter

import pyg_ugrapher as ug
from benchmarks import graphs
from pyg_ugrapher import ops
from pyg_ugrapher.nn import GraphConv
from triton_kernels import codegen, dispatch

lines = []


def say(text=""):
    print(text, flush=True)
    lines.append(text)


device = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
n = 20_000
edges = torch.randint(0, n, (2, 150_000), generator=gen)
edges[1, :100_000] = 0
edges = edges.to(device)
graph = ug.GraphTensor.from_edge_index(edges, n)
say("## 1. ours against torch's CUDA scatter_reduce, NaN in 20% of the features")
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    x = torch.randn(n, 64, generator=gen, dtype=torch.float64)
    x[torch.rand(x.shape, generator=gen) < 0.2] = float("nan")
    x = x.to(dtype=dtype, device=device)
    for gather in ("max", "min"):
        want = scatter(x[edges[0]], edges[1], 0, dim_size=n, reduce=gather)
        for info in (ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=32),
                     ug.ParallelInfo("edge", block_e=128, block_f=32),
                     ug.ParallelInfo("group", group_size=128, block_v=16, block_e=2, block_f=32), None):
            out = ug.compute(graph, f"copy_u_{gather}", x, parallel_info=info)
            same_nan = torch.equal(out.isnan(), want.isnan())
            err = ((out.nan_to_num() - want.nan_to_num()).abs().max() / want.nan_to_num().abs().max()).item()
            say(f"{str(dtype)[6:]:9s} {gather} {info.strategy if info else 'auto':6s} torch NaN elements "
                f"{int(want.isnan().sum())}, same NaN elements {same_nan}, rel err of the others {err:.2e}")

say("\n## 2. GraphConv(aggr='max'), NaN input features")
x = torch.randn(n, 64, generator=gen).to(device)
x[torch.rand(x.shape, generator=gen).to(device) < 0.05] = float("nan")
ours, theirs = GraphConv(64, 32, aggr="max").to(device), PyGGraphConv(64, 32, aggr="max").to(device)
theirs.load_state_dict(ours.state_dict())
a, b = ours(x, edges), theirs(x, edges)
say(f"NaN outputs: ours {int(a.isnan().sum())}, PyG {int(b.isnan().sum())}, same elements "
    f"{torch.equal(a.isnan(), b.isnan())}")

say("\n## 3. copy_u_max, F = 128, ms (median of do_bench), new = NaN-propagating, old = previous kernels")
OLD = dict(_COMBINE={**codegen._COMBINE, "max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})"},
           _REDUCE={**codegen._REDUCE, "max": "tl.max", "min": "tl.min"},
           _ATOMIC={**codegen._ATOMIC, "max": "tl.atomic_max", "min": "tl.atomic_min"})
NEW = {name: getattr(codegen, name) for name in OLD}
helpers = codegen.Snippets.gather_helpers


def use(tables, with_helpers):
    for name, value in tables.items():
        setattr(codegen, name, value)
    codegen.Snippets.gather_helpers = helpers if with_helpers else (lambda self: "")
    dispatch._kernel.cache_clear()
    dispatch._spec.cache_clear()
    ops._SHARED_DECISIONS.clear()  # named schedules' decisions hold their launch plan's kernel


schedules = {"uniform-16M": ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=32, num_warps=2),
             "power_law-16M": ug.ParallelInfo("group", group_size=512, block_v=64, block_e=2, block_f=32,
                                              num_warps=8)}
for spec in graphs.headline_graphs():
    loaded = spec.load(device)
    g = loaded.graph
    x = torch.randn(loaded.num_nodes, 128, device=device)
    info = schedules[spec.name]
    times = {"new": [], "old": []}
    outs = {}
    for round_ in range(3):
        for label, tables, with_helpers in (("new", NEW, True), ("old", OLD, False)):
            use(tables, with_helpers)
            fn = lambda: ug.compute(g, "copy_u_max", x, parallel_info=info)
            outs[label] = fn()
            plan = next(iter(ops._SHARED_DECISIONS.values()))[4]
            raw = getattr(plan.kernel.fn, "fn", plan.kernel.fn)  # compiled: a JITFunction's function
            assert ("_max_reduce" in raw.__globals__) == with_helpers, label
            times[label].append(triton.testing.do_bench(fn, warmup=50, rep=400, return_mode="median"))
    use(NEW, True)
    same = torch.equal(outs["new"], outs["old"])
    say(f"{spec.name} {info}: new {', '.join(f'{t:.3f}' for t in times['new'])}; old "
        f"{', '.join(f'{t:.3f}' for t in times['old'])}; outputs equal {same}")
    del loaded, g, x
    torch.cuda.empty_cache()

open(sys.argv[1], "w").write("\n".join(lines) + "\n")
