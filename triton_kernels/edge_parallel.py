"""Edge-parallel gather: one program takes ``BLOCK_E`` consecutive CSR edges x ``BLOCK_F`` features.

Work is perfectly balanced whatever the degrees. The edges of a block are sorted by destination,
so a segmented scan reduces each run of equal destinations inside the block first; a row that lies
wholly inside the block is stored directly, and only the (at most two) runs that cross a block
boundary are combined with atomics into an initialised output.
"""
from __future__ import annotations

import triton

from .codegen import KernelSpec, Snippets

TEMPLATE = '''{header}

@triton.jit
def _combine_runs(key_a, val_a, key_b, val_b):
    # Associative for sorted keys: a run restarts wherever the key changes.
    return key_b, tl.where(key_a == key_b, {combine}, val_b)


@triton.jit(do_not_specialize=["num_edges"])
def {name}(rows_ptr, col_ptr, eid_ptr, rowptr_ptr, {operand_params}out_ptr, num_edges, F, C,
           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    block_start = tl.program_id(0) * BLOCK_E
    block_end = tl.minimum(block_start + BLOCK_E, num_edges)
    e = block_start + tl.arange(0, BLOCK_E)
    emask = e < block_end
    v = tl.load(rows_ptr + e, mask=emask, other=-1)
{edge_loads}
{message}
    msg = tl.where(emask[:, None], msg, {identity})
    _, res = tl.associative_scan((tl.broadcast_to(v[:, None], [BLOCK_E, BLOCK_F]), msg), 0, _combine_runs)
    next_v = tl.load(rows_ptr + e + 1, mask=e + 1 < block_end, other=-1)
    run_end = emask & (next_v != v)
    row_start = tl.load(rowptr_ptr + v, mask=run_end, other=0)
    row_end = tl.load(rowptr_ptr + v + 1, mask=run_end, other=0)
    degree = row_end - row_start
{finalize}
    owned = (row_start >= block_start) & (row_end <= block_end)
    dest = out_ptr + {out_row}[:, None] * F + f[None, :]
    res = res.to(out_ptr.dtype.element_ty)
    tl.store(dest, res, mask=(run_end & owned)[:, None] & fmask[None, :])
    {atomic_fn}(dest, res, mask=(run_end & (owned == 0))[:, None] & fmask[None, :])
'''

#: Runs that cross a block boundary are combined with atomics into an initialised output.
ATOMIC = True


def atomic_rows(graph, info) -> None:
    """``None``: every output row is initialised, since any row's run may cross a block boundary
    and rows without edges are never visited."""
    return None


def source(spec: KernelSpec) -> str:
    s = Snippets(spec)
    return TEMPLATE.format(header=s.header(), name=spec.name, operand_params=s.operand_params,
                           combine=s.combine("val_a", "val_b"), edge_loads=s.csr_edge_loads(4),
                           message=s.message(4), identity=s.identity,
                           finalize=s.finalize("degree[:, None]", 4), out_row=s.row("v"),
                           atomic_fn=s.atomic_fn)


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    csr = graph.csr
    grid = (triton.cdiv(csr.num_edges, info.block_e), triton.cdiv(width, info.block_f))
    kernel[grid](csr.rows, csr.col, csr.eid, csr.rowptr, *operand_args, out, csr.num_edges, width,
                 layout.inner, BLOCK_E=info.block_e, BLOCK_F=info.block_f, num_warps=info.num_warps)
