"""Generate Triton source for one (template, edge function, gather op, layout) from the IR.

A template (one module per parallel strategy) owns the loop structure, the masks, the tiling and
the reduction. It leaves holes that this module fills from the :class:`~pyg_ugrapher.ir.OpInfo`:

* ``{operand_params}``: the pointer and row stride of each operand;
* ``{hoisted}``: loads of operands whose row is the same for the whole edge loop (the destination
  row in CSR-ordered templates), done once per row;
* ``{message}``: loads of per-edge operands and the edge function, leaving ``msg``, a
  ``[BLOCK_E, BLOCK_F]`` tile in the accumulation dtype (for a reducing op, the sum over the
  last dimension, accumulated in a loop over ``R`` in chunks of ``BLOCK_R``);
* the gather op's identity, combine and reduce functions;
* for a gather that also writes values per edge (``KernelSpec.edge_expr``), an ``edge_out_ptr``
  parameter after the operands and the store of the second expression inside the edge loop
  (:meth:`Snippets.edge_output`, :func:`edge_mode`): backward passes read the same upstream
  gradient for a vertex gradient and an edge gradient, and one pass over the edges serves both.

Templates name the row index of each operand kind (``u`` source, ``v`` destination, ``ei`` user
edge id) and say which of them are scalars. Graph sizes (rows, edges, group size) are marked
``do_not_specialize``: one compiled kernel then serves every graph, and kernels compiled on a
tiny graph are the ones a large graph runs. The generated module is compiled once from its text in
memory (:func:`load_kernel`) and also written to the cache folder as a ``.py`` file a user can read.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import re
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
import triton
from torch import Tensor

from pyg_ugrapher import paths
from pyg_ugrapher.ir import Expr, parse_expr
from pyg_ugrapher.structure import CSR

#: Row index variable of each operand kind inside every template. ``edge_csr`` is an edge operand
#: the dispatcher has already permuted into CSR order, read at the CSR position ``e``.
ROW_VARS = {"src_v": "u", "dst_v": "v", "edge": "ei", "edge_csr": "e"}
#: Cache policy of the message-creation templates' output stores: ``E x F`` values written once
#: and never read by the kernel, which otherwise push out of L2 the source rows that the next edges
#: gather.
WRITE_ONCE = 'eviction_policy="evict_first"'

#: Max and min propagate NaN, as torch does (``scatter_reduce``, so PyG's max aggregation, and
#: ``torch.maximum``): Triton's default ``maximum``, and with it ``tl.max`` and ``relu``, returns the
#: other operand of a NaN, so a row whose only message was NaN came out as -inf.
_NAN = "propagate_nan=tl.PropagateNan.ALL"
_IDENTITY = {"sum": "0.0", "mean": "0.0", "max": "float('-inf')", "min": "float('inf')"}
#: Combines are written out, not called: Triton's interpreter runs a scan's combine once per
#: element, and there a call of a ``triton.jit`` helper costs several times the ``maximum`` itself.
_COMBINE = {
    "sum": "{a} + {b}",
    "mean": "{a} + {b}",
    "max": f"tl.maximum({{a}}, {{b}}, {_NAN})",
    "min": f"tl.minimum({{a}}, {{b}}, {_NAN})",
}
_REDUCE = {"sum": "tl.sum", "mean": "tl.sum", "max": "_max_reduce", "min": "_min_reduce"}
#: Memory order of every atomic the kernels issue. Atomics only accumulate into rows that no
#: program reads before the kernel ends, so they need no ordering among themselves; Triton's
#: default ("acq_rel") fences every atomic, which makes a gather that adds through atomics (edge
#: schedules, rows split into groups, the small-graph rule) markedly slower.
ATOMIC_SEM = "relaxed"
#: An atomic add of ``value`` into ``ptr`` under ``mask``: a sum or mean gather's, and an edge
#: output's split over feature tiles.
_ATOMIC_ADD = f'tl.atomic_add({{ptr}}, {{value}}, mask={{mask}}, sem="{ATOMIC_SEM}")'
_ATOMIC = {
    "sum": _ATOMIC_ADD,
    "mean": _ATOMIC_ADD,
    "max": "_max_atomic({ptr}, {value}, {mask})",
    "min": "_min_atomic({ptr}, {value}, {mask})",
}
#: The integer type and bit pattern (32-bit, then 64-bit) through which a max / min gather's atomic
#: writes a NaN lane, with an integer atomic max. Triton's float atomics compare bit patterns,
#: signed for values of sign 0 and unsigned for the others, and skip NaN. The largest signed
#: pattern (a NaN) wins a signed max against every number and keeps winning both halves of every
#: later float atomic max; the largest unsigned pattern (a NaN too, -1 when signed) does the same
#: for a float atomic min.
_NAN_BITS = {
    "max": ("tl.int32", "0x7FFFFFFF", "tl.int64", "0x7FFFFFFFFFFFFFFF"),
    "min": ("tl.uint32", "0xFFFFFFFF", "tl.uint64", "0xFFFFFFFFFFFFFFFF"),
}
#: The NaN-propagating reduction of a max / min gather in a compiled kernel: one reduction whose
#: combine propagates NaN (Triton inlines the combine, so it costs what ``tl.max`` does).
_NAN_REDUCE_COMPILED = """

