"""Neighbour-group gather: one program reduces ``BLOCK_V`` chunks of at most ``group_size`` edges.

Rows are split into chunks (the chunk table is cached per graph and group size, and ordered by
chunk length), so a hub with 100k edges becomes hundreds of equal pieces of work instead of one
straggler program, while a power-law graph's many tiny rows are walked ``BLOCK_V`` at a time. The
chunks of a block advance side by side exactly like vertex-parallel rows and reduce in registers;
only rows split into several chunks combine their partial results with atomics (mean partials
are pre-divided by the degree).
"""

from __future__ import annotations

from pyg_ugrapher.structure import chunk_table, split_rows

from .codegen import KernelSpec, Snippets
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_chunks", "group_size"])
def {name}(chunk_row_ptr, chunk_start_ptr, rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr,
           num_chunks, group_size, F, C, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr,
           BLOCK_F: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
{chunk_rows}
    row_start = tl.load(rowptr_ptr + v, mask=live, other=0)
    row_end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
    end = tl.minimum(start + group_size, row_end)
    degree = row_end - row_start
{row_reduction}
{finalize}
    dest = out_ptr + {out_row}[:, None] * F + f[None, :]
    res = res.to(out_ptr.dtype.element_ty)
    tl.store(dest, res, mask=(live & (degree <= group_size))[:, None] & fmask[None, :])
    {atomic}
"""

#: Split rows are combined with atomics into an initialised output.
ATOMIC = True
#: Rows are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def atomic_rows(graph, info):
    """The output rows to initialise: only rows split into several chunks take atomics."""
    return split_rows(graph.csr, info.group_size)


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        operand_params=s.operand_params,
        chunk_rows=s.chunk_rows(4),
        row_reduction=s.row_reduction(4),
        finalize=s.finalize("degree[:, None]", 4),
        out_row=s.row("v"),
        atomic=s.atomic("dest", "res", "(live & (degree > group_size))[:, None] & fmask[None, :]"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    chunk_row, chunk_start = chunk_table(graph.csr, info.group_size)
    grid = (cdiv(chunk_row.numel(), info.block_v), cdiv(width, info.block_f))
    kernel[grid](
        chunk_row,
        chunk_start,
        graph.csr.rowptr,
        graph.csr.col,
        graph.csr.eid,
        *operand_args,
        out,
        chunk_row.numel(),
        info.group_size,
        width,
        layout.inner,
        BLOCK_V=info.block_v,
        BLOCK_E=info.block_e,
        BLOCK_F=info.block_f,
        num_warps=info.num_warps,
        num_stages=info.num_stages,
    )
