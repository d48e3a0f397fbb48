r"""Halo exchange: the remote source rows a rank's layer reads, through ``torch.distributed``.

A rank owns some vertices (its *local* rows) and all of their incoming edges. The sources of those
edges that other ranks own are its *halo*. Before a layer aggregates, every rank sends the rows
that others need and receives its halo: one ``all_to_all_single`` (NCCL on GPUs, gloo on CPUs).
The gradient flows back the same way in reverse: every rank returns the gradients of its halo
rows to their owners, which sum them into their local rows.

:class:`HaloPlan` holds who sends what (made once per graph, by
:meth:`HaloPlan.exchange_requests`); :func:`halo_exchange` runs it, differentiably.
:func:`record_exchanges` collects the volume and time of every exchange, forward and backward.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ContextManager, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..structure import collecting


@dataclass(frozen=True)
class HaloPlan:
    r"""Which local rows a rank sends to every other rank, and how many halo rows it receives.

    Args:
        send_index: ``[S]`` int64 local rows to send, grouped by destination rank (a row needed
            by several ranks appears once per rank).
        send_counts: rows sent to every rank (``sum = S``; the rank's own count is 0).
        recv_counts: halo rows received from every rank, in the order of the halo.
        num_local: the number of local rows (``send_index`` lies in ``[0, num_local)``).
        group: the process group (``None``: the default one).
    """

    send_index: Tensor
    send_counts: Tuple[int, ...]
    recv_counts: Tuple[int, ...]
    num_local: int
    group: Optional[ProcessGroup] = field(default=None, compare=False)

    @property
    def world_size(self) -> int:
        return len(self.send_counts)

    @property
    def num_send(self) -> int:
        return sum(self.send_counts)

    @property
    def num_recv(self) -> int:
        return sum(self.recv_counts)

    @classmethod
    def exchange_requests(
        cls, halo_rows: Tensor, recv_counts: Sequence[int], num_local: int, group: Optional[ProcessGroup] = None
    ) -> "HaloPlan":
        r"""The plan of a halo, agreed with the other ranks (a collective: every rank calls it).

        Args:
            halo_rows: ``[H]`` int64, the row of every halo vertex on its owner, grouped by owner
                rank in rank order.
            recv_counts: the number of halo vertices every rank owns (``sum = H``).
            num_local: the number of this rank's rows.
            group: the process group (``None``: the default one).
        """
        world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        recv_counts = tuple(int(c) for c in recv_counts)
        if len(recv_counts) != world_size or sum(recv_counts) != halo_rows.numel():
            raise ValueError(
                f"recv_counts: expected {world_size} counts summing to {halo_rows.numel()}, got {recv_counts}"
            )
        if world_size == 1:
            return cls(halo_rows.new_empty(0), (0,), (0,), num_local, group)
        device = halo_rows.device
        # Every rank tells every owner how many rows it wants, then which ones.
        wanted = torch.tensor(recv_counts, dtype=torch.int64, device=device)
        asked = torch.empty_like(wanted)
        dist.all_to_all_single(asked, wanted, group=group)
        send_counts = tuple(asked.tolist())
        send_index = torch.empty(sum(send_counts), dtype=torch.int64, device=device)
        dist.all_to_all_single(
            send_index,
            halo_rows.to(torch.int64).contiguous(),
            output_split_sizes=list(send_counts),
            input_split_sizes=list(recv_counts),
            group=group,
        )
        if send_index.numel() and not 0 <= int(send_index.min()) <= int(send_index.max()) < num_local:
            raise ValueError(
                f"halo_rows: another rank asked for rows outside [0, {num_local}); the ranks disagree on the partition"
            )
        return cls(send_index, send_counts, recv_counts, num_local, group)


@dataclass
class Exchange:
    """One halo exchange: its direction, rows and bytes, and its time (read :meth:`elapsed_ms`
    after the device finished, e.g. after ``torch.cuda.synchronize()``)."""

    direction: str  #: ``"forward"`` (features) or ``"backward"`` (gradients)
    rows_sent: int
    rows_received: int
    bytes_sent: int
    bytes_received: int
    _start: object = field(repr=False, default=None)
    _end: object = field(repr=False, default=None)

    def elapsed_ms(self) -> float:
        """Milliseconds from the gathering of the rows to send until the received rows were in
        place (on a GPU: CUDA events on the current stream, which waits for NCCL's)."""
        if isinstance(self._start, float):
            return (self._end - self._start) * 1e3
        return self._start.elapsed_time(self._end)


_RECORDERS: List[List[Exchange]] = []


def record_exchanges() -> ContextManager[List[Exchange]]:
    """Collect an :class:`Exchange` for every halo exchange inside the block (forward and
    backward), in order::

        with record_exchanges() as exchanges:
            loss.backward()
        torch.cuda.synchronize()
        total_ms = sum(e.elapsed_ms() for e in exchanges)
    """
    return collecting(_RECORDERS)


def _mark(device: torch.device) -> object:
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _all_to_all(
    rows: Tensor,
    index: Optional[Tensor],
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    group: Optional[ProcessGroup],
    direction: str,
    out: Optional[Tensor] = None,
) -> Tensor:
    """``rows[index]`` (``rows`` itself without an index) sent out in ``send_counts`` pieces; the
    ``recv_counts`` pieces received, in rank order, into ``out`` (a new tensor without it)."""
    start = _mark(rows.device) if _RECORDERS else None
    send = rows if index is None else rows.index_select(0, index)
    if out is None:
        out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    dist.all_to_all_single(
        out, send.contiguous(), output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts), group=group
    )
    if _RECORDERS:
        row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
        record = Exchange(
            direction,
            send.size(0),
            out.size(0),
            send.size(0) * row_bytes,
            out.size(0) * row_bytes,
            start,
            _mark(rows.device),
        )
        for exchanges in _RECORDERS:
            exchanges.append(record)
    return out


def _return_gradients(grad_halo: Tensor, grad_x: Tensor, plan: HaloPlan) -> Tensor:
    """The halo's gradients sent back to their owners (the exchange with its counts swapped), each
    added, in place, to ``grad_x``'s row it came from."""
    back = _all_to_all(grad_halo, None, plan.recv_counts, plan.send_counts, plan.group, "backward")
    return grad_x.index_add_(0, plan.send_index, back)


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan) -> Tensor:
        ctx.plan = plan
        return _all_to_all(x, plan.send_index, plan.send_counts, plan.recv_counts, plan.group, "forward")

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
        plan: HaloPlan = ctx.plan
        return _return_gradients(grad, grad.new_zeros((plan.num_local, *grad.shape[1:])), plan), None


