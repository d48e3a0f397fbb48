"""Probe 44: runtime selection scored on the GPU (autotune.forest) against XGBoost on the host.

1. Host time (median of 100 calls) of the feature matrix, of the GPU forest's scores (upload,
   kernel, download) and of XGBoost's inplace_predict (selection.PREDICT_THREADS threads), per case;
   and of an uncached ``select()`` end to end both ways.
2. The same uncached ``select()`` while the caller's stream is busy (~12 ms of GPU sleep queued
   before each of 20 calls).
3. Agreement: scores and picks, forest vs XGBoost, over 4 graphs x 8 ops x 6 widths.
argv[1]: tree root. Writes probe44.csv next to argv[2] (an output folder).
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import numpy as np
import pandas as pd
import torch
import triton
import triton.testing

from autotune import features as ft
from autotune import selection
from pyg_ugrapher import datasets
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo
from triton_kernels.tree_ensemble import tree_ensemble_scores

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
device = torch.device("cuda")
booster = selection.load_booster()
gpu = ft.gpu_info(device)
print("gpu", gpu, "threads", selection.PREDICT_THREADS, flush=True)

graphs = {
    "pl-1e6": GraphTensor.from_edge_index(datasets.power_law_graph(60_000, 1_000_000, seed=1, device=device), 60_000),
    "uni-1e6": GraphTensor.from_edge_index(datasets.uniform_graph(60_000, 1_000_000, seed=2, device=device), 60_000),
    "pl-4e6": GraphTensor.from_edge_index(datasets.power_law_graph(200_000, 4_000_000, seed=3, device=device), 200_000),
    "uni-1.6e7": GraphTensor.from_edge_index(datasets.uniform_graph(1_000_000, 16_000_000, seed=4, device=device),
                                             1_000_000),
}
stats = {name: g.stats() for name, g in graphs.items()}
torch.cuda.synchronize()

t0 = time.perf_counter()
forest = selection._forest(booster)
t1 = time.perf_counter()
_, X = ft.case_features(selection.bucket(stats["pl-1e6"]), OpInfo.from_name("copy_u_sum"), 128, 1,
                        torch.float32, gpu)
forest.predict(X, device)
t2 = time.perf_counter()
print(f"forest conversion {1e3 * (t1 - t0):.1f} ms; first scoring (compiles the kernel) {1e3 * (t2 - t1):.1f} ms; "
      f"{forest.roots.size} trees, {forest.feature.size} nodes, depth {forest.depth}", flush=True)


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
for name, F, reduce_size in CASES:
    op = OpInfo.from_name(name)
    case = selection.bucket(stats["pl-4e6"])
    infos, X = ft.case_features(case, op, F, reduce_size, torch.float32, gpu)
    row = {"op": name, "F": F, "schedules": len(infos)}
    row["features_ms"] = median_ms(lambda: ft.case_features(case, op, F, reduce_size, torch.float32, gpu))
    row["forest_ms"] = median_ms(lambda: forest.predict(X, device))
    row["xgboost_ms"] = median_ms(lambda: booster.inplace_predict(X, validate_features=False))
    x = torch.from_numpy(X).to(device)
    arrays = forest._arrays(device)
    row["kernel_ms"] = triton.testing.do_bench(
        lambda: tree_ensemble_scores(x, *arrays, forest.depth, forest.base), warmup=20, rep=200)

    def uncached():
        selection._CACHE.clear()
        selection.select(graphs["pl-4e6"], op, F, reduce_size=reduce_size)

    row["select_gpu_ms"] = median_ms(uncached)
    selection._forest = lambda b: None
    row["select_xgboost_ms"] = median_ms(uncached)
    selection._forest = convert
    busy = []
    for _ in range(20):
        torch.cuda._sleep(20_000_000)
        start = time.perf_counter()
        uncached()
        busy.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    row["select_gpu_busy_stream_ms"] = 1e3 * statistics.median(busy)
    rows.append(row)
    print(row, flush=True)
pd.DataFrame(rows).to_csv(out / "probe44_time.csv", index=False)

agree = []
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
            agree.append({"graph": gname, "op": name, "F": F, "schedules": len(infos),
                          "max_abs_diff": float(np.abs(host - dev).max()), "score_scale": float(np.abs(host).max()),
                          "same_pick": bool(np.argmin(host) == np.argmin(dev)),
                          "pick_gap": float(np.sort(host)[1] - np.sort(host)[0])})
frame = pd.DataFrame(agree)
frame.to_csv(out / "probe44_agree.csv", index=False)
print(f"agreement: {frame.same_pick.sum()} / {len(frame)} same picks; max |diff| {frame.max_abs_diff.max():.3g} "
      f"(scores up to {frame.score_scale.max():.3g}); differing picks' gaps: "
      f"{frame.loc[~frame.same_pick, 'pick_gap'].tolist()}", flush=True)
print(pd.DataFrame(rows).to_string(index=False))
