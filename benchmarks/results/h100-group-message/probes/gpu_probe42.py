"""Neighbour-group message creation against the vertex and edge forms, on the H100.

For u_add_v (F = 128), u_dot_v (4 heads x 32, GAT-like scores) and GAT's per-head u_add_v
([N, 4] scalars), on uniform and power-law graphs of 4e6 and 1.6e7 edges: every strategy's best
of a seeded sample of its space (all edge and vertex schedules of the space, up to GROUP_SAMPLE
group ones), timed by autotune.collect.Timer (L2 flushed, busy-wait before each call, median of 5),
eager PyG's x_j + x_i (index_select twice and add) and our default path (parallel_info=None,
measured selection; the first run's "default" schedule column printed the model's unmeasured pick,
not the schedule that ran, and is left out since). Writes probe42.csv to argv[2]. argv[1]: tree.
GRAPHS (comma-separated names) limits the graphs."""
import os, sys, random, time
sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
import pyg_ugrapher as ug
from pyg_ugrapher import datasets
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.layout import infer_layout
from triton_kernels.space import space
from autotune.collect import Timer

dev = torch.device(os.environ.get("DEVICE", "cuda"))
GROUP_SAMPLE = int(os.environ.get("GROUP_SAMPLE", "40"))
OTHER_SAMPLE = int(os.environ.get("OTHER_SAMPLE", "1000"))  # vertex and edge schedules, each
S = float(os.environ.get("SCALE", "1"))  # a smoke test on the CPU interpreter: SCALE=1e-4
timer = Timer(dev, reps=5)
graphs = {
    "uniform-4M": lambda: datasets.uniform_graph(int(250_000 * S), int(4_000_000 * S), device=dev),
    "power_law-4M": lambda: datasets.power_law_graph(int(250_000 * S), int(4_000_000 * S), device=dev),
    "uniform-16M": lambda: datasets.uniform_graph(int(1_000_000 * S), int(16_000_000 * S), device=dev),
    "power_law-16M": lambda: datasets.power_law_graph(int(1_000_000 * S), int(16_000_000 * S), device=dev),
}
cases = [("u_add_v", (128,)), ("u_dot_v", (4, 32)), ("u_add_v", (4,))]
if os.environ.get("GRAPHS"):
    graphs = {k: v for k, v in graphs.items() if k in os.environ["GRAPHS"].split(",")}
rows = []
t0 = time.time()
for gname, make in graphs.items():
    ei = make()
    n = int(ei.max()) + 1
    g = ug.GraphTensor.from_edge_index(ei, n)
    g.structure(dev)
    for opname, shape in cases:
        op = OpInfo.from_name(opname)
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn((n,) + shape, device=dev, generator=gen)
        y = torch.randn((n,) + shape, device=dev, generator=gen)
        layout = infer_layout(op, [x.shape, y.shape])
        full = space(op, layout.message_width)
        rng = random.Random(42)
        groups = [i for i in full if i.strategy == "group"]
        picks = rng.sample(groups, min(GROUP_SAMPLE, len(groups)))
        for strategy in ("vertex", "edge"):
            others = [i for i in full if i.strategy == strategy]
            picks += rng.sample(others, min(OTHER_SAMPLE, len(others)))
        src, dst = g.src.long(), g.dst.long()
        pyg = lambda: x.index_select(0, src) + y.index_select(0, dst) if opname == "u_add_v" else \
            (x.index_select(0, src) * y.index_select(0, dst)).sum(-1, keepdim=True)
        expected = pyg()
        label = f"{opname}{list(shape)}"
        for info in picks:
            try:
                run = lambda: ug.compute(g, op, x, y, parallel_info=info)
                out = run()
                err = float(((out - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item())
                ms = timer(run)[0]
            except Exception as e:  # noqa
                rows.append(dict(graph=gname, case=label, method="sweep", strategy=info.strategy,
                                 schedule=info.serialize(), time_ms=float("nan"), note=repr(e)[:200]))
                continue
            rows.append(dict(graph=gname, case=label, method="sweep", strategy=info.strategy,
                             schedule=info.serialize(), time_ms=ms, rel_err=err))
        rows.append(dict(graph=gname, case=label, method="pyg_eager", time_ms=timer(pyg)[0]))
        default = lambda: ug.compute(g, op, x, y)
        default()
        rows.append(dict(graph=gname, case=label, method="default", time_ms=timer(default)[0]))
        d = pd.DataFrame([r for r in rows if r["graph"] == gname and r["case"] == label])
        best = d[d.method == "sweep"].groupby("strategy").time_ms.min()
        print(f"{gname:14s} {label:16s} best " + " ".join(f"{s} {v:.3f}" for s, v in best.items()) +
              f" | pyg {d[d.method == 'pyg_eager'].time_ms.iloc[0]:.3f} | default {d[d.method == 'default'].time_ms.iloc[0]:.3f}"
              f" | max err {d.rel_err.max():.2e} | {time.time() - t0:.0f}s", flush=True)
        pd.DataFrame(rows).to_csv(os.path.join(sys.argv[2], "probe42.csv"), index=False)
    del g, ei
    torch.cuda.empty_cache()
