"""Vertex-parallel gather: one program reduces ``BLOCK_V`` destination rows x ``BLOCK_F`` features.

The rows of a block advance side by side, ``BLOCK_E`` edges of each row per step, so a program has
``BLOCK_V x BLOCK_E`` gathers in flight; the ``[BLOCK_V, BLOCK_E, BLOCK_F]`` register accumulator
is reduced over the edge axis once at the end. No atomics: each output row is written exactly
once, and the destination operand is loaded once per row. A block runs as many steps as its
longest row needs, so this suits graphs whose neighbouring rows have similar degrees; programs
are numbered rows-fastest, so all programs in flight share one feature tile (the locality knob).
"""

from __future__ import annotations

from .codegen import KernelSpec, Snippets
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_rows"])
def {name}(rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr, num_rows, F, C,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    live = v < num_rows
    start = tl.load(rowptr_ptr + v, mask=live, other=0)
    end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
{row_reduction}
{finalize}
    tl.store(out_ptr + {out_row}[:, None] * F + f[None, :], res.to(out_ptr.dtype.element_ty),
             mask=live[:, None] & fmask[None, :])
"""

#: Whether the output must be initialised before launch (for atomics).
ATOMIC = False
#: Rows are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        operand_params=s.operand_params,
        row_reduction=s.row_reduction(4),
        finalize=s.finalize("(end - start)[:, None]", 4),
        out_row=s.row("v"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    csr = graph.csr
    grid = (cdiv(csr.num_rows, info.block_v), cdiv(width, info.block_f))
    kernel[grid](
        csr.rowptr,
        csr.col,
        csr.eid,
        *operand_args,
        out,
        csr.num_rows,
        width,
        layout.inner,
        BLOCK_V=info.block_v,
        BLOCK_E=info.block_e,
        BLOCK_F=info.block_f,
        num_warps=info.num_warps,
        num_stages=info.num_stages,
    )
