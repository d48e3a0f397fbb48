# The one-pass template of 0a3b074 (an online softmax), kept for probe 89; the import is made absolute.
"""Vertex-parallel softmax aggregation: GAT's whole forward pass in one pass over the edges.

One program walks ``BLOCK_V`` destination rows side by side, ``BLOCK_E`` edges of each row per step,
as :mod:`~triton_kernels.vertex_parallel` does, and computes per head the online softmax of the
edge logits (the spec's ``logit_expr``) weighting the edge values (its ``expr``, e.g. ``x_u * k_e``).
Each of a row's ``BLOCK_E`` edge lanes keeps its own running maximum ``m``, denominator ``z`` of
``exp(logit - m)`` and weighted sum, rescaled by ``exp(m_old - m_new)`` when an edge raises the
maximum: one exponential per edge and head, as in the output gather of the three-operator form,
and no exchange between lanes inside the loop (a per-step maximum over the lanes made the kernel
slower than the three operators together: 0.60 against 0.50 ms on an H200, uniform 4e6 edges,
``benchmarks/results/h200-one-pass``). The lanes meet once, at the row's largest logit. The kernel
writes the output ``sum / (z + 1e-16)`` and the log-normaliser ``m + log(z + 1e-16)`` per head
(``m = 0`` for a row without edges), which the backward reads. The three-operator form takes a
gather-max, a gather-sum and the output gather for the same result.

The feature tile is viewed as ``[heads, features per head]`` (``split``: ``BLOCK_F // C`` whole
heads; ``inner``: the tile lies inside one head), so the logit and its exponential are computed
once per head, not once per feature. Tilings that straddle heads are not run here
(:func:`tiling`). Rows are never split, so a hub row is one program's work: the dispatcher runs
this template only where the schedule chosen for the operator is vertex-parallel.
"""
from __future__ import annotations

from typing import Optional

import triton

from pyg_ugrapher.ir import parse_expr
from pyg_ugrapher.layout import Layout
from pyg_ugrapher.parallel import ParallelInfo

from triton_kernels.codegen import KernelSpec, Snippets, render_expr

TEMPLATE = '''{header}

@triton.jit(do_not_specialize=["num_rows"])
def {name}(rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr, normaliser_ptr, num_rows, F, C, H,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    live = v < num_rows
    start = tl.load(rowptr_ptr + v, mask=live, other=0)
    end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
{axes}
{hoisted}
    shift = tl.full([BLOCK_V, BLOCK_E, {heads}, 1], float("-inf"), {acc})
    denominator = tl.zeros([BLOCK_V, BLOCK_E, {heads}, 1], {acc})
    acc = tl.zeros([BLOCK_V, BLOCK_E, {heads}, {width}], {acc})
{edge_loop}
{edge_loads}
{loads}
        logit = tl.broadcast_to({logit}, [BLOCK_V, BLOCK_E, {heads}, 1])
        rise = tl.where(emask[:, :, None, None], logit - shift, float("-inf"))
        # One exponential per lane and head: exp(-|rise|) rescales the lane's sums where the logit
        # raises its maximum (to exp(0) = 1 for the new edge), else weights the new edge.
        scaled = tl.exp(-tl.abs(rise))
        raised = rise > 0
        rescale = tl.where(raised, scaled, 1.0)
        weight = tl.where(raised, 1.0, scaled)
        denominator = denominator * rescale + weight
        acc = acc * rescale + {value} * weight
        shift = tl.where(raised, logit, shift)
    # The lanes' maxima, sums and weighted sums meet once, at the row's largest logit (0 for a row
    # without edges, whose lanes all keep -inf).
    largest = tl.max(shift, axis=1)
    base = tl.where(largest == float("-inf"), 0.0, largest)
    lane_scale = tl.exp(shift - base[:, None, :, :])
    total = tl.sum(denominator * lane_scale, axis=1) + 1e-16
    res = tl.sum(acc * lane_scale, axis=1) / total
    tl.store(out_ptr + {out_row}[:, None, None] * F + fs[None, :, :], res.to(out_ptr.dtype.element_ty),
             mask=live[:, None, None] & fsmask[None, :, :])
    # Every tile of a head computes its normaliser; the head's first tile writes it.
    first = (tl.program_id(1) * BLOCK_F) % C == 0
    normaliser = base + tl.log(total)
    tl.store(normaliser_ptr + {out_row}[:, None, None] * H + hs[None, :, None],
             normaliser.to(normaliser_ptr.dtype.element_ty),
             mask=live[:, None, None] & tl.where(first, hsmask, False)[None, :, None])
'''


def tiling(layout: Layout, info: ParallelInfo) -> Optional[bool]:
    """Whether ``info``'s feature tiles hold whole heads (``True``) or lie inside one head
    (``False``) of ``layout``'s messages; ``None`` where this template cannot run ``info`` (not
    vertex-parallel, or tiles straddling heads)."""
    if info.strategy != "vertex":
        return None
    inner, block_f = layout.inner, info.block_f
    if layout.message_width == inner or inner % block_f == 0:
        return False
    if block_f % inner == 0:
        return True
    return None


def _inner_axes() -> list:
    """The split axes of a tile inside one head: that head, and the tile's features."""
    return ["hs = (tl.program_id(1) * BLOCK_F) // C + tl.arange(0, 1)",
            "hsmask = hs * C < F",
            "fs = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F))[None, :]",
            "fsmask = fs < F"]


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    names = [f"x{k}" for k in range(len(spec.kinds))]
    c = spec.head_size
    axes = s.split_axes() if spec.head_split else _inner_axes()
    heads, width = (f"BLOCK_F // {c}", str(c)) if spec.head_split else ("1", "BLOCK_F")
    row_slots = [k for k, kind in enumerate(spec.kinds) if kind == "dst_v"]
    edge_slots = [k for k, kind in enumerate(spec.kinds) if kind != "dst_v"]
    edge_loads = []
    if s.needs("src_v"):
        edge_loads.append("u = tl.load(col_ptr + e, mask=emask, other=0)")
    if s.needs("edge"):
        edge_loads.append("ei = tl.load(eid_ptr + e, mask=emask, other=0)")

    def lines(items: list, indent: int) -> str:
        pad = " " * indent
        return "\n".join(pad + item for item in items) if items else f"{pad}pass"

    return TEMPLATE.format(
        header=s.header(), name=spec.name, operand_params=s.operand_params, acc=s.acc,
        axes=lines(axes, 4), hoisted=lines([f"x{k} = {s.split_load(k)}" for k in row_slots], 4),
        heads=heads, width=width, edge_loop=s.edge_loop(4), edge_loads=lines(edge_loads, 8),
        loads=lines([f"x{k} = {s.split_load(k)}" for k in edge_slots], 8),
        logit=render_expr(parse_expr(spec.logit_expr), names, s.acc),
        value=render_expr(parse_expr(spec.expr), names, s.acc), out_row=s.row("v"))


def launch(kernel, graph, operand_args, out, normaliser, layout, info) -> None:
    csr = graph.csr
    width = layout.message_width
    grid = (triton.cdiv(csr.num_rows, info.block_v), triton.cdiv(width, info.block_f))
    kernel[grid](csr.rowptr, csr.col, csr.eid, *operand_args, out, normaliser, csr.num_rows, width, layout.inner,
                 width // layout.inner, BLOCK_V=info.block_v, BLOCK_E=info.block_e, BLOCK_F=info.block_f,
                 num_warps=info.num_warps, num_stages=info.num_stages)
