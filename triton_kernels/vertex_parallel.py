"""Vertex-parallel gather: one program reduces ``BLOCK_V`` destination rows x ``BLOCK_F`` features.

Each row's incoming edges (contiguous in the CSR) are consumed in chunks of ``BLOCK_E`` into a
``[BLOCK_E, BLOCK_F]`` register accumulator that is reduced once at the end of the row: no atomics,
each output row written exactly once, the destination operand loaded once per row. Programs are
numbered rows-fastest, so all programs in flight share one feature tile (the locality knob).
"""
from __future__ import annotations

import triton

from .codegen import KernelSpec, Snippets

TEMPLATE = '''{header}

@triton.jit(do_not_specialize=["num_rows"])
def kernel(rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr, num_rows, F, C,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    for i in range(BLOCK_V):
        v = tl.program_id(0) * BLOCK_V + i
        live = v < num_rows
        start = tl.load(rowptr_ptr + v, mask=live, other=0)
        end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
{row_reduction}
{finalize}
        tl.store(out_ptr + {out_row} * F + f, res.to(out_ptr.dtype.element_ty), mask=fmask & live)
'''

#: Whether the output must be initialised before launch (for atomics).
ATOMIC = False


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, scalar_rows=("dst_v",))
    return TEMPLATE.format(header=s.header(), operand_params=s.operand_params,
                           row_reduction=s.row_reduction(8), finalize=s.finalize("(end - start)", 8),
                           out_row=s.row("v"))


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    csr = graph.csr
    grid = (triton.cdiv(csr.num_rows, info.block_v), triton.cdiv(width, info.block_f))
    kernel[grid](csr.rowptr, csr.col, csr.eid, *operand_args, out, csr.num_rows, width, layout.inner,
                 BLOCK_V=info.block_v, BLOCK_E=info.block_e, BLOCK_F=info.block_f,
                 num_warps=info.num_warps, num_stages=info.num_stages)
