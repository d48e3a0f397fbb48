"""How an operator is run: the parallel strategy and its knobs, apart from what is computed.

A :class:`ParallelInfo` is a frozen, validated value. Knobs that a strategy does not have are
``None`` (asking for one is an error), so two equal schedules always compare and hash equal, and
the design space is a plain list of them (``triton_kernels.space``).

=============  ====================================================  ==========================================
strategy       work of one program                                   knobs
=============  ====================================================  ==========================================
``vertex``     ``block_v`` rows side by side, ``block_f`` features,   ``block_v``, ``block_e``, ``block_f``,
               ``block_e`` edges of each row per step; no atomics    ``num_warps``, ``num_stages``
``edge``       ``block_e`` consecutive CSR edges, ``block_f``        ``block_e``, ``block_f``, ``num_warps``
               features; segmented reduce, atomics at run ends
``group``      ``block_v`` chunks of at most ``group_size`` edges     ``group_size``, ``block_v``, ``block_e``,
               side by side; atomics only for rows split in chunks    ``block_f``, ``num_warps``, ``num_stages``
=============  ====================================================  ==========================================

Message creation (no gather op) has the same three strategies with the same knobs: ``edge`` in the
user's edge order, ``vertex`` and ``group`` in CSR order (a destination row is loaded once per row
or chunk); each message is written once, so none needs atomics.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Dict, Optional

STRATEGIES = ("vertex", "edge", "group")

#: The knobs each strategy reads, and their defaults.
STRATEGY_KNOBS: Dict[str, Dict[str, int]] = {
    "vertex": {"block_v": 4, "block_e": 32, "block_f": 64, "num_warps": 4, "num_stages": 1},
    "edge": {"block_e": 64, "block_f": 64, "num_warps": 4},
    "group": {"group_size": 128, "block_v": 4, "block_e": 16, "block_f": 64, "num_warps": 4, "num_stages": 1},
}

_LIMITS = {
    "block_v": (1, 256), "block_e": (1, 1024), "block_f": (1, 1024), "group_size": (1, 1 << 20),
    "num_warps": (1, 16), "num_stages": (1, 4),
}
_POWER_OF_TWO = ("block_e", "block_f", "num_warps", "block_v")
_MAX_TILE = 1 << 14


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class ParallelInfo:
    """One schedule of one operator. Unset knobs take the strategy's defaults.

    Example::

        >>> ParallelInfo("vertex", block_f=32)
        ParallelInfo(vertex, block_v=4, block_e=32, block_f=32, num_warps=4, num_stages=1)
    """

    strategy: str
    block_f: Optional[int] = None
    block_v: Optional[int] = None
    block_e: Optional[int] = None
    group_size: Optional[int] = None
    num_warps: Optional[int] = None
    num_stages: Optional[int] = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: unknown strategy {self.strategy!r}; expected one of {STRATEGIES}")
        knobs = STRATEGY_KNOBS[self.strategy]
        for f in fields(self):
            if f.name == "strategy":
                continue
            value = getattr(self, f.name)
            if f.name not in knobs:
                if value is not None:
                    raise ValueError(f"{f.name}: not a knob of the {self.strategy!r} strategy "
                                     f"(its knobs: {', '.join(knobs)})")
                continue
            if value is None:
                object.__setattr__(self, f.name, knobs[f.name])
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{f.name}: must be an int, got {type(value).__name__}")
            low, high = _LIMITS[f.name]
            if not low <= value <= high:
                raise ValueError(f"{f.name}: must lie in [{low}, {high}], got {value}")
            if f.name in _POWER_OF_TWO and not _is_pow2(value):
                raise ValueError(f"{f.name}: must be a power of two, got {value}")
        rows = self.block_v or 1
        if rows * self.block_e * self.block_f > _MAX_TILE:
            raise ValueError(f"block_f: a tile of block_v x block_e x block_f = {rows} x {self.block_e} x "
                             f"{self.block_f} exceeds {_MAX_TILE} elements (registers would spill)")
        if self.strategy == "group" and self.group_size < self.block_e:
            raise ValueError(f"group_size: must be at least block_e ({self.block_e}), got {self.group_size}")

    @property
    def knobs(self) -> Dict[str, int]:
        """The knobs of this strategy and their values."""
        return {name: getattr(self, name) for name in STRATEGY_KNOBS[self.strategy]}

    def validate_for(self, width: int) -> "ParallelInfo":
        """Check this schedule against an operator's output width (every strategy runs every
        operator).

        ``width`` is the number of output features per row (for a reducing op such as ``dot``, the
        features summed per output, times the outputs). Returns ``self`` for chaining.
        """
        limit = max(1, 1 << max(width - 1, 0).bit_length())
        if self.block_f > limit:
            raise ValueError(f"block_f: {self.block_f} exceeds the {width} features of this operator "
                             f"(at most {limit}); lanes past the last feature would idle")
        return self

    def with_knobs(self, **knobs: int) -> "ParallelInfo":
        return replace(self, **knobs)

    def serialize(self) -> str:
        """Compact text that :meth:`deserialize` reads back, e.g. ``vertex:block_v=4,...``."""
        return self.strategy + ":" + ",".join(f"{k}={v}" for k, v in self.knobs.items())

    @staticmethod
    def deserialize(text: str) -> "ParallelInfo":
        strategy, _, body = text.partition(":")
        knobs = {}
        for item in filter(None, body.split(",")):
            name, _, value = item.partition("=")
            knobs[name] = int(value)
        return ParallelInfo(strategy, **knobs)

    def __repr__(self) -> str:
        return f"ParallelInfo({self.strategy}, " + ", ".join(f"{k}={v}" for k, v in self.knobs.items()) + ")"

