"""``ug.plan``: the graph operators a model runs, how each is scheduled, and the kernel it runs.

:func:`plan` runs a module's forward pass once (under ``torch.no_grad()``) and records every
:func:`~pyg_ugrapher.compute` call (through :func:`pyg_ugrapher.ops.observe`, so layers that call
``compute`` directly are seen too) and every :class:`~pyg_ugrapher.MessagePassing` propagation that
ran PyG's own path instead of a captured op, or ran ``message()`` staged. Each record says which
submodule ran it, the operator (its nested loop), the complete schedule it runs (the explicit one,
its unset knobs chosen for that call, or what the cost model picks), what chose the strategy and
each knob, and the generated Triton source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from autotune import selection
from triton_kernels import kernel_source

from .ir import OpInfo
from .layout import Layout
from .message_passing import observe_fallbacks, observe_stages
from .ops import Call, observe, schedule_for
from .parallel import FIXED_KNOBS, ParallelInfo
from .reference import result_dtype
from .structure import CSR

#: Lines of generated source shown when an entry is printed.
SOURCE_LINES = 12


@dataclass(frozen=True)
class PlanEntry:
    """One operator a forward pass ran, or one propagation that fell back to PyG or ran staged
    (``op is None``, with ``fallback_reason`` or ``staged``)."""

    module: Optional[str]  #: qualified name of the submodule that ran it (``""``: the model itself)
    module_type: Optional[str]  #: that submodule's class name
    op: Optional[OpInfo]  #: the operator; ``None`` for a PyG fallback
    fallback_reason: Optional[str]  #: why PyG's path ran; ``None`` for an operator
    parallel_info: Optional[ParallelInfo] = None  #: its schedule
    source: Optional[str] = None  #: the generated Triton source
    layout: Optional[Layout] = None  #: its feature layout
    shapes: Tuple[Tuple[int, ...], ...] = ()  #: the operand shapes, in slot order
    dtype: Optional[torch.dtype] = None  #: the result dtype
    #: what set the strategy and each knob: ``"user"``, ``"narrowed from 64"`` (a user's knob too
    #: wide for the op), ``"fixed"`` (a knob no selection varies, at its value), or what chose the
    #: ones left unset (:func:`autotune.selection.chooser`: ``"cost model"``, ``"heuristic"``, ...)
    chosen_by: Tuple[Tuple[str, str], ...] = ()
    #: for a staged propagation, what ran in PyTorch and why (its operators are entries of their own)
    staged: Optional[str] = None

    def __str__(self) -> str:
        where = "<unknown module>" if self.module is None else (self.module or "<model>")
        if self.module_type is not None:
            where += f" ({self.module_type})"
        if self.staged is not None:
            return f"{where}: staged\n  {self.staged}"
        if self.op is None:
            return f"{where}: PyG fallback\n  reason: {self.fallback_reason}"
        loop = self.op.loop_text().replace("\n", "\n  ")
        operands = ", ".join(f"{kind} {list(shape)}" for kind, shape in zip(self.op.inputs, self.shapes))
        lines = self.source.splitlines()
        shown = "\n".join(f"    | {line}" for line in lines[:SOURCE_LINES])
        more = f" (first {SOURCE_LINES} of {len(lines)} lines)" if len(lines) > SOURCE_LINES else ""
        chosen = ", ".join(f"{knob}={by}" for knob, by in self.chosen_by)
        chosen = f"\n  chosen by: {chosen}" if chosen else ""
        return (
            f"{where}: {self.op.name}\n  {loop}\n  operands: {operands}; result {self.dtype}\n"
            f"  schedule: {self.parallel_info}{chosen}\n  source{more}:\n{shown}"
        )

    __repr__ = __str__


class Plan(list):
    """The entries of :func:`plan`, in execution order; prints one numbered block per entry."""

    def __str__(self) -> str:
        if not self:
            return "Plan: no graph operator ran"
        blocks = [f"[{index}] {entry}" for index, entry in enumerate(self)]
        captured = sum(entry.op is not None for entry in self)
        staged = sum(entry.staged is not None for entry in self)
        head = f"Plan: {captured} operator(s), {len(self) - captured - staged} PyG fallback(s)"
        head += f", {staged} staged propagation(s)" if staged else ""
        return head + "\n" + "\n".join(blocks)

    __repr__ = __str__


def plan(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Plan:
    """Run ``module(*args, **kwargs)`` once under ``torch.no_grad()`` and list what it ran.

    Returns one :class:`PlanEntry` per :func:`~pyg_ugrapher.compute` call (with its op, schedule and
    generated source), one per :class:`~pyg_ugrapher.MessagePassing` propagation that fell back to
    PyG (``op=None``, ``fallback_reason`` set) and one after the operators of each staged one
    (``staged`` set), in execution order.

    Example::

        >>> print(ug.plan(model, x, edge_index))
        Plan: 2 operator(s), 0 PyG fallback(s)
        [0] conv1 (GCNConv): u_mul_e_sum
        ...
    """
    names = {id(m): name for name, m in module.named_modules()}
    running: List[torch.nn.Module] = []  # the submodules whose forward is running, innermost last
    entries = Plan()

    def where(submodule: Optional[torch.nn.Module]) -> Tuple[Optional[str], Optional[str]]:
        if submodule is None:
            return None, None
        return names.get(id(submodule)), type(submodule).__name__

    def enter(submodule: torch.nn.Module, inputs: Any) -> None:
        if id(submodule) in names:
            running.append(submodule)

    def leave(submodule: torch.nn.Module, inputs: Any, output: Any) -> None:
        if running and running[-1] is submodule:
            running.pop()

    def on_call(call: Call) -> None:
        device = call.operands[0].device
        dtype = result_dtype(call.operands)
        info, chosen_by = _decided(call, call.graph.csr(device), dtype, device)
        acc64 = any(t.dtype == torch.float64 for t in call.operands)
        source = call.source or kernel_source(call.op, call.layout, info, acc64=acc64)
        entries.append(
            PlanEntry(
                *where(running[-1] if running else None),
                call.op,
                None,
                info,
                source,
                call.layout,
                tuple(tuple(t.shape) for t in call.operands),
                dtype,
                chosen_by,
            )
        )

    def on_fallback(submodule: torch.nn.Module, reason: str) -> None:
        entries.append(PlanEntry(*where(submodule), None, reason))

    def on_stage(submodule: torch.nn.Module, description: str) -> None:
        entries.append(PlanEntry(*where(submodule), None, None, staged=description))

    # Global module hooks, not per-module ones: hooks on a layer's aggregation module would make it
    # fall back (they need the materialised messages).
    pre = torch.nn.modules.module.register_module_forward_pre_hook(enter)
    post = torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)
    try:
        with torch.no_grad(), observe(on_call), observe_fallbacks(on_fallback), observe_stages(on_stage):
            module(*args, **kwargs)
    finally:
        pre.remove()
        post.remove()
    return entries


def _decided(
    call: Call, csr: CSR, dtype: torch.dtype, device: torch.device
) -> Tuple[ParallelInfo, Tuple[Tuple[str, str], ...]]:
    """The schedule ``call`` runs under and what set its strategy and each knob (see
    :attr:`PlanEntry.chosen_by`). A fused pass (``call.source``) reports the schedule the runtime
    decided for it."""
    user = call.parallel_info
    if user is None or call.source is not None:
        info = user or schedule_for(call.op, call.layout, csr, dtype, device)
        by = selection.chooser(csr, device)
        return info, (("strategy", by),) + tuple((knob, by) for knob in info.knobs)
    fitted, narrowed = user.narrowed_for(call.layout.message_width)
    info = schedule_for(call.op, call.layout, csr, dtype, device, fitted.serialize())
    by = selection.chooser(csr, device, partial=True)

    def setter(knob: str) -> str:
        if knob in narrowed:
            return f"narrowed from {narrowed[knob]}"
        if knob in FIXED_KNOBS and FIXED_KNOBS[knob] == getattr(user, knob):
            return "fixed"
        return "user" if knob in user.knobs else by

    return info, (("strategy", "user"),) + tuple((knob, setter(knob)) for knob in info.knobs)


__all__ = ["plan", "Plan", "PlanEntry"]