@triton.jit
def _{op}_combine(a, b):
    return tl.{op}imum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _{op}_reduce(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _{op}_combine)
"""
#: The same reduction in Triton's interpreter, which runs a ``tl.reduce`` with a combine of ours as
#: one Python call per element but a built-in reduction as one NumPy call: ``tl.{op}`` (which skips
#: NaN) beside a reduced NaN flag. NaN lanes enter ``tl.{op}`` as the identity, so no slice is all
#: NaN (NumPy warns of those). Both forms give NaN wherever a lane is NaN, else the same extremum.
_NAN_REDUCE_INTERPRETED = """

@triton.jit
def _{op}_reduce(x, axis: tl.constexpr):
    isnan = x != x
    nan = tl.max(isnan.to(tl.int32), axis)
    return tl.where(nan != 0, float("nan"), tl.{op}(tl.where(isnan, {identity}, x), axis))
"""
#: The atomic of a max / min gather that writes a NaN lane through :data:`_NAN_BITS`.
_NAN_ATOMIC = """

@triton.jit
def _{op}_atomic(ptr, value, mask):
    nan = value != value
    tl.atomic_{op}(ptr, value, mask=mask & (nan == 0), sem="{sem}")
    if ptr.dtype.element_ty == tl.float64:
        tl.atomic_max(ptr.to(tl.pointer_type({int64}), bitcast=True), tl.full(value.shape, {bits64}, {int64}),
                      mask=mask & nan, sem="{sem}")
    else:
        tl.atomic_max(ptr.to(tl.pointer_type({int32}), bitcast=True), tl.full(value.shape, {bits32}, {int32}),
                      mask=mask & nan, sem="{sem}")
