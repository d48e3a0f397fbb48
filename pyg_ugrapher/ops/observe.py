"""Observers of operator calls: :func:`observe` hands each one a :class:`Call` (``ug.plan`` is one).

Observers belong to the thread that registers them: a call made in another thread (another model
running at the same time) is not theirs to see. See ``docs/caches.md`` for every piece of state the
package shares between calls.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from torch import Tensor

from ..graph import GraphTensor
from ..ir import OpInfo
from ..layout import Layout, infer_layout
from ..parallel import ParallelInfo


@dataclass(frozen=True)
class Call:
    """One :func:`~pyg_ugrapher.ops.compute` call, as observers (``ug.plan``) see it."""

    graph: GraphTensor
    op: OpInfo
    operands: Tuple[Tensor, ...]
    layout: Layout
    parallel_info: Optional[ParallelInfo]
    #: The kernel's Triton source where it is not the op's own under ``parallel_info`` (a fused pass).
    source: Optional[str] = None


class _Observers(threading.local):
    """This thread's observers."""

    def __init__(self) -> None:
        self.callbacks: List[Callable[[Call], None]] = []


_OBSERVERS = _Observers()


@contextmanager
def observe(callback: Callable[[Call], None]) -> Iterator[None]:
    """Call ``callback`` with every :func:`~pyg_ugrapher.ops.compute` call made inside the ``with`` block, in this
    thread."""
    callbacks = _OBSERVERS.callbacks
    callbacks.append(callback)
    try:
        yield
    finally:
        callbacks.remove(callback)


def observed() -> bool:
    """Whether :func:`observe` has observers in this thread now (what a call tells them may cost
    host time)."""
    return bool(_OBSERVERS.callbacks)


def notify(
    graph: GraphTensor,
    op: OpInfo,
    tensors: Sequence[Tensor],
    layout: Optional[Layout] = None,
    parallel_info: Optional[ParallelInfo] = None,
    source: Optional[str] = None,
) -> None:
    """Tell the observers of :func:`observe` about one operator call (``compute`` does; so do the
    fused functions that run IR ops themselves)."""
    callbacks = _OBSERVERS.callbacks
    if not callbacks:
        return
    if layout is None:
        layout = infer_layout(op, [t.shape for t in tensors])
    for callback in list(callbacks):
        callback(Call(graph, op, tuple(tensors), layout, parallel_info, source))
