"""Probe 45: cache hints on the stores of message creation (u_add_v, F = 128, 1.6e7 edges).

The message output (E x F, 8.2 GB at F = 128) is written once and never read by the kernel; its
lines pass through L2 and evict the source rows that the next edges gather. Variants of the three
message templates' output store: none (as shipped), ``eviction_policy="evict_first"``,
``cache_modifier=".cs"`` (streaming). Each variant runs in a process of its own (the patched
templates compile kernels of their own), twice, alternating; each times the default path's pick
(measured selection) and fixed schedules with ``do_bench``, and eager PyG's ``x[src] + x[dst]``.
argv[1]: tree root, argv[2]: output folder; ``PROBE_VARIANT`` set: run one variant (child).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

VARIANTS = {"none": "", "evict_first": ', eviction_policy="evict_first"', "streaming": ', cache_modifier=".cs"'}


def child(root: str, variant: str) -> dict:
    sys.path.insert(0, root)
    from triton_kernels import edge_message, group_message, vertex_message
    for module in (edge_message, group_message, vertex_message):
        old = "fmask[None, :])\n" if module is not group_message else "fmask[None, None, :])\n"
        assert module.TEMPLATE.endswith(old), module.__name__
        module.TEMPLATE = module.TEMPLATE[: -len(old)] + old[:-2] + VARIANTS[variant] + ")\n"
    import torch
    import triton.testing
    import pyg_ugrapher as ug
    from pyg_ugrapher import datasets
    from pyg_ugrapher.ops import decided_schedule

    out = {}
    for name, make in (("uniform", datasets.uniform_graph), ("power_law", datasets.power_law_graph)):
        edge_index = make(1_000_000, 16_000_000, seed=7, device="cuda")
        graph = ug.GraphTensor.from_edge_index(edge_index, 1_000_000)
        x = torch.randn(1_000_000, 128, device="cuda")
        op = ug.OpInfo.from_name("u_add_v")
        ug.compute(graph, op, x, x)
        pick = decided_schedule(graph, op, [x, x])
        schedules = {"pick": pick,
                     "vertex": ug.ParallelInfo("vertex", block_v=1, block_e=16, block_f=128, num_warps=4),
                     "group": ug.ParallelInfo("group", group_size=128, block_v=16, block_e=2, block_f=32, num_warps=4),
                     "edge": ug.ParallelInfo("edge", block_e=32, block_f=128, num_warps=4)}
        row = {"pick": pick.serialize()}
        for label, info in schedules.items():
            row[label + "_ms"] = triton.testing.do_bench(lambda: ug.compute(graph, op, x, x, parallel_info=info),
                                                         warmup=25, rep=200)
        src, dst = edge_index
        row["pyg_eager_ms"] = triton.testing.do_bench(lambda: x.index_select(0, src) + x.index_select(0, dst),
                                                      warmup=10, rep=100)
        out[name] = row
        del graph, x, edge_index
        torch.cuda.empty_cache()
    return out


def main(root: str, folder: str) -> None:
    results = []
    for round_ in range(2):
        for variant in VARIANTS:
            env = dict(os.environ, PROBE_VARIANT=variant)
            done = subprocess.run([sys.executable, __file__, root, folder], env=env, capture_output=True, text=True)
            if done.returncode:
                print(variant, "failed:", done.stderr[-3000:], flush=True)
                continue
            got = json.loads(done.stdout.strip().splitlines()[-1])
            for graph, row in got.items():
                results.append({"round": round_, "variant": variant, "graph": graph, **row})
                print(results[-1], flush=True)
    Path(folder).mkdir(parents=True, exist_ok=True)
    import pandas as pd
    frame = pd.DataFrame(results)
    frame.to_csv(Path(folder) / "probe45.csv", index=False)
    print(frame.groupby(["graph", "variant"])[[c for c in frame.columns if c.endswith("_ms")]].median().to_string())


if __name__ == "__main__":
    if os.environ.get("PROBE_VARIANT"):
        print(json.dumps(child(sys.argv[1], os.environ["PROBE_VARIANT"])))
    else:
        main(sys.argv[1], sys.argv[2])
