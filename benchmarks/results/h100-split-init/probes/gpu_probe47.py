"""A/B: neighbour-group gathers initialise only their split rows (new) or the whole output (old).

On the 1.6e7-edge uniform and power-law graphs of the headline suite (1e6 vertices), F = 128:
the forward of copy_u_sum, u_mul_e_sum, copy_u_mean, copy_u_max under (a) a fixed group schedule
and (b) the default path (measured selection, caches cleared between variants), and
forward+backward on the default path; cuSPARSE for the sums. Three alternating rounds,
``do_bench`` medians (ms).

    python3 gpu_probe47.py <repo> [OUT]
"""
import os
import statistics
import sys

sys.path.insert(0, sys.argv[1])
import pandas as pd
import torch
from triton.testing import do_bench

import pyg_ugrapher as ug
from autotune import selection
from pyg_ugrapher import datasets
from triton_kernels import dispatch

out_dir = sys.argv[2] if len(sys.argv) > 2 else "."
dev = torch.device("cuda")
N, E, F = 1_000_000, 16_000_000, 128
GROUP = ug.ParallelInfo("group", group_size=512, block_v=16, block_e=2, block_f=64, num_warps=4)
new_allocate = dispatch._allocate


def old_allocate(op, graph, template, info, rows, width, out_dtype):
    device = graph.csr.device
    if not template.ATOMIC:
        return torch.empty((rows, width), dtype=out_dtype, device=device)
    dtype = dispatch._atomic_dtype(out_dtype)
    if op.gather_op not in dispatch._IDENTITY:
        return torch.zeros((rows, width), dtype=dtype, device=device)
    rowptr = graph.csr.rowptr
    has_edges = (rowptr[1:] - rowptr[:-1]) > 0
    init = torch.where(has_edges, dispatch._IDENTITY[op.gather_op], 0.0).to(dtype)
    return init[:, None].expand(rows, width).contiguous()


VARIANTS = {"new": new_allocate, "old": old_allocate}
rows = []
for kind in ("power_law", "uniform"):
    gen = datasets.uniform_graph if kind == "uniform" else datasets.power_law_graph
    ei = gen(N, E, seed=0, device=dev)
    g = ug.GraphTensor.from_edge_index(ei, N)
    torch.manual_seed(0)
    x = torch.randn(N, F, device=dev, requires_grad=True)
    w = torch.rand(E, device=dev, requires_grad=True)
    split = int((torch.bincount(ei[1], minlength=N) > 512).sum())
    print(f"{kind}: {split} rows over 512 edges", flush=True)
    adj = torch.sparse_coo_tensor(ei.flip(0), w.detach(), (N, N)).coalesce().to_sparse_csr()
    cus = do_bench(lambda: adj @ x.detach(), warmup=25, rep=300, return_mode="median")
    rows.append({"graph": kind, "op": "spmm", "variant": "cusparse", "mode": "fwd", "round": 0, "ms": cus})
    for name in ("copy_u_sum", "u_mul_e_sum", "copy_u_mean", "copy_u_max"):
        operands = (x, w) if name == "u_mul_e_sum" else (x,)
        for rnd in range(3):
            for variant, allocate in VARIANTS.items():
                dispatch._allocate = allocate
                selection.clear_cache()
                with torch.no_grad():
                    fixed = do_bench(lambda: ug.compute(g, name, *operands, parallel_info=GROUP),
                                     warmup=25, rep=300, return_mode="median")
                    default = do_bench(lambda: ug.compute(g, name, *operands), warmup=25, rep=300,
                                       return_mode="median")

                def fwd_bwd():
                    ug.compute(g, name, *operands).sum().backward()
                fb = do_bench(fwd_bwd, warmup=25, rep=300, return_mode="median", grad_to_none=[x, w])
                for mode, ms in (("fwd group fixed", fixed), ("fwd default", default), ("fwd+bwd default", fb)):
                    rows.append({"graph": kind, "op": name, "variant": variant, "mode": mode, "round": rnd,
                                 "ms": ms})
        dispatch._allocate = new_allocate
        table = pd.DataFrame([r for r in rows if r["graph"] == kind and r["op"] == name])
        print(table.pivot_table(index="mode", columns="variant", values="ms", aggfunc="median")
              .assign(cusparse=cus).round(3).to_string(), flush=True)
    del g, x, w, adj, ei
    torch.cuda.empty_cache()

df = pd.DataFrame(rows)
df.to_csv(os.path.join(out_dir, "probe47.csv"), index=False)
summary = df[df.variant != "cusparse"].pivot_table(index=["graph", "op", "mode"], columns="variant", values="ms",
                                                   aggfunc="median")
summary["old/new"] = summary["old"] / summary["new"]
print(summary.round(3).to_string())
