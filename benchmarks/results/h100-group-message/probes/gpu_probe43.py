"""Does scoring the whole design space pay? The shipped model's pick from the whole space
(triton_kernels.space, 480-734 gather schedules) against its pick from the schedules the training
data measured at that width (autotune.collect.sample_configs: 24 sampled + anchors), on graphs
outside the training corpus, four gather operators at F = 32 and 128; both picks timed by
autotune.collect.Timer, alternating for 3 rounds (median). argv[1]: tree."""
import sys, math, statistics
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import pyg_ugrapher as ug
from pyg_ugrapher import datasets
from pyg_ugrapher.ir import OpInfo
from autotune import selection, features
from autotune.collect import Timer, sample_configs

dev = torch.device("cuda")
gpu = features.gpu_info(dev)
booster = selection.load_booster()
graphs = {
    "uniform n3e5 e1.5e6 seed7": datasets.uniform_graph(300_000, 1_500_000, seed=7, device=dev),
    "power-law 0.9 n2e5 e1.2e6 seed7": datasets.power_law_graph(200_000, 1_200_000, exponent=0.9, seed=7, device=dev),
    "power-law 0.7 n5e4 e6e5 seed7": datasets.power_law_graph(50_000, 600_000, exponent=0.7, seed=7, device=dev),
    "uniform dense n2e4 e8e5 seed7": datasets.uniform_graph(20_000, 800_000, seed=7, device=dev),
}
timer = Timer(dev, reps=10)
ratios = []
print(f"{'graph':34s} {'op':12s} {'F':>4s} {'whole ms':>9s} {'sample ms':>9s} whole/sample  picks", flush=True)
for gname, ei in graphs.items():
    n = int(ei.max()) + 1
    g = ug.GraphTensor.from_edge_index(ei, n)
    stats = selection.bucket(g.stats(dev))
    for opname in ("copy_u_sum", "copy_u_mean", "copy_u_max", "u_mul_e_sum"):
        op = OpInfo.from_name(opname)
        for F in (32, 128):
            x = torch.randn(n, F, device=dev)
            w = torch.rand(g.num_edges, 1, device=dev)
            rhs = w if opname == "u_mul_e_sum" else None
            infos, X = features.case_features(stats, op, F, 1, torch.float32, gpu)
            scores = booster.inplace_predict(X, validate_features=False)
            whole = infos[int(np.argmin(scores))]
            sampled = set(sample_configs(op, F, 24))
            sample = min((i for i in infos if i in sampled), key=lambda i: scores[infos.index(i)])
            picks = {"whole": whole, "sample": sample}
            samples = {k: [] for k in picks}
            for _ in range(3):
                for label, info in picks.items():
                    run = lambda: ug.compute(g, op, x, rhs, parallel_info=info) if rhs is not None else \
                        ug.compute(g, op, x, parallel_info=info)
                    samples[label].append(timer(run)[0])
            t = {k: statistics.median(v) for k, v in samples.items()}
            r = t["whole"] / t["sample"]
            ratios.append(r)
            same = "same" if whole == sample else f"{whole.serialize()} | {sample.serialize()}"
            print(f"{gname:34s} {opname:12s} {F:4d} {t['whole']:9.4f} {t['sample']:9.4f} {r:6.3f}  {same}", flush=True)
print(f"geomean whole/sample over {len(ratios)} cases: {math.exp(statistics.mean(math.log(r) for r in ratios)):.3f}; "
      f"whole faster by >5% in {sum(r < 0.95 for r in ratios)}, slower by >5% in {sum(r > 1.05 for r in ratios)}", flush=True)