"""

_UNARY = {
    "neg": "(-{0})",
    "exp": "tl.exp({0})",
    "log": "tl.log({0})",
    "relu": f"tl.maximum({{0}}, 0.0, {_NAN})",
    "sigmoid": "tl.sigmoid({0})",
    "abs": "tl.abs({0})",
    "sqrt": "tl.sqrt({0})",
    "square": "({0} * {0})",
    "reciprocal": "(1.0 / {0})",
    # No tanh in triton.language: 1 - 2 / (exp(2x) + 1) saturates correctly at both ends.
    "tanh": "(1.0 - 2.0 / (tl.exp(2.0 * {0}) + 1.0))",
    "erf": "tl.erf({0})",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "silu": "({0} * tl.sigmoid({0}))",
    "gelu": "(0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476)))",
    # 1 + tanh(y) written as 2 - 2 / (exp(2y) + 1), with y = sqrt(2 / pi) * (x + 0.044715 x^3).
    "gelu_tanh": "(0.5 * {0} * (2.0 - 2.0 / (tl.exp(1.5957691216057308 * ({0} + 0.044715 * {0} * {0} * {0})) + 1.0)))",
    # torch's softplus: the identity above its threshold 20, where exp would lose all digits.
    "softplus": "tl.where({0} > 20.0, {0}, tl.log(1.0 + tl.exp({0})))",
}
_BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "maximum": f"tl.maximum({{0}}, {{1}}, {_NAN})",
    "minimum": f"tl.minimum({{0}}, {{1}}, {_NAN})",
    "eq": "tl.where({0} == {1}, 1.0, 0.0)",
    "gt": "tl.where({0} > {1}, 1.0, 0.0)",
    "ge": "tl.where({0} >= {1}, 1.0, 0.0)",
    "leaky_relu": "tl.where({0} >= 0.0, {0}, {0} * {1})",
    "elu": "tl.where({0} > 0.0, {0}, {1} * (tl.exp({0}) - 1.0))",
    "clamp_min": f"tl.maximum({{0}}, {{1}}, {_NAN})",
    "clamp_max": f"tl.minimum({{0}}, {{1}}, {_NAN})",
}
_COMPARISONS = ("eq", "gt", "ge")
#: A comparison as a condition of ``where``: the boolean itself, not its 1.0 / 0.0.
_CONDITIONS = {"eq": "({0} == {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})"}


@dataclass(frozen=True)
class KernelSpec:
    """Everything that makes two generated kernels differ (besides dtypes, which Triton
    specialises on by itself)."""

    template: str
    expr: str  #: :meth:`Expr.serialize` of the edge function
    kinds: Tuple[str, ...]  #: operand kind per slot
    patterns: Tuple[str, ...]  #: layout pattern per slot
    gather_op: Optional[str]
    reduce: bool  #: the message is summed over ``R`` features per output feature
    acc64: bool  #: accumulate in float64 (float64 inputs)
    wide: bool  #: int64 offsets (some row x stride product exceeds int32)
    #: ``C`` of per-head edge operands when the feature tile lies inside one head or spans whole
    #: heads (see :func:`head_tiling`): they are then loaded once per head, not once per feature.
    head_size: int = 0
    head_split: bool = False  #: the tile spans ``BLOCK_F // C`` whole heads (see :meth:`Snippets.split_axes`)
    #: :meth:`Expr.serialize` of a second edge function whose values the gather kernel also
    #: writes per edge (over the same operand slots), or ``""``.
    edge_expr: str = ""
    edge_group: int = 1  #: features of ``edge_expr`` summed into one edge output (1: none)
    edge_mode: str = ""  #: how a feature tile maps onto edge outputs (see :func:`edge_mode`)
    #: :meth:`Expr.serialize` of the edge logits whose softmax per destination weights ``expr``
    #: (``vertex_softmax``), or ``""``.
    logit_expr: str = ""

    @property
    def name(self) -> str:
        """The kernel's function name, which profilers show: template, gather and the edge
        function over ``u`` (source), ``v`` (destination) and ``e`` (edge) operands, e.g.
        ``vertex_parallel_sum_mul_u_e``."""
        letters = {"src_v": "u", "dst_v": "v"}

        def letter(text: str) -> str:
            return re.sub(r"\$(\d+)", lambda m: letters.get(self.kinds[int(m.group(1))], "e"), text)

        edge = f" edge {letter(self.edge_expr)}" if self.edge_expr else ""
        logit = f" softmax {letter(self.logit_expr)}" if self.logit_expr else ""
        name = f"{self.template} {self.gather_op or 'message'} {letter(self.expr)}{edge}{logit}"
        return re.sub(r"\W+", "_", name).strip("_")[:96]


def render_expr(expr: Expr, names: Sequence[str], acc: str) -> str:
    """The edge function as a Triton expression over tiles named ``names``, computing in ``acc``."""
    if expr.fn == "input":
        return names[expr.index]
    if expr.fn == "const":
        # Triton types a Python float literal float32, as it does a comparison's 0/1 values (below):
        # in a float64 kernel GAT's leaky-relu derivative, 0.2 + 0.8 * gt(s, 0), was a float32 sum.
        return f"tl.full([], {expr.value!r}, {acc})" if acc == "tl.float64" else f"{expr.value!r}"
    if expr.fn == "where":
        condition, *arms = expr.args
        if condition.fn in _CONDITIONS:
            test = _CONDITIONS[condition.fn].format(*(render_expr(arg, names, acc) for arg in condition.args))
        else:
            test = f"({render_expr(condition, names, acc)} != 0.0)"
        return "tl.where({}, {}, {})".format(test, *(render_expr(arm, names, acc) for arm in arms))
    args = [render_expr(arg, names, acc) for arg in expr.args]
    if expr.fn in _UNARY:
        return _UNARY[expr.fn].format(*args)
    rendered = _BINARY[expr.fn].format(*args)
    return f"{rendered}.to({acc})" if expr.fn in _COMPARISONS and acc == "tl.float64" else rendered


def head_tiling(width: int, inner: int, block_f: int) -> Tuple[int, bool]:
    """``(head_size, head_split)`` of :class:`KernelSpec` for messages of ``width`` features in
    heads of ``inner``, tiled by ``block_f``: a tile inside one head reads one value per edge of a
    per-head operand, a tile of whole heads ``block_f // inner`` values; any other tiling reads it
    per feature (as many loads as a full operand, several times the cost of a per-edge scalar)."""
    if inner <= 1 or inner >= width:
        return 0, False
    if inner % block_f == 0:
        return inner, False
    if block_f % inner == 0:
        return inner, True
    return 0, False


def edge_mode(width: int, group: int, block_f: int) -> Optional[str]:
    """How a gather kernel with feature tiles of ``block_f`` writes an edge output that sums
    ``group`` of its ``width`` message features per value, or ``None`` when it cannot:

    * ``"elementwise"``: no sum, one output per message feature;
    * ``"whole"``: one sum over the whole message, which one tile holds;
    * ``"groups"``: the tile holds whole groups (a power of two), summed after a reshape;
    * ``"partial"``: the tile lies inside one group; its partial sum is added atomically.
    """
    if group == 1:
        return "elementwise"
    if width % group:
        return None
    if group == width and block_f >= width:
        return "whole"
    if group & (group - 1) == 0 and block_f % group == 0:
        return "groups"
    if group == width or group % block_f == 0:
        return "partial"
    return None


def _offset(pattern: str, f: str) -> str:
    return {"full": f, "head": f"({f} // C)", "inner": f"({f} % C)"}[pattern]


#: Feature offset and mask of each layout pattern in a head-split tile's two feature axes
#: (``[BLOCK_F // C, C]``, see :meth:`Snippets.split_axes`): a per-head operand is one value per head.
_SPLIT = {"full": ("fs", "fsmask"), "inner": ("(fs % C)", "fsmask"), "head": ("hs[:, None]", "hsmask[:, None]")}


class Snippets:
    """The holes of a template, generated for one :class:`KernelSpec`.

    A template's tiles have ``edge_rank`` edge axes (1: ``[BLOCK_E]``; 2: ``[BLOCK_V, BLOCK_E]``,
    ``BLOCK_V`` rows walked side by side) followed by the feature axes (``f``, or ``f`` and the
    reduction index for a reducing op). Per-edge row ids (``u``, ``ei`` and ``v`` in edge-ordered
    templates) span the edge axes and are masked by ``emask``; the ids of ``row_kinds`` (the
    destination in CSR-ordered templates) span only the row axes (a scalar when ``edge_rank`` is 1)
    and are masked by ``live``. Loads of per-row operands are hoisted out of the edge loop.
    """

    def __init__(self, spec: KernelSpec, row_kinds: Sequence[str] = (), edge_rank: int = 1) -> None:
        self.spec = spec
        self.acc = "tl.float64" if spec.acc64 else "tl.float32"
        self.row_kinds = set(row_kinds)
        self.edge_rank = edge_rank
        self.expr = parse_expr(spec.expr)

    # -- signature -----------------------------------------------------------------------
    @property
    def operand_params(self) -> str:
        params = "".join(f"in{k}_ptr, in{k}_stride, " for k in range(len(self.spec.kinds)))
        return params + ("edge_out_ptr, " if self.spec.edge_expr else "")

    def needs(self, kind: str) -> bool:
        """Whether some operand reads rows of this kind."""
        return kind in self.spec.kinds

    def row(self, var: str) -> str:
        return f"{var}.to(tl.int64)" if self.spec.wide else var

    # -- gather op -------------------------------------------------------------------------
    @property
    def identity(self) -> str:
        return _IDENTITY[self.spec.gather_op]

    def combine(self, a: str, b: str) -> str:
        return _COMBINE[self.spec.gather_op].format(a=a, b=b)

    @property
    def reduce_fn(self) -> str:
        return _REDUCE[self.spec.gather_op]

    def atomic(self, ptr: str, value: str, mask: str) -> str:
        """The atomic that combines ``value`` into ``ptr`` under ``mask`` by the gather op."""
        return _ATOMIC[self.spec.gather_op].format(ptr=ptr, value=value, mask=mask)

    # -- indexing ----------------------------------------------------------------------------
    @property
    def edge_tile(self) -> str:
        return "BLOCK_E" if self.edge_rank == 1 else "BLOCK_V, BLOCK_E"

    def edge_axes(self, var: str, feature_dims: int) -> str:
        """A per-edge tensor broadcast over ``feature_dims`` trailing axes."""
        return _place(var, range(self.edge_rank), self.edge_rank + feature_dims)

    def row_axes(self, var: str, feature_dims: int) -> str:
        """A per-row tensor (or scalar) broadcast over the edge axis and the feature axes."""
        return _place(var, range(self.edge_rank - 1), self.edge_rank + feature_dims)

    def feature_axes(self, var: str, feature_dims: int) -> str:
        return _place(var, range(self.edge_rank, self.edge_rank + feature_dims), self.edge_rank + feature_dims)

    # -- loads and the edge function ---------------------------------------------------------
    def _load(self, k: int, f: str, fmask: str, feature_dims: int) -> str:
        """Load operand ``k`` as a tile broadcastable to the full message tile."""
        kind, pattern = self.spec.kinds[k], self.spec.patterns[k]
        per_row = kind in self.row_kinds
        place = self.row_axes if per_row else self.edge_axes
        row = place(self.row(ROW_VARS[kind]), feature_dims)
        valid = place("live" if per_row else "emask", feature_dims)
        pointer = f"in{k}_ptr + {row} * in{k}_stride"
        if pattern == "head" and self.spec.head_size and not per_row and feature_dims == 1:
            return self._head_load(pointer, valid)
        if pattern != "scalar":
            pointer += f" + {self.feature_axes(_offset(pattern, f), feature_dims)}"
            # ``where`` rather than ``&``: a row's ``live`` may be a scalar, and Triton 3.9's
            # interpreter rejects the mask a scalar ``&`` a tensor gives.
            valid = f"tl.where({valid}, {self.feature_axes(fmask, feature_dims)}, False)"
        return f"tl.load({pointer}, mask={valid}, other=0.0).to({self.acc})"

    def _head_load(self, pointer: str, valid: str) -> str:
        """A per-head edge operand of a tile inside one head: one value per edge (tiles of whole
        heads load through :meth:`split_load`)."""
        c = self.spec.head_size
        return f"tl.load({pointer} + (tl.program_id(1) * BLOCK_F) // {c}, mask={valid}, other=0.0).to({self.acc})"

    def split_axes(self) -> List[str]:
        """The feature indices of a head-split tile (``KernelSpec.head_split``): heads ``hs`` and
        their features ``fs``, a ``[BLOCK_F // C, C]`` view of ``f``. Operands are loaded onto these
        two axes, so a per-head operand keeps one value per head, and so does every part of the edge
        function that reads only such operands (GAT's weight ``exp(leaky_relu(a_u + a_v) - l_v)``,
        computed once per head instead of once per feature); :meth:`merge_heads` flattens the
        result back to ``BLOCK_F`` features. Broadcasting the weight to every feature first would
        repeat its exponential ``C`` times per edge and head."""
        c = self.spec.head_size
        return [
            f"hs = tl.program_id(1) * (BLOCK_F // {c}) + tl.arange(0, BLOCK_F // {c})",
            f"hsmask = hs * {c} < F",
            f"fs = hs[:, None] * {c} + tl.arange(0, {c})[None, :]",
            "fsmask = fs < F",
        ]

    def split_load(self, k: int) -> str:
        """Load operand ``k`` as a tile broadcastable to ``[edge axes, BLOCK_F // C, C]``."""
        kind, pattern = self.spec.kinds[k], self.spec.patterns[k]
        place = self.row_axes if kind in self.row_kinds else self.edge_axes
        pointer = f"in{k}_ptr + {place(self.row(ROW_VARS[kind]), 2)} * in{k}_stride"
        valid = place("live" if kind in self.row_kinds else "emask", 2)
        if pattern != "scalar":
            offset, mask = _SPLIT[pattern]
            pointer += f" + {self.feature_axes(offset, 2)}"
            valid = f"tl.where({valid}, {self.feature_axes(mask, 2)}, False)"
        return f"tl.load({pointer}, mask={valid}, other=0.0).to({self.acc})"

    def merge_heads(self, value: str) -> str:
        """A head-split ``value`` as the ``[edge axes, BLOCK_F]`` tile the templates reduce."""
        c = self.spec.head_size
        return (
            f"tl.reshape(tl.broadcast_to({value}, [{self.edge_tile}, BLOCK_F // {c}, {c}]), "
            f"[{self.edge_tile}, BLOCK_F])"
        )

    def hoisted(self, indent: int) -> str:
        """Loads done once per row (elementwise ops only: a reducing op loads inside its loop)."""
        if self.spec.reduce:
            return _indent([], indent)
        slots = [k for k, kind in enumerate(self.spec.kinds) if kind in self.row_kinds]
        if self.spec.head_split:
            return _indent(self.split_axes() + [f"x{k} = {self.split_load(k)}" for k in slots] if slots else [], indent)
        return _indent([f"x{k} = {self._load(k, 'f', 'fmask', 1)}" for k in slots], indent)

    def message(self, indent: int) -> str:
        """Code that leaves the message tile (edge axes x ``BLOCK_F``) in ``msg``."""
        names = [f"x{k}" for k in range(len(self.spec.kinds))]
        tile = f"[{self.edge_tile}, BLOCK_F]"
        slots = [k for k, kind in enumerate(self.spec.kinds) if kind not in self.row_kinds]
        if self.spec.head_split:
            hoisted = any(kind in self.row_kinds for kind in self.spec.kinds)  # then hoisted() defined the axes
            lines = ([] if hoisted else self.split_axes()) + [f"x{k} = {self.split_load(k)}" for k in slots]
            lines.append(f"msg = {self.merge_heads(render_expr(self.expr, names, self.acc))}")
            return _indent(lines, indent)
        if not self.spec.reduce:
            lines = [f"x{k} = {self._load(k, 'f', 'fmask', 1)}" for k in slots]
            lines.append(f"msg = tl.broadcast_to({render_expr(self.expr, names, self.acc)}, {tile})")
            return _indent(lines, indent)
        lines = [
            f"msg = tl.zeros({tile}, {self.acc})",
            "for r0 in range(0, R, BLOCK_R):",
            "    r = r0 + tl.arange(0, BLOCK_R)",
            "    ff = f[:, None] * R + r[None, :]",
            "    ffmask = fmask[:, None] & (r < R)[None, :]",
        ]
        lines += [f"    x{k} = {self._load(k, 'ff', 'ffmask', 2)}" for k in range(len(self.spec.kinds))]
        # Padded lanes load zeros, which an expression can turn into NaN (0 / 0): mask them out.
        body = f"tl.where({self.feature_axes('ffmask', 2)}, {render_expr(self.expr, names, self.acc)}, 0.0)"
        lines.append(
            f"    msg += tl.sum(tl.broadcast_to({body}, [{self.edge_tile}, BLOCK_F, BLOCK_R]), "
            f"axis={self.edge_rank + 1})"
        )
        return _indent(lines, indent)

    # -- fragments shared by the CSR-ordered templates -----------------------------------------
    def csr_edge_loads(self, indent: int, need_eid: bool = False) -> str:
        """Source ids and user edge ids of the CSR positions ``e``, loaded only when read."""
        lines = []
        if self.needs("src_v"):
            lines.append("u = tl.load(col_ptr + e, mask=emask, other=0)")
        if need_eid or self.needs("edge") or self.spec.edge_expr:
            lines.append("ei = tl.load(eid_ptr + e, mask=emask, other=0)")
        return _indent(lines, indent)

    def edge_loop(self, indent: int) -> str:
        """The loop over the CSR positions ``e`` in ``[start, end)`` of the row(s), ``BLOCK_E`` per
        step, masked by ``emask``. With two edge axes the rows (or chunks) of a block advance
        together, for as many steps as the block's longest one needs."""
        if self.edge_rank == 1:
            lines = [
                "for e0 in range(start, end, BLOCK_E):",
                "    e = e0 + tl.arange(0, BLOCK_E)",
                "    emask = e < end",
            ]
        else:
            lines = [
                "for step in range(0, tl.max(end - start, axis=0), BLOCK_E):",
                "    e = (start + step)[:, None] + tl.arange(0, BLOCK_E)[None, :]",
                "    emask = e < end[:, None]",
            ]
        return _indent(lines, indent)

    def chunk_rows(self, indent: int) -> str:
        """The ``BLOCK_V`` neighbour-group chunks of this program: ``live`` mask, row ``v`` and
        first CSR position ``start`` of each (``chunk_row_ptr``, ``chunk_start_ptr``: the chunk
        table of :func:`~pyg_ugrapher.structure.chunk_table`)."""
        return _indent(
            [
                "chunk = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)",
                "live = chunk < num_chunks",
                "v = tl.load(chunk_row_ptr + chunk, mask=live, other=0)",
                "start = tl.load(chunk_start_ptr + chunk, mask=live, other=0)",
            ],
            indent,
        )

    def row_reduction(self, indent: int) -> str:
        """Reduce the CSR edges ``[start, end)`` of the row(s) ``v`` into ``res`` (the loop:
        :meth:`edge_loop`).

        The accumulator has the full tile shape and is reduced over the edge axis once, after the
        loop.
        """
        pad = " " * indent
        masked = f"tl.where({self.edge_axes('emask', 1)}, msg, {self.identity})"
        return "\n".join(
            [
                self.hoisted(indent),
                f"{pad}acc = tl.full([{self.edge_tile}, BLOCK_F], {self.identity}, {self.acc})",
                self.edge_loop(indent),
                self.csr_edge_loads(indent + 4),
                self.message(indent + 4),
                self.edge_output(indent + 4),
                f"{pad}    acc = {self.combine('acc', masked)}",
                f"{pad}res = {self.reduce_fn}(acc, axis={self.edge_rank - 1})",
            ]
        )

    def edge_output(self, indent: int) -> str:
        """Write ``edge_expr`` of the loaded tiles to ``edge_out_ptr`` at the user edge ids
        (nothing without an edge expression); see :func:`edge_mode`."""
        spec = self.spec
        if not spec.edge_expr:
            return ""
        names = [f"x{k}" for k in range(len(spec.kinds))]
        tile = f"[{self.edge_tile}, BLOCK_F]"
        rank = self.edge_rank + 1
        ei = self.row("ei")
        emask = self.edge_axes("emask", 1)
        fmask = self.feature_axes("fmask", 1)
        value = render_expr(parse_expr(spec.edge_expr), names, self.acc)
        value = self.merge_heads(value) if spec.head_split else f"tl.broadcast_to({value}, {tile})"
        lines = [f"emsg = tl.where({fmask}, {value}, 0.0)"]
        r = spec.edge_group
        if spec.edge_mode == "elementwise":
            lines.append(
                f"tl.store(edge_out_ptr + {self.edge_axes(ei, 1)} * F + {self.feature_axes('f', 1)}, "
                f"emsg.to(edge_out_ptr.dtype.element_ty), mask=tl.where({emask}, {fmask}, False))"
            )
        elif spec.edge_mode == "groups":
            g = f"(tl.program_id(1) * (BLOCK_F // {r}) + tl.arange(0, BLOCK_F // {r}))"
            lines += [
                f"part = tl.sum(tl.reshape(emsg, [{self.edge_tile}, BLOCK_F // {r}, {r}]), axis={rank})",
                f"tl.store(edge_out_ptr + {self.edge_axes(ei, 1)} * (F // {r}) + {self.feature_axes(g, 1)}, "
                f"part.to(edge_out_ptr.dtype.element_ty), "
                f"mask=tl.where({emask}, {self.feature_axes(f'({g} * {r} < F)', 1)}, False))",
            ]
        else:
            lines.append(f"part = tl.sum(emsg, axis={rank - 1})")
            if spec.edge_mode == "whole":
                lines.append(f"tl.store(edge_out_ptr + {ei}, part.to(edge_out_ptr.dtype.element_ty), mask=emask)")
            else:
                ptr = f"edge_out_ptr + {ei} * (F // {r}) + (tl.program_id(1) * BLOCK_F) // {r}"
                lines.append(_ATOMIC_ADD.format(ptr=ptr, value="part", mask="emask"))
        return _indent(lines, indent)

    def finalize(self, degree: str, indent: int) -> str:
        """Turn a row's reduction into its output: mean divides by the degree, max/min of an
        isolated row is 0 (as in PyG)."""
        op = self.spec.gather_op
        if op == "mean":
            return _indent([f"res = res / tl.maximum({degree}, 1).to({self.acc})"], indent)
        if op in ("max", "min"):
            return _indent([f"res = tl.where({degree} > 0, res, 0.0)"], indent)
        return _indent([], indent)

    def header(self) -> str:
        spec = self.spec
        return (
            f"# Generated by pyg_ugrapher for template {spec.template!r}: edge function "
            f"{spec.expr} over {', '.join(spec.kinds)} ({', '.join(spec.patterns)}), "
            f"gather {spec.gather_op}, reduce={spec.reduce}, acc={self.acc}, wide={spec.wide}, "
            f"head_size={spec.head_size}, head_split={spec.head_split}"
            + (
                f"; also writes {spec.edge_expr} per edge ({spec.edge_mode}, groups of {spec.edge_group})"
                if spec.edge_expr
                else ""
            )
            + (f"; weighted by the softmax of {spec.logit_expr} per destination" if spec.logit_expr else "")
            + ".\n"
            "import triton\nimport triton.language as tl\n" + self.gather_helpers()
        )

    def gather_helpers(self) -> str:
        """The NaN-propagating reduction and atomic of a max or min gather (see :data:`_NAN_BITS`);
        nothing for the others."""
        op = self.spec.gather_op
        if op not in _NAN_BITS:
            return ""
        int32, bits32, int64, bits64 = _NAN_BITS[op]
        reduction = _NAN_REDUCE_INTERPRETED if interpreting() else _NAN_REDUCE_COMPILED
        return (reduction + _NAN_ATOMIC).format(
            op=op, int32=int32, bits32=bits32, int64=int64, bits64=bits64, identity=_IDENTITY[op], sem=ATOMIC_SEM
        )


@dataclass(frozen=True)
class GraphArrays:
    """The index arrays of one graph on one device, as the launchers read them."""

    csr: CSR  #: destination-sorted CSR
    src: Tensor  #: ``[E]`` sources in the user's edge order
    dst: Tensor  #: ``[E]`` destinations in the user's edge order


def reduce_tiles(block_f: int, width: int, reduce_size: int) -> Tuple[int, int]:
    """Split a tile of ``block_f`` message features into ``(BLOCK_F, BLOCK_R)``: outputs per program
    and reduced features per loop step. Without a reduction ``BLOCK_R`` is 1."""
    block_r = min(block_f, triton.next_power_of_2(reduce_size)) if reduce_size > 1 else 1
    block_out = min(max(1, block_f // block_r), triton.next_power_of_2(width))
    return block_out, block_r


def _place(var: str, axes: Sequence[int], rank: int) -> str:
    """Index ``var`` so that its axes land on ``axes`` of a ``rank``-dimensional tile."""
    axes = list(axes)
    if not axes:
        return var
    if axes == list(range(rank)):
        return var
    return f"{var}[{', '.join(':' if i in axes else 'None' for i in range(rank))}]"


def _indent(lines: List[str], width: int) -> str:
    pad = " " * width
    return "\n".join(pad + line for line in lines) if lines else f"{pad}pass"


# -- compiling generated modules --------------------------------------------------------------
def cache_dir() -> Path:
    """Where generated kernels are written: ``$PYG_UGRAPHER_CACHE/kernels`` or
    ``~/.cache/pyg_ugrapher/kernels``, created private and checked by
    :func:`pyg_ugrapher.paths.cache_dir`."""
    return paths.cache_dir("kernels")


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``).

    Triton reads the variable when it is first imported (its own ``tl.sum``, ``tl.max`` ... are
    decorated then), so setting it later cannot work: say so instead of failing inside a kernel.
    """
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.standard.max, InterpretedFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after Triton was imported; set it before "
            "importing triton, torch_geometric or pyg_ugrapher (e.g. in the shell)"
        )
    return True


def uses_triton(device: torch.device) -> bool:
    """Whether work on ``device`` runs Triton kernels: on a GPU, or on the CPU under Triton's
    interpreter (elsewhere the reference executor and torch operations do it)."""
    return device.type == "cuda" or interpreting()


def load_kernel(source: str, name: str):
    """Compile the generated module ``source`` and return its kernel, the function ``name``.

    The module is compiled from ``source`` itself, never read back from disk: a file in the cache
    folder may have been changed by anyone who can write there. The file, named by the hash of
    ``source`` and written atomically, is for a user to read and names the module's code in
    tracebacks; ``linecache`` holds ``source`` under its path, so Triton (which reads a kernel's
    source through :mod:`inspect`) sees the text that was compiled. Uncached: the dispatcher keeps
    one kernel per spec and interpreter mode (Triton decides at decoration time whether a function
    is compiled or interpreted).
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = cache_dir() / f"ug_{digest}.py"
    if not path.is_file() or path.read_text() != source:
        _write_atomically(path, source)
    filename = str(path)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module_name = f"pyg_ugrapher_generated.ug_{digest}_{int(interpreting())}"
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return getattr(module, name)


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named file in the same folder: a concurrent
    reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
