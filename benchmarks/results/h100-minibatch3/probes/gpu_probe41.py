"""The re-trained cost model (autotune/models/h100.json) against the first one (old_model.json,
the model of 418d8a3) on graphs outside the training corpus: each model's pick for six forward
operators at F = 32 and 128, timed with do_bench (median, L2 flushed), or with TIMER=collect
by autotune.collect.Timer (L2 flushed, a GPU busy-wait before each call: how the data was timed),
both picks alternating for ROUNDS rounds (median of the rounds). argv[1]: tree."""
import os, sys, math, statistics
sys.path.insert(0, sys.argv[1])
import torch, triton.testing
import pyg_ugrapher as ug
from pyg_ugrapher import datasets
from pyg_ugrapher.ir import OpInfo
from autotune import selection, features
from autotune.cost_model import CostModel
from autotune.collect import Timer

dev = torch.device("cuda")
gpu = features.gpu_info(dev)
boosters = {}
for label, path in (("old", f"{sys.argv[1]}/benchmarks/results/h100-minibatch3/probes/old_model.json"),
                    ("new", f"{sys.argv[1]}/autotune/models/h100.json")):
    b = CostModel.load(path).booster_; b.set_param({"nthread": 1}); boosters[label] = b
graphs = {
    "uniform n3e5 e1.5e6 seed7": datasets.uniform_graph(300_000, 1_500_000, seed=7, device=dev),
    "power-law 0.9 n2e5 e1.2e6 seed7": datasets.power_law_graph(200_000, 1_200_000, exponent=0.9, seed=7, device=dev),
    "power-law 0.7 n5e4 e6e5 seed7": datasets.power_law_graph(50_000, 600_000, exponent=0.7, seed=7, device=dev),
    "uniform dense n2e4 e8e5 seed7": datasets.uniform_graph(20_000, 800_000, seed=7, device=dev),
}
ratios = []
TIMER, ROUNDS = os.environ.get("TIMER", "do_bench"), int(os.environ.get("ROUNDS", "1"))
timer = Timer(dev, reps=10)
print(f"timer {TIMER}, {ROUNDS} rounds", flush=True)
print(f"{'graph':40s} {'op':12s} {'F':>4s} {'old ms':>8s} {'new ms':>8s} new/old  picks", flush=True)
for gname, ei in graphs.items():
    n = int(ei.max()) + 1
    g = ug.GraphTensor.from_edge_index(ei, n)
    stats = selection.bucket(g.stats(dev))
    for opname in ("copy_u_sum", "copy_u_mean", "copy_u_max", "u_mul_e_sum", "u_dot_v", "u_add_v"):
        op = OpInfo.from_name(opname)
        for F in (32, 128):
            x = torch.randn(n, F, device=dev)
            w = torch.rand(g.num_edges, 1, device=dev)
            rhs = {"u_mul_e_sum": w, "u_dot_v": x, "u_add_v": x}.get(opname)
            reduce_size = F if opname == "u_dot_v" else 1
            picks = {label: selection.predict_best(b, stats, op, F, reduce_size, torch.float32, gpu)
                     for label, b in boosters.items()}
            samples = {label: [] for label in picks}
            for _ in range(ROUNDS):
                for label, info in picks.items():
                    run = lambda: ug.compute(g, op, x, rhs, parallel_info=info)
                    run()
                    samples[label].append(timer(run)[0] if TIMER == "collect" else
                                          triton.testing.do_bench(run, warmup=10, rep=40))
            times = {label: statistics.median(v) for label, v in samples.items()}
            r = times["new"] / times["old"]
            ratios.append(r)
            same = "same" if picks["new"] == picks["old"] else f"{picks['old']} -> {picks['new']}"
            print(f"{gname:40s} {opname:12s} {F:4d} {times['old']:8.4f} {times['new']:8.4f} {r:6.3f}  {same}", flush=True)
print(f"geomean new/old over {len(ratios)} cases: {math.exp(statistics.mean(math.log(r) for r in ratios)):.3f}; "
      f"new faster by >5% in {sum(r < 0.95 for r in ratios)}, slower by >5% in {sum(r > 1.05 for r in ratios)}", flush=True)
