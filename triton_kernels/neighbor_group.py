"""Neighbour-group gather: one program reduces one chunk of at most ``group_size`` edges of a row.

Rows are split into chunks (the chunk table is cached per graph and group size), so a hub with
100k edges becomes hundreds of equal pieces of work instead of one straggler program. A chunk
reduces in registers exactly like a vertex-parallel row; only rows split into several chunks
combine their partial results with atomics (mean partials are pre-divided by the degree).
"""
from __future__ import annotations

import triton

from pyg_ugrapher.graph import chunk_table

from .codegen import KernelSpec, Snippets

TEMPLATE = '''{header}

@triton.jit(do_not_specialize=["group_size"])
def kernel(chunk_row_ptr, chunk_start_ptr, rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr,
           group_size, F, C, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    chunk = tl.program_id(0)
    v = tl.load(chunk_row_ptr + chunk)
    live = v >= 0
    start = tl.load(chunk_start_ptr + chunk)
    row_start = tl.load(rowptr_ptr + v)
    row_end = tl.load(rowptr_ptr + v + 1)
    end = tl.minimum(start + group_size, row_end)
    degree = row_end - row_start
{row_reduction}
{finalize}
    dest = out_ptr + {out_row} * F + f
    whole = degree <= group_size
    tl.store(dest, res.to(out_ptr.dtype.element_ty), mask=fmask & whole)
    {atomic_fn}(dest, res.to(out_ptr.dtype.element_ty), mask=fmask & (degree > group_size))
'''

#: Split rows are combined with atomics into an initialised output.
ATOMIC = True


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",))
    return TEMPLATE.format(header=s.header(), operand_params=s.operand_params,
                           row_reduction=s.row_reduction(4), finalize=s.finalize("degree", 4),
                           out_row=s.row("v"), atomic_fn=s.atomic_fn)


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    csr = graph.csr
    chunk_row, chunk_start = chunk_table(csr, info.group_size)
    grid = (chunk_row.numel(), triton.cdiv(width, info.block_f))
    kernel[grid](chunk_row, chunk_start, csr.rowptr, csr.col, csr.eid, *operand_args, out,
                 info.group_size, width, layout.inner, BLOCK_E=info.block_e, BLOCK_F=info.block_f,
                 num_warps=info.num_warps, num_stages=info.num_stages)
