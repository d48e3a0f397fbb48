"""Vertex-parallel softmax aggregation: GAT's whole forward pass as one kernel (the "one pass").

One program walks ``BLOCK_V`` destination rows side by side, ``BLOCK_E`` edges of each row per step,
as :mod:`~triton_kernels.vertex_parallel` does, and computes per head the softmax of the edge logits
(the spec's ``logit_expr``) weighting the edge values (its ``expr``, e.g. ``x_u * k_e``), in two loops
over the row's edges: the first reads only what the logit reads and finds the row's largest logit
``m``; the second sums ``exp(logit - m)`` and the weighted values, one exponential per edge and
head, as the output gather of the three-operator form does. It writes the output
``sum / (z + 1e-16)`` and the log-normaliser ``m + log(z + 1e-16)`` per head (``m = 0`` for a row
without edges), which the backward reads. The three-operator form takes a gather-max, a gather-sum
and the output gather (and three torch operations for the log-normaliser) for the same result.

An online softmax in one loop, rescaling the sums whenever an edge raises the maximum, is no
faster under its best schedule: the rescaling doubles the work per element, while the first loop
here re-reads only the column index and the logit's operands.

The feature tile is viewed as ``[heads, features per head]`` (``split``: ``BLOCK_F // C`` whole
heads; ``inner``: the tile lies inside one head), so the logit and its exponential are computed
once per head, not once per feature. Tilings that straddle heads are not run here
(:func:`tiling`). Rows are never split, so a hub row is one program's work: the dispatcher runs
this template where the schedule chosen for the operator is vertex-parallel, and
:mod:`~triton_kernels.group_softmax` (the same passes over chunks of rows) where it is neighbour
groups.
"""

from __future__ import annotations

from typing import Optional

from pyg_ugrapher.ir import parse_expr
from pyg_ugrapher.layout import Layout
from pyg_ugrapher.parallel import ParallelInfo

from .codegen import KernelSpec, Snippets, render_expr
from .launch import cdiv

#: Both passes over a block's edges, for rows (here) or chunks of rows
#: (:mod:`~triton_kernels.group_softmax`) walked ``BLOCK_V`` side by side between ``start`` and
#: ``end``: per head the block's largest logit ``base`` (0 without edges), then the sum of
#: ``exp(logit - base)`` (``summed``) and of the values weighted by it (``weighted``); the output
#: and log-normaliser of the rows marked ``final`` (whole rows) are written.
PASSES = """{axes}
{hoisted}
    lane_max = tl.full([BLOCK_V, BLOCK_E, {heads}, 1], float("-inf"), {acc})
{edge_loop}
{logit_edge_loads}
{logit_loads}
        lane_max = tl.maximum(lane_max, tl.where(emask[:, :, None, None], {logit}, float("-inf")))
    # The largest logit (0 without edges): no exponent below exceeds 0.
    largest = tl.max(lane_max, axis=1)
    base = tl.where(largest == float("-inf"), 0.0, largest)
    denominator = tl.zeros([BLOCK_V, BLOCK_E, {heads}, 1], {acc})
    acc = tl.zeros([BLOCK_V, BLOCK_E, {heads}, {width}], {acc})
{edge_loop}
{edge_loads}
{loads}
        weight = tl.where(emask[:, :, None, None], tl.exp({logit} - base[:, None, :, :]), 0.0)
        denominator += weight
        acc += {value} * weight
    summed = tl.sum(denominator, axis=1)
    weighted = tl.sum(acc, axis=1)
    # Every tile of a head computes its sums; the head's first tile writes the per-head values.
    head_first = tl.where((tl.program_id(1) * BLOCK_F) % C == 0, hsmask, False)[None, :, None]
    total = summed + 1e-16
    tl.store(out_ptr + {out_row}[:, None, None] * F + fs[None, :, :], (weighted / total).to(out_ptr.dtype.element_ty),
             mask={final}[:, None, None] & fsmask[None, :, :])
    tl.store(normaliser_ptr + {out_row}[:, None, None] * H + hs[None, :, None],
             (base + tl.log(total)).to(normaliser_ptr.dtype.element_ty), mask={final}[:, None, None] & head_first)"""

