"""Probe 28: the shipped cost model against the heuristic on graphs over 2e6 edges.

``autotune.selection`` lets the heuristic decide above ``HEURISTIC_MAX_MODEL_EDGES`` (2e6 edges),
a split chosen with an earlier (regression) model. This times both choices, forward and on the
reversed graph (what the backward runs), on the headline graphs (1.6e7 edges), the layer graphs
(4e6) and COLLAB (2.5e7, the largest shared graph). Writes ``$OUT/probe28.csv``; prints the
geometric mean of model / heuristic time per graph. Run from the repository root with the shared
datasets in ``./shared/datasets``: ``python benchmarks/results/h100-model-everywhere/probes/gpu_probe28.py``.
"""
import math
import os
import sys
import time

import pandas as pd
import torch
import triton

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
from autotune import selection  # noqa: E402
from autotune.features import gpu_info  # noqa: E402
from benchmarks.graphs import GraphSpec  # noqa: E402
from pyg_ugrapher.layout import infer_layout  # noqa: E402

OPS = ("copy_u_sum", "u_mul_e_sum", "copy_u_mean", "copy_u_max", "u_dot_v", "u_add_v")
GRAPHS = [(GraphSpec("uniform", num_nodes=10**6, num_edges=16 * 10**6), 128),
          (GraphSpec("power_law", num_nodes=10**6, num_edges=16 * 10**6), 128),
          (GraphSpec("uniform", num_nodes=200_000, num_edges=4 * 10**6), 64),
          (GraphSpec("power_law", num_nodes=200_000, num_edges=4 * 10**6), 64),
          (GraphSpec("real", "collab"), 64)]
cuda = torch.device("cuda")
booster = selection.load_booster()
gpu = gpu_info(cuda)
rows = []
t0 = time.time()
for spec, F in GRAPHS:
    loaded = spec.load(cuda)
    N = loaded.num_nodes
    for direction in ("forward", "reversed"):
        edge_index = loaded.edge_index if direction == "forward" else loaded.edge_index.flip(0)
        graph = ug.GraphTensor.from_edge_index(edge_index, N)
        stats = selection.bucket(graph.stats())
        gen = torch.Generator(device=cuda).manual_seed(28)
        x = torch.randn(N, F, device=cuda, generator=gen)
        y = torch.randn(N, F, device=cuda, generator=gen)
        w = torch.rand(graph.num_edges, device=cuda, generator=gen) + 0.5
        for name in OPS:
            op = ug.OpInfo.from_name(name)
            operands = {"u_mul_e_sum": [x, w], "u_dot_v": [x, y], "u_add_v": [x, y]}.get(name, [x])
            layout = infer_layout(op, [t.shape for t in operands])
            choices = {"model": selection.predict_best(booster, stats, op, layout.message_width, layout.reduce_size,
                                                       torch.float32, gpu),
                       "heuristic": selection.heuristic(stats, op, layout.message_width, True)}
            results = {}
            for who, info in choices.items():
                out = ug.compute(graph, op, *operands, parallel_info=info)
                ms = triton.testing.do_bench(lambda: ug.compute(graph, op, *operands, parallel_info=info),
                                             warmup=25, rep=100, return_mode="median")
                results[who] = out
                rows.append(dict(graph=spec.name, direction=direction, op=name, F=F, who=who,
                                 schedule=info.serialize(), time_ms=ms))
            a, b = results["model"].double(), results["heuristic"].double()
            rows[-1]["rel_diff"] = rows[-2]["rel_diff"] = float((a - b).norm() / b.norm().clamp_min(1e-30))
        print(f"{spec.name} {direction} done at {time.time() - t0:.0f} s", flush=True)
        del graph, x, y, w
    del loaded
    torch.cuda.empty_cache()

table = pd.DataFrame(rows)
table.to_csv(os.path.join(os.environ.get("OUT", "."), "probe28.csv"), index=False)
wide = table.pivot_table(index=["graph", "direction", "op"], columns="who", values="time_ms")
wide["model/heuristic"] = wide["model"] / wide["heuristic"]
pd.set_option("display.width", 200)
print(wide.round(3).to_string())
for g, part in wide.groupby(level=0):
    print(f"{g}: geomean model/heuristic {math.exp(part['model/heuristic'].map(math.log).mean()):.3f}")
print(f"all: geomean model/heuristic {math.exp(wide['model/heuristic'].map(math.log).mean()):.3f}")
print("max rel_diff", table.rel_diff.max())
