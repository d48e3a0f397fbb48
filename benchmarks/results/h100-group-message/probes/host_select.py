"""Host time of an uncached model scoring of the whole design space (features + XGBoost predict),
on this machine's CPU, for XGBoost thread counts 1, 2 and 4: median of 50 calls. argv[1]: tree."""
import sys, time, statistics
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import pyg_ugrapher as ug
from pyg_ugrapher import datasets
from pyg_ugrapher.ir import OpInfo
from autotune import features
from autotune.selection import bucket, load_booster

g = ug.GraphTensor.from_edge_index(datasets.power_law_graph(20_000, 200_000), 20_000)
stats = bucket(g.stats())
gpu = features.GpuInfo("NVIDIA H100 80GB HBM3", 132, 90)
booster = load_booster()
for threads in (1, 2, 4):
    booster.set_param({"nthread": threads})
    for name, F in (("copy_u_sum", 128), ("copy_u_sum", 32), ("u_add_v", 128)):
        op = OpInfo.from_name(name)
        feat, pred = [], []
        for _ in range(50):
            t0 = time.perf_counter()
            infos, X = features.case_features(stats, op, F, 1, torch.float32, gpu)
            t1 = time.perf_counter()
            int(np.argmin(booster.inplace_predict(X, validate_features=False)))
            pred.append(time.perf_counter() - t1)
            feat.append(t1 - t0)
        f, p = 1e3 * statistics.median(feat), 1e3 * statistics.median(pred)
        print(f"nthread {threads} {name} F={F}: {len(infos)} schedules, features {f:.3f} ms, predict {p:.3f} ms, "
              f"total {f + p:.3f} ms", flush=True)
booster.set_param({"nthread": 1})