TEMPLATE = """{header}

@triton.jit(do_not_specialize=["num_rows"])
def {name}(rowptr_ptr, col_ptr, eid_ptr, {operand_params}out_ptr, normaliser_ptr, num_rows, F, C, H,
           BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    live = v < num_rows
    start = tl.load(rowptr_ptr + v, mask=live, other=0)
    end = tl.load(rowptr_ptr + v + 1, mask=live, other=0)
{passes}
"""


#: Rows are walked edge by edge: a structure in the user's order is grouped by row first.
READS_USER_ORDER = False


def tiling(layout: Layout, info: ParallelInfo) -> Optional[bool]:
    """Whether ``info``'s feature tiles hold whole heads (``True``) or lie inside one head
    (``False``) of ``layout``'s messages; ``None`` where they straddle heads (no softmax pass runs
    them)."""
    inner, block_f = layout.inner, info.block_f
    if layout.message_width == inner or inner % block_f == 0:
        return False
    if block_f % inner == 0:
        return True
    return None


def _inner_axes() -> list:
    """The split axes of a tile inside one head: that head, and the tile's features."""
    return [
        "hs = (tl.program_id(1) * BLOCK_F) // C + tl.arange(0, 1)",
        "hsmask = hs * C < F",
        "fs = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F))[None, :]",
        "fsmask = fs < F",
    ]


def passes(spec: KernelSpec, s: Snippets, final: str) -> str:
    """:data:`PASSES` for ``spec``, writing the rows where the mask ``final`` holds; ``s`` walks
    the destination rows ``v`` on two edge axes."""
    names = [f"x{k}" for k in range(len(spec.kinds))]
    c = spec.head_size
    axes = s.split_axes() if spec.head_split else _inner_axes()
    heads, width = (f"BLOCK_F // {c}", str(c)) if spec.head_split else ("1", "BLOCK_F")
    row_slots = [k for k, kind in enumerate(spec.kinds) if kind == "dst_v"]
    edge_slots = [k for k, kind in enumerate(spec.kinds) if kind != "dst_v"]
    logit = parse_expr(spec.logit_expr)
    logit_slots = [k for k in edge_slots if k in logit.inputs()]

    def edge_loads(slots: list) -> list:
        kinds = {spec.kinds[k] for k in slots}
        return (["u = tl.load(col_ptr + e, mask=emask, other=0)"] if "src_v" in kinds else []) + (
            ["ei = tl.load(eid_ptr + e, mask=emask, other=0)"] if "edge" in kinds else []
        )

    def lines(items: list, indent: int) -> str:
        pad = " " * indent
        return "\n".join(pad + item for item in items) if items else f"{pad}pass"

    return PASSES.format(
        acc=s.acc,
        axes=lines(axes, 4),
        hoisted=lines([f"x{k} = {s.split_load(k)}" for k in row_slots], 4),
        heads=heads,
        width=width,
        edge_loop=s.edge_loop(4),
        edge_loads=lines(edge_loads(edge_slots), 8),
        loads=lines([f"x{k} = {s.split_load(k)}" for k in edge_slots], 8),
        logit_edge_loads=lines(edge_loads(logit_slots), 8),
        logit_loads=lines([f"x{k} = {s.split_load(k)}" for k in logit_slots], 8),
        logit=render_expr(logit, names, s.acc),
        value=render_expr(parse_expr(spec.expr), names, s.acc),
        final=final,
        out_row=s.row("v"),
    )


def source(spec: KernelSpec) -> str:
    s = Snippets(spec, row_kinds=("dst_v",), edge_rank=2)
    return TEMPLATE.format(
        header=s.header(), name=spec.name, operand_params=s.operand_params, passes=passes(spec, s, "live")
    )


def launch(kernel, graph, operand_args, out, normaliser, layout, info) -> None:
    csr = graph.csr
    width = layout.message_width
    grid = (cdiv(csr.num_rows, info.block_v), cdiv(width, info.block_f))
    kernel[grid](
        csr.rowptr,
        csr.col,
        csr.eid,
        *operand_args,
        out,
        normaliser,
        csr.num_rows,
        width,
        layout.inner,
        width // layout.inner,
        BLOCK_V=info.block_v,
        BLOCK_E=info.block_e,
        BLOCK_F=info.block_f,
        num_warps=info.num_warps,
        num_stages=info.num_stages,
    )
