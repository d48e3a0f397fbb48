"""Feature layout of an operator: how operand features broadcast to the message.

Operands are ``[rows]``, ``[rows, F]`` or ``[rows, H, C]`` (more generally ``[rows, *feature_shape]``).
Their feature shapes broadcast NumPy-style to the message shape ``S``. Kernels walk the message
features as one flat index ``f`` over ``prod(S)`` and read each operand at an offset that depends
only on how its shape relates to ``S = (..., C)``:

==========  =======================================  ==================
pattern     operand feature shape                    offset of ``f``
==========  =======================================  ==================
``full``    ``S`` itself                             ``f``
``head``    ``S[:-1] + (1,)`` (one value per head)   ``f // C``
``inner``   ``(1, ..., 1, C)`` (shared by heads)     ``f % C``
``scalar``  one value per row                        ``0``
==========  =======================================  ==================

A reducing op (``dot``) sums the message over the last dimension: the output has
``width = prod(S) // C`` features and each output feature ``o`` sums ``f = o * C + r`` for
``r < C``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple

from .ir import OpInfo

PATTERNS = ("full", "head", "inner", "scalar")


@dataclass(frozen=True)
class Layout:
    """Shapes of one operator call, independent of the graph's size."""

    message_shape: Tuple[int, ...]  #: broadcast feature shape ``S`` of one message
    out_shape: Tuple[int, ...]  #: feature shape of one output row
    patterns: Tuple[str, ...]  #: per operand slot, one of :data:`PATTERNS`
    inner: int  #: ``C``: the last dimension of ``S`` (1 when ``S`` is empty)
    reduce_size: int  #: features summed into one output (``C`` for a reducing op, else 1)

    @property
    def width(self) -> int:
        """Output features per row (flat)."""
        return math.prod(self.out_shape)

    @property
    def message_width(self) -> int:
        """Features per message before any reduction."""
        return math.prod(self.message_shape)


def slot_names(op: OpInfo) -> Tuple[str, ...]:
    """How error messages call each operand slot."""
    if op.is_builtin:
        return tuple(name for name, kind in (("lhs", op.lhs), ("rhs", op.rhs)) if kind is not None)
    return tuple(f"operands[{i}]" for i in range(len(op.inputs)))


def infer_layout(op: OpInfo, shapes: Sequence[Sequence[int]]) -> Layout:
    """Broadcast the operands' feature shapes (each ``shape[1:]``) for ``op``.

    Raises ``ValueError`` naming the operand whose shape does not broadcast, or that a reducing
    op would reduce over a broadcast (scalar) dimension.
    """
    names = slot_names(op)
    if len(shapes) != len(names):
        raise ValueError(f"operands: {op.name} reads {len(names)} operands, got {len(shapes)}")
    features = [tuple(int(d) for d in shape[1:]) for shape in shapes]
    try:
        message = _broadcast(features)
    except ValueError:
        described = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes))
        raise ValueError(f"{names[-1]}: operand feature shapes do not broadcast ({described})") from None
    inner = message[-1] if message else 1
    if op.reduces:
        for name, shape, feat in zip(names, shapes, features):
            # A generated op may read operands that are constant along the summed dimension
            # ([.., H, 1] or one value per row): the gradient of an edge operand broadcast per
            # head (GAT's attention [E, H, 1]) reads the other per-head operands (the softmax
            # sum [N, H, 1]). The kernels load them by their pattern, inside the reduction too.
            constant = not op.is_builtin and bool(message) and (not feat or feat[-1] == 1)
            if not constant and (not feat or feat[-1] != inner or (inner == 1 and not message)):
                raise ValueError(
                    f"{name}: {op.name} sums over the last feature dimension, so every "
                    f"operand needs it in full (size {inner}); got shape {list(shape)}"
                )
        out_shape = message[:-1] + (1,)
        reduce_size = inner
    else:
        out_shape = message
        reduce_size = 1
    heads = math.prod(message[:-1]) if message else 1
    patterns = tuple(_pattern(name, feat, message, heads, inner) for name, feat in zip(names, features))
    return Layout(message, out_shape, patterns, inner, reduce_size)


def _broadcast(shapes: Sequence[Tuple[int, ...]]) -> Tuple[int, ...]:
    rank = max([len(s) for s in shapes] + [0])
    result = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ValueError("shapes do not broadcast")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _pattern(name: str, feature: Tuple[int, ...], message: Tuple[int, ...], heads: int, inner: int) -> str:
    size = math.prod(feature)
    total = heads * inner
    padded = (1,) * (len(message) - len(feature)) + feature
    if padded == message:
        return "full"
    if size == 1:
        return "scalar"
    if padded[-1] == 1 and math.prod(padded[:-1]) == heads:
        return "head"
    if padded[-1] == inner and size == inner:
        return "inner"
    raise ValueError(
        f"{name}: feature shape {list(feature)} broadcasts to {list(message)} in a way the "
        f"kernels do not support (only full, per-head, per-channel or scalar operands; "
        f"{total} message features)"
    )
