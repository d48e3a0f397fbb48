"""Probe 48: an uncached runtime selection with the shipped cost model (400 trees) on the GPU.

1. Host time (median of 100 calls) of the feature matrix, the GPU forest's scores, XGBoost's
   inplace_predict and an uncached ``select()``, per case, with the tree kernel walking at most
   256, 512 and 1024 trees side by side (``tree_ensemble.MAX_BLOCK_T``; 400 trees take two passes
   at 256), and the kernel alone under ``do_bench``.
2. Agreement of the GPU scores and picks with XGBoost's over 4 graphs x 8 ops x 6 widths.
argv[1]: tree root; argv[2]: output folder (probe48_time.csv, probe48_agree.csv).
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import numpy as np
import pandas as pd
import torch
import triton.testing

from autotune import features as ft
from autotune import selection
from pyg_ugrapher import datasets
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo
from triton_kernels import tree_ensemble

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
booster = selection.load_booster()
gpu = ft.gpu_info(device)
forest = selection._forest(booster)
print("gpu", gpu, "threads", selection.PREDICT_THREADS, f"{forest.roots.size} trees, {forest.feature.size} nodes, "
      f"depth {forest.depth}", flush=True)

graphs = {
    "pl-1e6": GraphTensor.from_edge_index(datasets.power_law_graph(60_000, 1_000_000, seed=1, device=device), 60_000),
    "uni-1e6": GraphTensor.from_edge_index(datasets.uniform_graph(60_000, 1_000_000, seed=2, device=device), 60_000),
    "pl-4e6": GraphTensor.from_edge_index(datasets.power_law_graph(200_000, 4_000_000, seed=3, device=device), 200_000),
    "uni-1.6e7": GraphTensor.from_edge_index(datasets.uniform_graph(1_000_000, 16_000_000, seed=4, device=device),
                                             1_000_000),
}
stats = {name: g.stats() for name, g in graphs.items()}
torch.cuda.synchronize()


def median_ms(fn, n=100):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


CASES = [("copy_u_sum", 128, 1), ("copy_u_sum", 32, 1), ("u_add_v", 128, 1), ("u_dot_v", 128, 32),
         ("copy_u_max", 256, 1), ("u_mul_e_sum", 64, 1)]
rows = []
convert = selection._forest
for block_t in (256, 512, 1024):
    tree_ensemble.MAX_BLOCK_T = block_t
    for name, F, reduce_size in CASES:
        op = OpInfo.from_name(name)
        case = selection.bucket(stats["pl-4e6"])
        infos, X = ft.case_features(case, op, F, reduce_size, torch.float32, gpu)
        forest.predict(X, device)  # compiles this block size's kernel
        row = {"max_block_t": block_t, "op": name, "F": F, "schedules": len(infos)}
        row["features_ms"] = median_ms(lambda: ft.case_features(case, op, F, reduce_size, torch.float32, gpu))
        row["forest_ms"] = median_ms(lambda: forest.predict(X, device))
        x = torch.from_numpy(X).to(device)
        arrays = forest._arrays(device)
        row["kernel_ms"] = triton.testing.do_bench(
            lambda: tree_ensemble.tree_ensemble_scores(x, *arrays, forest.depth, forest.base), warmup=20, rep=200)

        def uncached():
            selection._CACHE.clear()
            selection.select(graphs["pl-4e6"], op, F, reduce_size=reduce_size)

        row["select_gpu_ms"] = median_ms(uncached)
        if block_t == 256:
            row["xgboost_ms"] = median_ms(lambda: booster.inplace_predict(X, validate_features=False))
            selection._forest = lambda b: None
            row["select_xgboost_ms"] = median_ms(uncached)
            selection._forest = convert
        rows.append(row)
        print(row, flush=True)
    pd.DataFrame(rows).to_csv(out / "probe48_time.csv", index=False)
tree_ensemble.MAX_BLOCK_T = 256

agree = []
for block_t in (256, 512):
    tree_ensemble.MAX_BLOCK_T = block_t
    for gname, st in stats.items():
        case = selection.bucket(st)
        for name in ("copy_u_sum", "copy_u_mean", "copy_u_max", "u_mul_e_sum", "u_add_v", "u_dot_v", "copy_e_sum",
                     "u_mul_e_max"):
            op = OpInfo.from_name(name)
            for F in (16, 32, 64, 128, 256, 512):
                reduce_size = 32 if name == "u_dot_v" and F >= 32 else 1
                infos, X = ft.case_features(case, op, F, reduce_size, torch.float32, gpu)
                host = booster.inplace_predict(X, validate_features=False)
                dev = forest.predict(X, device)
                agree.append({"max_block_t": block_t, "graph": gname, "op": name, "F": F, "schedules": len(infos),
                              "max_abs_diff": float(np.abs(host - dev).max()),
                              "score_scale": float(np.abs(host).max()),
                              "same_pick": bool(np.argmin(host) == np.argmin(dev)),
                              "pick_gap": float(np.sort(host)[1] - np.sort(host)[0])})
tree_ensemble.MAX_BLOCK_T = 256
frame = pd.DataFrame(agree)
frame.to_csv(out / "probe48_agree.csv", index=False)
for block_t, part in frame.groupby("max_block_t"):
    print(f"MAX_BLOCK_T {block_t}: {part.same_pick.sum()} / {len(part)} same picks; max |diff| "
          f"{part.max_abs_diff.max():.3g} (scores up to {part.score_scale.max():.3g}); differing picks' gaps: "
          f"{part.loc[~part.same_pick, 'pick_gap'].tolist()}", flush=True)
time_frame = pd.DataFrame(rows)
print(time_frame.to_string(index=False))
print(time_frame.groupby("max_block_t")[["features_ms", "forest_ms", "kernel_ms", "select_gpu_ms"]].median())
