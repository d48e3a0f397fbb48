"""Edge-parallel message creation: one program computes ``BLOCK_E`` edges x ``BLOCK_F`` outputs.

Edges are taken in the user's order, so the output is written contiguously and needs no
permutation; both endpoints are gathered per edge. A reducing edge op (``dot``) sums each output
over ``R`` message features in chunks of ``BLOCK_R``.
"""

from __future__ import annotations

from .codegen import WRITE_ONCE, KernelSpec, Snippets, reduce_tiles
from .launch import cdiv

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_edges"])
def {name}(src_ptr, dst_ptr, {operand_params}out_ptr, num_edges, F, C, R,
           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_R: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    ei = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = ei < num_edges
{endpoint_loads}
{message}
    tl.store(out_ptr + {out_row}[:, None] * F + f[None, :], msg.to(out_ptr.dtype.element_ty),
             mask=emask[:, None] & fmask[None, :], {write_once})
"""

#: Every output element is written once.
ATOMIC = False
#: Edges are read by user id, whatever the structure's order.
READS_USER_ORDER = True


def source(spec: KernelSpec) -> str:
    s = Snippets(spec)
    loads = []
    if s.needs("src_v"):
        loads.append("    u = tl.load(src_ptr + ei, mask=emask, other=0)")
    if s.needs("dst_v"):
        loads.append("    v = tl.load(dst_ptr + ei, mask=emask, other=0)")
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        write_once=WRITE_ONCE,
        operand_params=s.operand_params,
        endpoint_loads="\n".join(loads) or "    pass",
        message=s.message(4),
        out_row=s.row("ei"),
    )


def launch(kernel, graph, operand_args, out, width, layout, info) -> None:
    block_f, block_r = reduce_tiles(info.block_f, width, layout.reduce_size)
    src, dst = graph.src, graph.dst
    grid = (cdiv(src.numel(), info.block_e), cdiv(width, block_f))
    kernel[grid](
        src,
        dst,
        *operand_args,
        out,
        src.numel(),
        width,
        layout.inner,
        layout.reduce_size,
        BLOCK_E=info.block_e,
        BLOCK_F=block_f,
        BLOCK_R=block_r,
        num_warps=info.num_warps,
    )
