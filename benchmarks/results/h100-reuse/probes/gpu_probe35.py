"""Probe 35: the gradient of a bias added to every row, ``grad.sum(0)`` of a ``[rows, 128]``
float32 tensor, by each way torch offers (and one Triton kernel), on the layers suite's row count.

In the probe-30 breakdown of our eager layer steps, PyTorch's ``sum(dim=0)`` took ~0.2 ms per bias
(a reduction kernel with 128 outputs), where compiled PyG's fused reduction took ~0.04 ms. Run
from the repository root: ``python benchmarks/results/h100-reuse/probes/gpu_probe35.py``.
"""
import os

import torch
import triton
import triton.language as tl

out = open(os.path.join(os.environ.get("OUT", "."), "probe35.txt"), "w")


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


@triton.jit
def _partial_sums(g_ptr, part_ptr, rows, F, ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    pid = tl.program_id(0)
    f = tl.arange(0, BLOCK_F)
    acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for r0 in range(pid * ROWS, tl.minimum(pid * ROWS + ROWS, rows), 32):
        r = r0 + tl.arange(0, 32)
        tile = tl.load(g_ptr + r[:, None] * F + f[None, :], mask=(r[:, None] < rows) & (f[None, :] < F), other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(part_ptr + pid * F + f, acc, mask=f < F)


def triton_sum(g, rows_per_program=512):
    rows, F = g.shape
    programs = triton.cdiv(rows, rows_per_program)
    part = torch.empty(programs, F, device=g.device, dtype=torch.float32)
    _partial_sums[(programs,)](g, part, rows, F, ROWS=rows_per_program, BLOCK_F=triton.next_power_of_2(F))
    return part.sum(0)


say(torch.cuda.get_device_name(), torch.__version__)
for rows in (200_000, 1_000_000):
    g = torch.randn(rows, 128, device="cuda")
    ones = torch.ones(rows, device="cuda")
    ref = g.double().sum(0)
    ways = {
        "g.sum(0)": lambda: g.sum(0),
        "ones @ g (mv of g.t())": lambda: g.t().mv(ones),
        "ones[1, rows].mm(g)": lambda: ones.view(1, -1).mm(g).view(-1),
        "triton two-pass 512": lambda: triton_sum(g, 512),
        "triton two-pass 2048": lambda: triton_sum(g, 2048),
    }
    for name, fn in ways.items():
        err = ((fn().double() - ref).abs().max() / ref.abs().max()).item()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200)
        say(f"rows {rows:>8d}  {name:26s} {ms * 1e3:8.1f} us   rel err {err:.1e}")