def _local_then_halo(x: Tensor, plan: HaloPlan) -> Tensor:
    """``x`` then its halo, received into the same buffer (no concatenation copies the halo)."""
    out = x.new_empty((plan.num_local + plan.num_recv, *x.shape[1:]))
    out[: plan.num_local].copy_(x)
    _all_to_all(x, plan.send_index, plan.send_counts, plan.recv_counts, plan.group, "forward", out[plan.num_local :])
    return out


class _WithHalo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan) -> Tensor:
        ctx.plan = plan
        return _local_then_halo(x, plan)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
        plan: HaloPlan = ctx.plan
        grad_x = grad[: plan.num_local].clone(memory_format=torch.contiguous_format)
        return _return_gradients(grad[plan.num_local :], grad_x, plan), None


def _check_exchange(x: object, plan: object) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(plan, HaloPlan):
        raise TypeError(f"plan: expected a HaloPlan, got {type(plan).__name__}")
    if x.dim() == 0:
        raise ValueError("x: expected one row per local vertex, got a 0-d tensor")
    if x.size(0) != plan.num_local:
        raise ValueError(f"x: expected {plan.num_local} rows (one per local vertex), got {x.size(0)}")
    if plan.world_size > 1 and plan.send_index.device != x.device:
        raise ValueError(f"x: on {x.device}, but the plan's indices are on {plan.send_index.device}")


def halo_exchange(x: Tensor, plan: HaloPlan) -> Tensor:
    r"""The halo rows of ``x``: the rows of remote vertices this rank's edges read.

    A collective: every rank of ``plan.group`` calls it with its own local rows (and, when a
    gradient is needed, takes part in the backward exchange). Differentiable: the gradient of
    a halo row is sent back to its owner and added to the row it came from.

    Args:
        x (Tensor): ``[num_local, *F]`` rows of this rank's vertices.
        plan (HaloPlan): the graph's plan (:attr:`DistributedGraph.plan`).

    Returns:
        ``[num_halo, *F]``, the halo rows in the order of :attr:`DistributedGraph.halo_nodes`.
    """
    _check_exchange(x, plan)
    if plan.world_size == 1:
        return x.new_empty((0, *x.shape[1:]))
    if x.requires_grad and torch.is_grad_enabled():
        return _HaloExchange.apply(x, plan)
    return _all_to_all(x, plan.send_index, plan.send_counts, plan.recv_counts, plan.group, "forward")


def with_halo(x: Tensor, plan: HaloPlan) -> Tensor:
    """``[num_local + num_halo, *F]``: the local rows, then the halo rows (the source rows of a
    :class:`DistributedGraph`'s local graph); ``x`` itself on a single rank. A collective and
    differentiable, as :func:`halo_exchange`."""
    _check_exchange(x, plan)
    if plan.world_size == 1:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _WithHalo.apply(x, plan)
    return _local_then_halo(x, plan)
