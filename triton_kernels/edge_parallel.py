"""Edge-parallel gather: one program takes ``BLOCK_E`` consecutive CSR edges x ``BLOCK_F`` features.

Work is perfectly balanced whatever the degrees. The edges of a block are sorted by destination,
so a segmented scan reduces each run of equal destinations inside the block first; a row that lies
wholly inside the block is stored directly, and only the (at most two) runs that cross a block
boundary are combined with atomics into an initialised output.

On a structure in the user's order (``GROUPED`` false, :attr:`~pyg_ugrapher.structure.CSR.user_order`)
a row's edges may lie anywhere: the scan still reduces each run of equal consecutive destinations
(its segments start wherever the destination changes, whatever comes back later), and every run
is combined with atomics (a mean adds each run's sum over the row's degree). A block in which no
two consecutive edges share a destination skips the scan, which there would return its input.
"""

from __future__ import annotations

from .codegen import KernelSpec, Snippets
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit
def _combine_runs(start_a, val_a, start_b, val_b):
    # A segmented scan over run starts: associative in any order of the keys. Comparing the keys
    # themselves is associative only where a key never comes back after another (sorted rows): on
    # a GPU's tree-shaped scan, runs of one row on either side of another row's were merged.
    return start_a | start_b, tl.where(start_b != 0, val_b, {combine})


@triton.jit(do_not_specialize=["num_edges"])
def {name}(rows_ptr, col_ptr, eid_ptr, rowptr_ptr, {operand_params}out_ptr, num_edges, F, C,
           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, GROUPED: tl.constexpr):
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
    prev_v = tl.load(rows_ptr + e - 1, mask=emask & (e > block_start), other=-1)
    run_start = (v != prev_v) | (emask == 0)
    # Sorted rows (GROUPED) nearly always hold runs: the scan is compiled in without a check.
    has_runs = GROUPED
    if not GROUPED:
        has_runs = tl.min(run_start.to(tl.int32), axis=0) == 0
    if has_runs:
        starts = tl.broadcast_to(run_start.to(tl.int32)[:, None], [BLOCK_E, BLOCK_F])
        _, res = tl.associative_scan((starts, msg), 0, _combine_runs)
    else:
        # Every edge is a run of its own (the common case in the user's order, where consecutive
        # edges rarely share a destination): the scan would return the messages themselves.
        res = msg
    next_v = tl.load(rows_ptr + e + 1, mask=e + 1 < block_end, other=-1)
    run_end = emask & (next_v != v)
    row_start = tl.load(rowptr_ptr + v, mask=run_end, other=0)
    row_end = tl.load(rowptr_ptr + v + 1, mask=run_end, other=0)
    degree = row_end - row_start
{finalize}
    owned = (row_start >= block_start) & (row_end <= block_end) & GROUPED
    dest = out_ptr + {out_row}[:, None] * F + f[None, :]
    res = res.to(out_ptr.dtype.element_ty)
    tl.store(dest, res, mask=(run_end & owned)[:, None] & fmask[None, :])
    {atomic}
"""

#: Runs that cross a block boundary are combined with atomics into an initialised output.
ATOMIC = True
#: A structure in the user's order is read as it is: every run is then combined with atomics.
READS_USER_ORDER = True


def atomic_rows(graph, info) -> None:
    """``None``: every output row is initialised, since any row's run may cross a block boundary
    and rows without edges are never visited."""
    return None


def source(spec: KernelSpec) -> str:
    s = Snippets(spec)
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        operand_params=s.operand_params,
        combine=s.combine("val_a", "val_b"),
        edge_loads=s.csr_edge_loads(4),
        message=s.message(4),
        identity=s.identity,
        finalize=s.finalize("degree[:, None]", 4),
        out_row=s.row("v"),
        atomic=s.atomic("dest", "res", "(run_end & (owned == 0))[:, None] & fmask[None, :]"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    csr = graph.csr
    grid = (cdiv(csr.num_edges, info.block_e), cdiv(width, info.block_f))
    kernel[grid](
        csr.rows,
        csr.col,
        csr.eid,
        csr.rowptr,
        *operand_args,
        out,
        csr.num_edges,
        width,
        layout.inner,
        BLOCK_E=info.block_e,
        BLOCK_F=info.block_f,
        GROUPED=not csr.user_order,
        num_warps=info.num_warps,
    )
