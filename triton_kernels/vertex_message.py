"""Vertex-parallel message creation: one program walks ``BLOCK_V`` destination rows of the CSR.

The destination operand is loaded once per row and reused for all its edges (GAT's
``a_src[u] + a_dst[v]``, ``u_dot_v``); each message is stored at its user edge id, so the output
keeps the user's edge order.
"""

from __future__ import annotations

from .codegen import WRITE_ONCE, KernelSpec, Snippets, reduce_tiles
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_rows"])
def {name}(rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr, num_rows, F, C, R,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_R: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    for i in range(BLOCK_V):
        v = tl.program_id(0) * BLOCK_V + i
        live = v < num_rows
        start = tl.load(rowptr_ptr + v, mask=live, other=0)
        end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
{hoisted}
{edge_loop}
{edge_loads}
{message}
            tl.store(out_ptr + {out_row}[:, None] * F + f[None, :], msg.to(out_ptr.dtype.element_ty),
                     mask=emask[:, None] & fmask[None, :], {write_once})
"""

#: Every output element is written once.
ATOMIC = False
#: Rows are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",))
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        write_once=WRITE_ONCE,
        operand_params=s.operand_params,
        hoisted=s.hoisted(8),
        edge_loop=s.edge_loop(8),
        edge_loads=s.csr_edge_loads(12, need_eid=True),
        message=s.message(12),
        out_row=s.row("ei"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    block_f, block_r = reduce_tiles(info.block_f, width, layout.reduce_size)
    csr = graph.csr
    grid = (cdiv(csr.num_rows, info.block_v), cdiv(width, block_f))
    kernel[grid](
        csr.rowptr,
        csr.col,
        csr.eid,
        *operand_args,
        out,
        csr.num_rows,
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
