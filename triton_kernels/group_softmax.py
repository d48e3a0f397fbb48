"""Neighbour-group softmax aggregation: GAT's one pass on graphs with hubs.

The passes of :mod:`~triton_kernels.vertex_softmax` over the chunks of at most ``group_size``
edges of :func:`~pyg_ugrapher.structure.chunk_table` instead of whole rows, ``BLOCK_V`` chunks side by
side, as :mod:`~triton_kernels.neighbor_group` walks them: a hub of 1e5 edges is hundreds of
programs' work, not one. A row of one chunk is final in its program, which writes its output and
log-normaliser. Each chunk of a split row writes, per head, its largest logit, its sum of
exponentials and its weighted values against that logit to its slot
(:func:`~pyg_ugrapher.structure.split_chunk_slots`), and :mod:`~triton_kernels.softmax_combine`
rescales them to the row's largest logit and writes the row. Exponentials cannot be summed
across chunks by atomics: each chunk's are taken against its own largest logit.
"""

from __future__ import annotations

from pyg_ugrapher.structure import chunk_table, split_chunk_slots, split_rows

from . import buffers, softmax_combine
from .codegen import KernelSpec, Snippets
from .launch import cdiv
from .vertex_softmax import passes

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_chunks", "group_size"])
def {name}(chunk_row_ptr, chunk_start_ptr, chunk_slot_ptr, rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr,
           normaliser_ptr, part_ptr, part_max_ptr, part_sum_ptr, num_chunks, group_size, F, C, H,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
{chunk_rows}
    row_end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
    degree = row_end - tl.load(rowptr_ptr + v, mask=live, other=0)
    end = tl.minimum(start + group_size, row_end)
    whole = live & (degree <= group_size)
    split = live & (degree > group_size)
{passes}
    # A split row's chunks leave their sums, each against its own largest logit, to softmax_combine.
    slot = tl.load(chunk_slot_ptr + chunk, mask=split, other=0).to(tl.int64)[:, None, None]
    tl.store(part_ptr + slot * F + fs[None, :, :], weighted, mask=split[:, None, None] & fsmask[None, :, :])
    tl.store(part_max_ptr + slot * H + hs[None, :, None], base, mask=split[:, None, None] & head_first)
    tl.store(part_sum_ptr + slot * H + hs[None, :, None], summed, mask=split[:, None, None] & head_first)
"""

#: Chunks are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    return TEMPLATE.format(
        header=s.header(),
        name=spec.name,
        operand_params=s.operand_params,
        chunk_rows=s.chunk_rows(4),
        passes=passes(spec, s, "whole"),
    )


def launch(kernel, graph, operand_args, out, normaliser, layout, info) -> None:
    csr = graph.csr
    chunk_row, chunk_start = chunk_table(csr, info.group_size)
    slot, slot_start, num_slots = split_chunk_slots(csr, info.group_size)
    width, inner = layout.message_width, layout.inner
    heads = width // inner
    # Partials in the dtype atomics would accumulate in; the kernel writes every slot. One slot at
    # least: a kernel argument is never an empty tensor.
    acc = buffers.atomic_dtype(out.dtype)
    part = buffers.uninitialised((max(num_slots, 1), width), acc, out.device)
    part_max = buffers.uninitialised((max(num_slots, 1), heads), acc, out.device)
    part_sum = buffers.uninitialised((max(num_slots, 1), heads), acc, out.device)
    grid = (cdiv(chunk_row.numel(), info.block_v), cdiv(width, info.block_f))
    kernel[grid](
        chunk_row,
        chunk_start,
        slot,
        csr.rowptr,
        csr.col,
        csr.eid,
        *operand_args,
        out,
        normaliser,
        part,
        part_max,
        part_sum,
        chunk_row.numel(),
        info.group_size,
        width,
        inner,
        heads,
        BLOCK_V=info.block_v,
        BLOCK_E=info.block_e,
        BLOCK_F=info.block_f,
        num_warps=info.num_warps,
        num_stages=info.num_stages,
    )
    softmax_combine.combine(
        split_rows(csr, info.group_size),
        slot_start,
        csr.rowptr,
        part,
        part_max,
        part_sum,
        out,
        normaliser,
        info.group_size,
        inner,
    )
