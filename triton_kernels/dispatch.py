"""Run one operator under one schedule: pick the template, generate and compile its kernel, launch.

This is the only entry point the frontend calls; it takes plain tensors and IR values and knows
nothing of autograd or PyG. Its caches (kernels, specs, reused operands) and their guards: ``docs/caches.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_ugrapher.ir import Expr, OpInfo
from pyg_ugrapher.layout import Layout
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import CSR, IdentityMap, derived_cache, keeps_nothing

from . import (
    buffers,
    edge_message,
    edge_parallel,
    group_message,
    group_softmax,
    neighbor_group,
    vertex_message,
    vertex_parallel,
    vertex_softmax,
)
from .codegen import GraphArrays, KernelSpec, edge_mode, head_tiling, interpreting, load_kernel
from .csr_pair import grouped
from .launch import TRITON_LOCK, launcher

#: (gather or message creation, strategy) -> template module.
TEMPLATES = {
    ("gather", "vertex"): vertex_parallel,
    ("gather", "edge"): edge_parallel,
    ("gather", "group"): neighbor_group,
    ("message", "vertex"): vertex_message,
    ("message", "edge"): edge_message,
    ("message", "group"): group_message,
}
#: strategy -> the template of the softmax aggregation's one pass (:func:`run_softmax`).
SOFTMAX_TEMPLATES = {"vertex": vertex_softmax, "group": group_softmax}

_INT32_LIMIT = 2**31 - 1
_IDENTITY = {"max": float("-inf"), "min": float("inf")}
#: Edge operands with at most this many features per edge are read in CSR order by CSR-ordered
#: kernels once they are reused: reading one scalar through ``eid`` costs a 32-byte sector per
#: 4-byte value, while a cached permutation costs a few bytes per edge once. A tensor seen for the
#: first time is read through ``eid``: permuting it would cost more than it saves (an
#: ``index_select`` of a ``[E, 4]`` tensor takes longer than GAT's kernels reading it).
NARROW_EDGE = 4


def template_for(op: OpInfo, info: ParallelInfo):
    return TEMPLATES[("gather" if op.gather_op else "message", info.strategy)]


@functools.lru_cache(maxsize=None)
def operand_kinds(
    op: OpInfo, layout: Layout, info: ParallelInfo, reused: Optional[Tuple[bool, ...]] = None
) -> Tuple[str, ...]:
    """The kind each slot is read as: narrow edge operands of CSR-ordered kernels that are
    ``reused`` (default: none) become ``edge_csr`` (the dispatcher permutes them, once)."""
    if template_for(op, info) is edge_message:
        return op.inputs
    widths = {
        "full": layout.message_width,
        "head": layout.message_width // max(layout.inner, 1),
        "inner": layout.inner,
        "scalar": 1,
    }
    reused = reused or (False,) * len(op.inputs)
    return tuple(
        "edge_csr" if kind == "edge" and widths[pattern] <= NARROW_EDGE and again else kind
        for kind, pattern, again in zip(op.inputs, layout.patterns, reused)
    )


@functools.lru_cache(maxsize=None)
def _permutable(op: OpInfo, layout: Layout, info: ParallelInfo) -> Optional[Tuple[bool, ...]]:
    """Which slots :func:`operand_kinds` reads in CSR order once reused; ``None`` if none."""
    kinds = operand_kinds(op, layout, info, (True,) * len(op.inputs))
    slots = tuple(kind == "edge_csr" for kind in kinds)
    return slots if any(slots) else None


#: tensor -> [(eid, version, its rows in that CSR order, or None while seen only once)], newest
#: last, at most :data:`_ORDERS` entries: a static weight is read on its graph and, by the
#: backward, on the reversed one; with one entry the two reads evicted each other every step and
#: the weight was never read in CSR order.
_PERMUTED = IdentityMap()
_ORDERS = 2


#: copy -> (the tensor it copies, the copy's version then): see :func:`read_as`.
_COPIES = IdentityMap()


def read_as(copy: Tensor, original: Tensor) -> None:
    """Take ``copy``, unchanged, for ``original`` as an edge operand: where ``original`` comes back,
    so does ``copy``, and its rows are read in the CSR order kept for ``original``. A compiled graph
    owns its ops' outputs (Inductor may write into one once it is dead), so a custom op returns a
    copy of a cached tensor, a new tensor every step: a compiled GCNConv's normalised weights would
    otherwise be read through the edge ids every step, where an eager layer reads its cached
    weights in CSR order. Nothing is kept where nothing may be (:func:`is_reused`)."""
    if not (copy.requires_grad or copy.is_inference() or keeps_nothing(copy) or keeps_nothing(original)):
        _COPIES[copy] = (original, copy._version)


def _copied(tensor: Tensor) -> Tensor:
    """The tensor that ``tensor`` is an unchanged :func:`read_as` copy of, else ``tensor``."""
    copied = _COPIES.get(tensor)
    if copied is None or copied[1] != tensor._version:
        return tensor
    return copied[0]


def _entry(tensor: Tensor, eid: Tensor) -> Optional[list]:
    """The bookkeeping of ``tensor`` on the graph of ``eid``, if current."""
    for entry in _PERMUTED.get(tensor, ()):
        if entry[0] is eid and entry[1] == tensor._version:
            return entry
    return None


def seen(tensor: Tensor, eid: Tensor) -> bool:
    """Whether :func:`is_reused` would say ``tensor`` comes back, without marking it."""
    if tensor.requires_grad or keeps_nothing(tensor):
        return False
    return _entry(_copied(tensor), eid) is not None


def is_reused(tensor: Tensor, eid: Tensor) -> bool:
    """Whether ``tensor``, unchanged, was already an edge operand on the graph of ``eid`` (the
    first call marks it). Static edge weights (GCN's normalisation, a fixed ``edge_weight``) are
    reused; attention coefficients and gradients are new tensors every step. Tensors that require
    grad never count: trainable edge operands change every step anyway, and writes through
    ``.data`` (``gradcheck``'s perturbations, hand-written updates) leave ``_version`` unchanged,
    so a cached copy would go stale silently. Nor does anything where nothing may be kept (a CUDA
    graph's capture or recordable op, :func:`~pyg_ugrapher.structure.keeps_nothing`), or an
    inference tensor, which counts no versions."""
    if tensor.requires_grad or tensor.is_inference() or keeps_nothing(tensor):
        return False
    tensor = _copied(tensor)
    if _entry(tensor, eid) is not None:
        return True
    entries = [e for e in _PERMUTED.get(tensor, ()) if e[0] is not eid and e[1] == tensor._version]
    _PERMUTED[tensor] = (entries + [[eid, tensor._version, None]])[-_ORDERS:]
    return False


def in_csr_order(tensor: Tensor, eid: Tensor) -> Tensor:
    """``tensor`` (rows in user edge order, reused: see :func:`is_reused`) with its rows in the CSR
    order of ``eid``, flattened to 2-D; permuted once per tensor version and graph (a
    :func:`read_as` copy: once for the tensor it copies)."""
    entry = _entry(_copied(tensor), eid)
    if entry is None:  # not marked (requires grad, captured): nothing to keep it for
        return _as_rows(tensor).index_select(0, eid)
    if entry[2] is None:
        entry[2] = _as_rows(tensor).index_select(0, eid)
    return entry[2]


def reuse_state(operands: Sequence[Tensor], eid: Tensor, edge_slots: Sequence[bool]) -> Optional[Tuple[bool, ...]]:
    """Which ``operands`` :func:`is_reused` would take for reused on the graph of ``eid`` (``None``
    if none): a decision timed on a first call, which reads them through ``eid``, does not hold
    for later calls reading them in CSR order. Only ``edge_slots`` (the op's edge operands, the
    only ones read in CSR order) are looked up: every call asks, so lookups are kept few."""
    state = None
    # Loops, not generator expressions, on this path and the launch plans': each generator step
    # is a Python call, and an operator's ~100 calls are most of its host time.
    for i, edge in enumerate(edge_slots):
        if edge and seen(operands[i], eid):
            if state is None:
                state = [False] * len(edge_slots)
            state[i] = True
    return None if state is None else tuple(state)


def _walked_by(template, graph: GraphArrays) -> GraphArrays:
    """``graph`` as ``template`` reads it: a structure in the user's order
    (:attr:`~pyg_ugrapher.structure.CSR.user_order`, a small GPU graph's) grouped by row for a
    template that walks rows (:func:`~triton_kernels.csr_pair.grouped`: sorted once per structure)."""
    if not graph.csr.user_order or template.READS_USER_ORDER:
        return graph
    return GraphArrays(grouped(graph.csr), graph.src, graph.dst)


def _in_kernel_order(tensor: Tensor, kind: str, csr: CSR) -> Tensor:
    """An operand as a kernel reads it: an ``edge_csr`` one in the CSR order of ``csr``, which on
    a structure in the user's order is the edge ids' own."""
    if kind == "edge_csr" and not csr.user_order:
        return in_csr_order(tensor, csr.eid)
    return _as_rows(tensor)


def kernel_spec(
    op: OpInfo,
    layout: Layout,
    info: ParallelInfo,
    acc64: bool = False,
    wide: bool = False,
    kinds: Optional[Tuple[str, ...]] = None,
) -> KernelSpec:
    head_size, head_split = (
        (0, False)
        if op.reduces or "head" not in layout.patterns
        else head_tiling(layout.message_width, layout.inner, info.block_f)
    )
    return KernelSpec(
        template=template_for(op, info).__name__.rsplit(".", 1)[-1],
        expr=op.expr.serialize(),
        kinds=kinds or operand_kinds(op, layout, info),
        patterns=layout.patterns,
        gather_op=op.gather_op,
        reduce=op.reduces,
        acc64=acc64,
        wide=wide,
        head_size=head_size,
        head_split=head_split,
    )


@dataclass(frozen=True)
class _Combined:
    """The fields of :class:`OpInfo` the kernels read, for an expression that need not read every
    slot (an OpInfo requires it)."""

    expr: Expr
    gather_op: Optional[str]
    inputs: Tuple[str, ...]
    reduces: bool = False


@dataclass(frozen=True)
class Fused:
    """A gather op and a message op over the same graph and message shape, as one kernel: the
    operands of both (shared tensors once) as the slots of a combined op whose edge function is
    the gather's, plus the message op's edge function as the kernel's edge output."""

    op: _Combined  #: the gather's expression over the combined slots (unread slots allowed)
    layout: Layout  #: the gather's layout over the combined slots
    edge_expr: str
    edge_group: int
    gather_slots: Tuple[int, ...]  #: combined slot of each gather operand
    message_slots: Tuple[int, ...]  #: combined slot of each message operand
    keys: Tuple[Tuple[str, str], ...]  #: (kind, pattern) of each gather operand, then each message operand
    sharing: Tuple[int, ...]  #: which operands are one tensor (:func:`_sharing`), what the combined op depends on

    def edge_fields(self, mode: str) -> Tuple[Tuple[str, Any], ...]:
        """The :class:`KernelSpec` fields of the edge output, written in ``mode`` (:func:`edge_mode`)."""
        return (("edge_expr", self.edge_expr), ("edge_group", self.edge_group), ("edge_mode", mode))

    def combined(self, gather_operands: Sequence[Tensor], message_operands: Sequence[Tensor]) -> List[Tensor]:
        """The operands of the combined op, in its slot order."""
        operands: List[Optional[Tensor]] = [None] * len(self.op.inputs)
        for k, t in zip(self.gather_slots + self.message_slots, list(gather_operands) + list(message_operands)):
            operands[k] = t
        return operands


def fuse(
    gather: OpInfo,
    gather_layout: Layout,
    message: OpInfo,
    message_layout: Layout,
    gather_operands: Sequence[Tensor],
    message_operands: Sequence[Tensor],
) -> Optional[Fused]:
    """The combined op of :func:`run_with_edge_output`, or ``None`` when the two ops do not share
    a message shape (or one is not of its kind)."""
    keys = tuple(zip(gather.inputs + message.inputs, gather_layout.patterns + message_layout.patterns))
    return _fused(
        gather,
        gather_layout,
        message,
        message_layout,
        keys,
        _sharing(keys, list(gather_operands) + list(message_operands)),
    )


def _sharing(keys: Sequence[Tuple[str, str]], operands: Sequence[Tensor]) -> Tuple[int, ...]:
    """Which earlier operand each one is (the same tensor read the same way, by its ``keys``), or
    -1: all that the combined op depends on besides the two ops, so it is built once per pattern."""
    return tuple(
        next((k for k in range(i) if operands[k] is t and keys[k] == keys[i]), -1) for i, t in enumerate(operands)
    )


@functools.lru_cache(maxsize=None)
def _fused(
    gather: OpInfo,
    gather_layout: Layout,
    message: OpInfo,
    message_layout: Layout,
    keys: Tuple[Tuple[str, str], ...],
    sharing: Tuple[int, ...],
) -> Optional[Fused]:
    if (
        gather.gather_op is None
        or gather.reduces
        or message.gather_op is not None
        or gather_layout.message_shape != message_layout.message_shape
    ):
        return None
    kinds = gather.inputs + message.inputs
    patterns = gather_layout.patterns + message_layout.patterns
    slots: List[int] = []
    firsts: List[int] = []  #: operand position of each combined slot
    for i, earlier in enumerate(sharing):
        if earlier < 0:
            firsts.append(i)
            slots.append(len(firsts) - 1)
        else:
            slots.append(slots[earlier])
    n = len(gather.inputs)
    gather_slots, message_slots = tuple(slots[:n]), tuple(slots[n:])
    kinds = tuple(kinds[i] for i in firsts)
    patterns = tuple(patterns[i] for i in firsts)
    expr = gather.expr.remap(dict(enumerate(gather_slots)))
    op = _Combined(expr, gather.gather_op, kinds)
    layout = Layout(gather_layout.message_shape, gather_layout.out_shape, patterns, gather_layout.inner, 1)
    edge_expr = message.expr.remap(dict(enumerate(message_slots))).serialize()
    return Fused(op, layout, edge_expr, message_layout.reduce_size, gather_slots, message_slots, keys, sharing)


def _fusion(
    gather: OpInfo,
    gather_layout: Layout,
    message: OpInfo,
    message_layout: Layout,
    gather_operands: Sequence[Tensor],
    message_operands: Sequence[Tensor],
    info: ParallelInfo,
) -> Optional[Tuple[Fused, str]]:
    """The combined op of :func:`run_with_edge_output` and the :func:`edge_mode` of its edge output
    under ``info``, or ``None`` when ``info`` cannot run the two ops together."""
    if info.strategy not in ("vertex", "group"):
        return None
    fused = fuse(gather, gather_layout, message, message_layout, gather_operands, message_operands)
    if fused is None:
        return None
    mode = edge_mode(gather_layout.width, fused.edge_group, info.block_f)
    return None if mode is None else (fused, mode)


def run_with_edge_output(
    gather: OpInfo,
    gather_layout: Layout,
    message: OpInfo,
    message_layout: Layout,
    graph: GraphArrays,
    gather_operands: Sequence[Tensor],
    message_operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtypes: Tuple[torch.dtype, torch.dtype],
) -> Optional[Tuple[Tensor, Tensor]]:
    """``(run(gather, ...), run(message, ...))`` in one pass over the edges, or ``None`` when
    ``info`` cannot run them together (an edge-parallel schedule, or feature tiles that straddle
    the message op's sums); the caller then runs them one by one."""
    fusion = _fusion(gather, gather_layout, message, message_layout, gather_operands, message_operands, info)
    if fusion is None:
        return None
    fused, mode = fusion
    info.validate_for(gather_layout.message_width)
    operands = fused.combined(gather_operands, message_operands)
    edge_shape = (graph.csr.num_edges,) + message_layout.out_shape
    if graph.csr.num_edges == 0 or gather_layout.width == 0:
        out = run(gather, gather_layout, graph, gather_operands, info, out_dtypes[0])
        return out, torch.zeros(edge_shape, dtype=out_dtypes[1], device=graph.csr.device)
    edge_out = _allocate_edge_output(
        graph.csr.num_edges, message_layout.width, out_dtypes[1], mode == "partial", graph.csr.device
    )
    out = _launch(fused.op, fused.layout, graph, operands, info, out_dtypes[0], fused.edge_fields(mode), edge_out)
    return out, edge_out.to(out_dtypes[1]).view(edge_shape)


def kernel_source(op: OpInfo, layout: Layout, info: ParallelInfo, acc64: bool = False, wide: bool = False) -> str:
    """The generated Triton source that runs ``op`` under ``info``."""
    return template_for(op, info).source(kernel_spec(op, layout, info, acc64, wide))


@functools.lru_cache(maxsize=None)
def _kernel(template, spec: KernelSpec, interpreted: bool):
    """The kernel of ``spec``, compiled or ``interpreted``: the one cache of generated kernels,
    keyed by spec (generating the source again would cost as much host time as a launch).
    Launched through :func:`~triton_kernels.launch.launcher`. A miss loads under
    :data:`~triton_kernels.launch.TRITON_LOCK`: the kernel file is written and imported, and the
    decoration of its functions is Triton's."""
    with TRITON_LOCK:
        return launcher(load_kernel(template.source(spec), spec.name), interpreted)


@functools.lru_cache(maxsize=None)
def _spec(
    op: OpInfo,
    layout: Layout,
    info: ParallelInfo,
    acc64: bool,
    wide: bool,
    kinds: Tuple[str, ...],
    edge_fields: Tuple[Tuple[str, Any], ...],
) -> KernelSpec:
    """:func:`kernel_spec` with the fields of an edge output, once per combination."""
    return replace(kernel_spec(op, layout, info, acc64, wide, kinds), **dict(edge_fields))


def packed_rows(tensor: Tensor) -> bool:
    """Whether each row of ``tensor`` (its first index) is one run of unit stride, whatever the
    stride between rows: the kernels read such a tensor as it is (``row * stride(0) + feature``).
    Views of a wider tensor (GAT's two attention halves, unbound from one ``[N, 2, H]`` product) are
    packed rows without being contiguous."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for size, stride in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _as_rows(tensor: Tensor) -> Tensor:
    """``tensor`` where its features are packed (unit stride, row-major: the kernels read
    ``row * stride(0) + feature``), else ``[rows, width]`` with unit feature stride."""
    if tensor.is_contiguous():
        return tensor
    # An explicit width: ``-1`` is ambiguous for a tensor without rows (a graph without edges).
    flat = tensor.reshape(tensor.shape[0], math.prod(tensor.shape[1:]))
    if flat.shape[1] > 1 and flat.stride(1) != 1:
        flat = flat.contiguous()
    return flat


def all_packed(tensors: Sequence[Tensor]) -> bool:
    """Whether every tensor is :func:`packed_rows` (what a launch plan takes). Every operator call
    asks: a contiguous tensor, the usual one, costs one call."""
    for t in tensors:
        if not t.is_contiguous() and not packed_rows(t):
            return False
    return True


def _needs_wide(tensors: Sequence[Tensor]) -> bool:
    """Whether an element offset (``row * stride(0) + feature``) may exceed int32. Every operator
    call asks, of every operand: two calls per tensor."""
    for t in tensors:
        elements = t.numel()
        if elements:
            rows = t.shape[0]
            stride = t.stride(0)
            if rows * (stride if stride > 0 else 1) + elements // rows > _INT32_LIMIT:
                return True
    return False


def run(
    op: OpInfo,
    layout: Layout,
    graph: GraphArrays,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """Compute ``op`` on ``graph`` with the Triton kernel of ``info``.

    ``operands`` are in slot order, on the graph's device. The result has shape
    ``[rows, *layout.out_shape]`` (rows: destinations, or edges in the user's order for message
    creation) and dtype ``out_dtype`` (default: the operands' promoted dtype).
    """
    info.validate_for(layout.message_width)
    return _launch(op, layout, graph, operands, info, out_dtype)


def _launch(
    op: OpInfo,
    layout: Layout,
    graph: GraphArrays,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtype: Optional[torch.dtype],
    edge_fields: Tuple[Tuple[str, Any], ...] = (),
    edge_out: Optional[Tensor] = None,
) -> Tensor:
    template = template_for(op, info)
    graph = _walked_by(template, graph)
    eid = graph.csr.eid
    permutable = _permutable(op, layout, info)
    # Only slots that could be read in CSR order ask whether their tensor came back.
    reused = (
        None if permutable is None else tuple(again and is_reused(t, eid) for t, again in zip(operands, permutable))
    )
    kinds = operand_kinds(op, layout, info, reused)
    flat = [_in_kernel_order(t, kind, graph.csr) for t, kind in zip(operands, kinds)]
    if out_dtype is None:
        out_dtype = flat[0].dtype
        for t in flat[1:]:
            out_dtype = torch.promote_types(out_dtype, t.dtype)
    rows = _rows(op, graph)
    width = layout.width
    shape = (rows,) + layout.out_shape
    device = graph.csr.device
    if rows == 0 or width == 0:
        return torch.zeros(shape, dtype=out_dtype, device=device)
    out = _allocate(op, graph, template, info, rows, width, out_dtype)
    if graph.csr.num_edges or (op.gather_op and not template.ATOMIC):
        acc64 = any(t.dtype == torch.float64 for t in flat)
        extra = [] if edge_out is None else [edge_out]
        spec = _spec(op, layout, info, acc64, _needs_wide(flat + [out] + extra), kinds, edge_fields)
        kernel = _kernel(template, spec, interpreting())
        template.launch(kernel, graph, _tensor_args(flat) + extra, out, width, layout, info)
    return _result(out, out_dtype, shape)


def _rows(op: OpInfo, graph: GraphArrays) -> int:
    """Output rows: destinations for a gather, edges for message creation."""
    return graph.csr.num_rows if op.gather_op else graph.csr.num_edges


def _tensor_args(tensors: Sequence[Tensor]) -> List:
    """Each operand and its row stride, as the templates take them."""
    args: List = []
    for t in tensors:
        args += [t, t.stride(0)]
    return args


def _result(out: Tensor, out_dtype: torch.dtype, shape: Tuple[int, ...]) -> Tensor:
    """``out`` (``[rows, width]``, maybe in the atomic dtype) as ``out_dtype`` in ``shape``; no
    conversion or view where none is needed (each costs a dispatcher call)."""
    if out.dtype != out_dtype:
        out = out.to(out_dtype)
    return out if out.shape == shape else out.view(shape)


@dataclass(frozen=True)
class Plan:
    """What :func:`run` works out for one call, kept for the calls like it (:func:`prepare`): such
    a call allocates its output and launches, nothing else. A plan holds nothing of a graph, so
    one serves every graph whose schedule is the same (a sampler's mini-batches). A call through a
    plan skips the checks and lookups of :func:`run`, about half of its host time."""

    template: Any
    kernel: Any
    op: OpInfo
    layout: Layout
    info: ParallelInfo
    out_dtype: torch.dtype
    #: The slots :func:`run` reads in CSR order once their tensor comes back (``None``: none).
    permutable: Optional[Tuple[bool, ...]]
    #: Of those, the slots whose tensors come back in this plan's calls, read in CSR order
    #: (``None``: none): GCN's static weights, every step. A plan that took them for new would
    #: hand each such call to :func:`run`, at that function's host cost.
    in_csr: Optional[Tuple[bool, ...]] = None

    def __call__(
        self, graph: GraphArrays, operands: Sequence[Tensor], edge_out: Optional[Tensor] = None
    ) -> Optional[Tensor]:
        """The result for ``operands``, :func:`packed_rows` of the dtypes and feature shapes the
        plan was made for (and ``edge_out`` written, for a plan of :func:`prepare_with_edge_output`);
        ``None`` where the call needs :func:`run`: the operands of the permutable slots come back
        where the plan expects them new or the other way round, no edges or no rows to compute, or
        element offsets beyond int32."""
        graph = _walked_by(self.template, graph)
        csr = graph.csr
        rows = _rows(self.op, graph)
        width = self.layout.width
        extra = [] if edge_out is None else [edge_out]
        # The output's offsets reach (rows + 1) * width, as _needs_wide counts them. A tensor read
        # in CSR order is no wider than the operand it comes from.
        if (
            not csr.num_edges
            or not rows
            or (rows + 1) * width > _INT32_LIMIT
            or _needs_wide(operands)
            or (extra and _needs_wide(extra))
        ):
            return None
        if self.permutable is not None:
            eid = csr.eid
            again = self.in_csr or (False,) * len(self.permutable)
            for t, slot, back in zip(operands, self.permutable, again):
                if slot and seen(t, eid) != back:
                    return None
            for t, slot, back in zip(operands, self.permutable, again):
                if slot and not back:  # first seen now: marked, so that a call that brings it back permutes it
                    is_reused(t, eid)
            if self.in_csr is not None and not csr.user_order:
                operands = [in_csr_order(t, eid) if back else t for t, back in zip(operands, self.in_csr)]
        out = _allocate(self.op, graph, self.template, self.info, rows, width, self.out_dtype)
        self.template.launch(self.kernel, graph, _tensor_args(operands) + extra, out, width, self.layout, self.info)
        return _result(out, self.out_dtype, (rows,) + self.layout.out_shape)


@dataclass(frozen=True)
class PairPlan:
    """What :func:`run_with_edge_output` works out for one call, kept for the calls like it
    (:func:`prepare_with_edge_output`): the combined op's :class:`Plan`, and how the two ops'
    operands map onto it. GAT's backward runs one such pair per step; through
    :func:`run_with_edge_output` it would cost about three times a plain plan's host time."""

    fused: Fused  #: its ``sharing``: the operands that were one tensor when the plan was made
    plan: Plan
    edge_width: int
    edge_shape: Tuple[int, ...]  #: the message op's feature shape
    edge_dtype: torch.dtype
    atomic: bool  #: the edge output adds partial sums atomically (``edge_mode`` ``"partial"``)

    def __call__(
        self, graph: GraphArrays, gather_operands: Sequence[Tensor], message_operands: Sequence[Tensor]
    ) -> Optional[Tuple[Tensor, Tensor]]:
        """Both results for operands like the plan's (packed rows, the same tensors shared); ``None``
        where the call needs :func:`run_with_edge_output`."""
        num_edges = graph.csr.num_edges
        operands = list(gather_operands) + list(message_operands)
        if not num_edges or _sharing(self.fused.keys, operands) != self.fused.sharing:
            return None
        edge_out = _allocate_edge_output(num_edges, self.edge_width, self.edge_dtype, self.atomic, graph.csr.device)
        out = self.plan(graph, self.fused.combined(gather_operands, message_operands), edge_out)
        if out is None:
            return None
        return out, edge_out.to(self.edge_dtype).view((num_edges,) + self.edge_shape)


def prepare(
    op: OpInfo,
    layout: Layout,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtype: torch.dtype,
    edge_fields: Tuple[Tuple[str, Any], ...] = (),
    reused: Optional[Tuple[bool, ...]] = None,
) -> Optional[Plan]:
    """A :class:`Plan` for calls of ``op`` under ``info`` with operands of the dtypes and feature
    shapes of ``operands`` (rows are the graph's, on any graph), the operands of the ``reused``
    slots coming back (:func:`reuse_state`; default: none); ``None`` where each call must go
    through :func:`run`: nothing to compute, offsets of these operands beyond int32. Whether
    ``operands`` have packed rows does not matter: each call's caller checks its own (a first
    call's upstream gradient is often the expanded gradient of ``sum()``, and a decision without
    a plan would send every later call through :func:`run`). ``edge_fields``: those of an edge
    output written by the same kernel (see :func:`prepare_with_edge_output`)."""
    info.validate_for(layout.message_width)
    if layout.width == 0 or _needs_wide(operands):
        return None
    template = template_for(op, info)
    kinds = operand_kinds(op, layout, info, reused)
    in_csr = tuple(kind == "edge_csr" for kind in kinds)
    spec = _spec(op, layout, info, any(t.dtype == torch.float64 for t in operands), False, kinds, edge_fields)
    return Plan(
        template,
        _kernel(template, spec, interpreting()),
        op,
        layout,
        info,
        out_dtype,
        _permutable(op, layout, info),
        in_csr if any(in_csr) else None,
    )


def prepare_with_edge_output(
    gather: OpInfo,
    gather_layout: Layout,
    message: OpInfo,
    message_layout: Layout,
    gather_operands: Sequence[Tensor],
    message_operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtypes: Tuple[torch.dtype, torch.dtype],
) -> Optional[PairPlan]:
    """A :class:`PairPlan` for calls of :func:`run_with_edge_output` with operands like these (as
    :func:`prepare`); ``None`` where each call must go through it, or where ``info`` cannot run the
    two ops together."""
    fusion = _fusion(gather, gather_layout, message, message_layout, gather_operands, message_operands, info)
    if fusion is None:
        return None
    fused, mode = fusion
    plan = prepare(
        fused.op,
        fused.layout,
        fused.combined(gather_operands, message_operands),
        info,
        out_dtypes[0],
        fused.edge_fields(mode),
    )
    if plan is None:
        return None
    return PairPlan(fused, plan, message_layout.width, message_layout.out_shape, out_dtypes[1], mode == "partial")


def _softmax_tiling(layout: Layout, info: ParallelInfo) -> Optional[bool]:
    """:func:`vertex_softmax.tiling` of a schedule a softmax pass runs (:data:`SOFTMAX_TEMPLATES`);
    ``None`` for any other."""
    return vertex_softmax.tiling(layout, info) if info.strategy in SOFTMAX_TEMPLATES else None


@functools.lru_cache(maxsize=None)
def _softmax_spec(
    value: Expr, logit: Expr, kinds: Tuple[str, ...], layout: Layout, info: ParallelInfo, acc64: bool, wide: bool
) -> Optional[KernelSpec]:
    split = _softmax_tiling(layout, info)
    if split is None:
        return None
    return KernelSpec(
        template=SOFTMAX_TEMPLATES[info.strategy].__name__.rsplit(".", 1)[-1],
        expr=value.serialize(),
        kinds=kinds,
        patterns=layout.patterns,
        gather_op="sum",
        reduce=False,
        acc64=acc64,
        wide=wide,
        head_size=layout.inner,
        head_split=split,
        logit_expr=logit.serialize(),
    )


@dataclass(frozen=True)
class SoftmaxPlan:
    """What :func:`run_softmax` works out for one call, kept for the calls like it
    (:func:`prepare_softmax`), on any graph."""

    kernel: Any
    layout: Layout
    info: ParallelInfo
    out_dtypes: Tuple[torch.dtype, torch.dtype]

    def __call__(self, graph: GraphArrays, operands: Sequence[Tensor]) -> Optional[Tuple[Tensor, Tensor]]:
        """``(out, log-normaliser)`` for operands like the plan's (packed rows); ``None`` where the
        call needs :func:`run_softmax`: no rows or features, or offsets beyond int32."""
        rows, width = graph.csr.num_rows, self.layout.message_width
        if not rows or not width or (rows + 1) * width > _INT32_LIMIT or _needs_wide(operands):
            return None
        return _softmax_launch(self.kernel, self.layout, graph, operands, self.info, self.out_dtypes)


def _softmax_launch(
    kernel,
    layout: Layout,
    graph: GraphArrays,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtypes: Tuple[torch.dtype, torch.dtype],
) -> Tuple[Tensor, Tensor]:
    template = SOFTMAX_TEMPLATES[info.strategy]
    graph = _walked_by(template, graph)
    rows, device = graph.csr.num_rows, graph.csr.device
    heads = layout.message_width // layout.inner
    out = buffers.uninitialised((rows, layout.message_width), out_dtypes[0], device)
    normaliser = buffers.uninitialised((rows, heads), out_dtypes[1], device)
    template.launch(kernel, graph, _tensor_args(operands), out, normaliser, layout, info)
    return out.view((rows,) + layout.message_shape), normaliser.view(rows, heads, 1)


def run_softmax(
    value: Expr,
    logit: Expr,
    kinds: Tuple[str, ...],
    layout: Layout,
    graph: GraphArrays,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtypes: Tuple[torch.dtype, torch.dtype],
) -> Optional[Tuple[Tensor, Tensor]]:
    """Softmax aggregation in one pass (:data:`SOFTMAX_TEMPLATES`: vertex-parallel or neighbour
    groups): per destination and head, ``(sum of softmax(logit) * value, log-normaliser)``, shaped
    ``[rows, *message_shape]`` and ``[rows, heads, 1]``, with ``value`` and ``logit`` expressions
    over the operand slots of ``kinds`` (every operand of edge kind read through the edge ids);
    ``None`` where ``info`` cannot run it (another strategy, or :func:`vertex_softmax.tiling`)."""
    info.validate_for(layout.message_width)
    flat = [_as_rows(t) for t in operands]
    spec = _softmax_spec(
        value,
        logit,
        kinds,
        layout,
        info,
        any(t.dtype == torch.float64 for t in flat),
        _needs_wide(flat) or (graph.csr.num_rows + 1) * layout.message_width > _INT32_LIMIT,
    )
    if spec is None:
        return None
    rows, device = graph.csr.num_rows, graph.csr.device
    if not rows or not layout.message_width:
        heads = layout.message_width // max(layout.inner, 1)
        return (
            torch.zeros((rows,) + layout.message_shape, dtype=out_dtypes[0], device=device),
            torch.zeros((rows, heads, 1), dtype=out_dtypes[1], device=device),
        )
    return _softmax_launch(
        _kernel(SOFTMAX_TEMPLATES[info.strategy], spec, interpreting()), layout, graph, flat, info, out_dtypes
    )


def runs_softmax(layout: Layout, info: ParallelInfo) -> bool:
    """Whether :func:`run_softmax` can run under ``info`` (:func:`_softmax_tiling`)."""
    return _softmax_tiling(layout, info) is not None


def softmax_source(
    value: Expr, logit: Expr, kinds: Tuple[str, ...], layout: Layout, info: ParallelInfo, acc64: bool = False
) -> Optional[str]:
    """The generated Triton source of :func:`run_softmax` under ``info`` (``None``: it cannot run it)."""
    spec = _softmax_spec(value, logit, kinds, layout, info, acc64, False)
    return None if spec is None else SOFTMAX_TEMPLATES[info.strategy].source(spec)


def prepare_softmax(
    value: Expr,
    logit: Expr,
    kinds: Tuple[str, ...],
    layout: Layout,
    operands: Sequence[Tensor],
    info: ParallelInfo,
    out_dtypes: Tuple[torch.dtype, torch.dtype],
) -> Optional[SoftmaxPlan]:
    """A :class:`SoftmaxPlan` for calls of :func:`run_softmax` with operands of the dtypes and
    feature shapes of ``operands``; ``None`` where ``info`` cannot run it or offsets of these
    operands exceed int32."""
    info.validate_for(layout.message_width)
    if not layout.message_width or _needs_wide(operands):
        return None
    spec = _softmax_spec(value, logit, kinds, layout, info, any(t.dtype == torch.float64 for t in operands), False)
    if spec is None:
        return None
    return SoftmaxPlan(_kernel(SOFTMAX_TEMPLATES[info.strategy], spec, interpreting()), layout, info, out_dtypes)


def _allocate_edge_output(num_edges: int, width: int, dtype: torch.dtype, atomic: bool, device: torch.device) -> Tensor:
    if not atomic:
        return buffers.uninitialised((num_edges, width), dtype, device)
    return torch.zeros((num_edges, width), dtype=buffers.atomic_dtype(dtype), device=device)


def _allocate(
    op: OpInfo, graph: GraphArrays, template, info: ParallelInfo, rows: int, width: int, out_dtype: torch.dtype
) -> Tensor:
    device = graph.csr.device
    if not template.ATOMIC:
        return buffers.uninitialised((rows, width), out_dtype, device)
    dtype = buffers.atomic_dtype(out_dtype)
    identity = _IDENTITY.get(op.gather_op, 0.0)
    combined = template.atomic_rows(graph, info) if graph.csr.num_edges else None
    if combined is not None:
        # Only rows whose partial results meet through atomics start from the identity; the kernel
        # stores every other row once, so a large output is not zeroed whole before the launch.
        return buffers.uninitialised((rows, width), dtype, device).index_fill_(0, combined, identity)
    if op.gather_op not in _IDENTITY:
        return torch.zeros((rows, width), dtype=dtype, device=device)
    # A copy even where the view is already contiguous (one feature): the kernel writes into it.
    return (
        _row_identities(graph.csr, identity, dtype)[:, None]
        .expand(rows, width)
        .clone(memory_format=torch.contiguous_format)
    )


def _row_identities(csr: CSR, identity: float, dtype: torch.dtype) -> Tensor:
    """Each row's starting value under atomics: ``identity`` where the row has edges, 0 where it
    has none (an empty max is 0, as PyG's). It depends on the structure alone, so it is kept with
    it (one copy per launch instead of five operations), except where nothing may be kept (a CUDA
    graph's memory: :func:`~pyg_ugrapher.structure.keeps_nothing`)."""
    rowptr = csr.rowptr
    cache = None if keeps_nothing(rowptr) else derived_cache(rowptr)
    key = ("row identities", identity, dtype)
    found = None if cache is None else cache.get(key)
    if found is None:
        found = torch.where(rowptr[1:] > rowptr[:-1], identity, 0.0).to(dtype)
        if cache is not None:
            cache[key] = found
    return found


__all__: Tuple[str, ...] = (
    "run",
    "prepare",
    "Plan",
    "prepare_with_edge_output",
    "PairPlan",
    "packed_rows",
    "all_packed",
    "read_as",
    "run_with_edge_output",
    "run_softmax",
    "prepare_softmax",
    "SoftmaxPlan",
    "runs_softmax",
    "softmax_source",
    "kernel_source",
    "kernel_spec",
    "TEMPLATES",
    "GraphArrays",
)
