"""Neighbour-group message creation: one program walks ``BLOCK_V`` chunks of at most ``group_size``
edges of the CSR side by side.

Like the vertex-parallel form it reads edges in CSR order, so a destination operand is loaded once
per chunk and a destination's edges read their source rows together; unlike it, a hub's edges are
split over many programs instead of one (on a power-law graph one program per row serialises a
hub of 200k edges), and a power-law graph's many short rows fill ``BLOCK_V`` lanes instead of one
program each. Every message is stored at its user edge id.
"""

from __future__ import annotations

from pyg_ugrapher.structure import chunk_table

from .codegen import WRITE_ONCE, KernelSpec, Snippets, reduce_tiles
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_chunks", "group_size"])
def {name}(chunk_row_ptr, chunk_start_ptr, rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr,
           num_chunks, group_size, F, C, R, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr,
           BLOCK_F: tl.constexpr, BLOCK_R: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
{chunk_rows}
    end = tl.minimum(start + group_size, tl.load(rowptr_ptr + v + 1, mask=live, other=0))
{hoisted}
{edge_loop}
{edge_loads}
{message}
        tl.store(out_ptr + {out_row}[:, :, None] * F + f[None, None, :], msg.to(out_ptr.dtype.element_ty),
                 mask=emask[:, :, None] & fmask[None, None, :], {write_once})
"""

#: Every output element is written once.
ATOMIC = False
#: Rows are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        write_once=WRITE_ONCE,
        operand_params=s.operand_params,
        chunk_rows=s.chunk_rows(4),
        hoisted=s.hoisted(4),
        edge_loop=s.edge_loop(4),
        edge_loads=s.csr_edge_loads(8, need_eid=True),
        message=s.message(8),
        out_row=s.row("ei"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    block_f, block_r = reduce_tiles(info.block_f, width, layout.reduce_size)
    csr = graph.csr
    chunk_row, chunk_start = chunk_table(csr, info.group_size)
    grid = (cdiv(chunk_row.numel(), info.block_v), cdiv(width, block_f))
    kernel[grid](
        chunk_row,
        chunk_start,
        csr.rowptr,
        csr.col,
        csr.eid,
        *operand_args,
        out,
        chunk_row.numel(),
        info.group_size,
        width,
        layout.inner,
        layout.reduce_size,
        BLOCK_V=info.block_v,
        BLOCK_E=info.block_e,
        BLOCK_F=block_f,
        BLOCK_R=block_r,
        num_warps=info.num_warps,
        num_stages=info.num_stages,
    )
