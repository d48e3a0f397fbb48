"""How an operator is run: the parallel strategy and its knobs, apart from what is computed.

A :class:`ParallelInfo` is a frozen, validated value. Knobs that a strategy does not have are
``None`` (asking for one is an error), so two equal schedules always compare and hash equal, and
the design space is a plain list of them (``triton_kernels.space``).

A schedule may leave knobs of its strategy unset (``None``): it is then *partial*, a constraint
rather than a schedule. ``ParallelInfo("vertex")`` says "vertex-parallel, the knobs chosen for this
graph, operator and width"; ``ParallelInfo("vertex", block_f=32)`` fixes the feature tile too. The
runtime completes a partial schedule per call (``autotune.selection.resolve``: the cost model, or
the heuristic without one, picks the best schedule of the design space that agrees with it);
kernels only ever run complete ones.

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
from typing import Dict, Optional, Tuple

STRATEGIES = ("vertex", "edge", "group")

#: The knobs each strategy reads, in the order they print and serialise.
STRATEGY_KNOBS: Dict[str, Tuple[str, ...]] = {
    "vertex": ("block_v", "block_e", "block_f", "num_warps", "num_stages"),
    "edge": ("block_e", "block_f", "num_warps"),
    "group": ("group_size", "block_v", "block_e", "block_f", "num_warps", "num_stages"),
}

#: Knobs that no selection varies, and their value when unset: the edge loops load through
#: computed indices, which Triton does not software-pipeline, so more stages change nothing
#: (``triton_kernels.space`` holds only 1).
FIXED_KNOBS: Dict[str, int] = {"num_stages": 1}

_LIMITS = {
    "block_v": (1, 256),
    "block_e": (1, 1024),
    "block_f": (1, 1024),
    "group_size": (1, 1 << 20),
    "num_warps": (1, 16),
    "num_stages": (1, 4),
}
_POWER_OF_TWO = ("block_e", "block_f", "num_warps", "block_v")
_MAX_TILE = 1 << 14


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def feature_limit(width: int) -> int:
    """The widest feature tile that serves an operator of ``width`` features: ``width`` rounded up
    to a power of two (past it, lanes of every program would idle)."""
    return max(1, 1 << max(width - 1, 0).bit_length())


@dataclass(frozen=True)
class ParallelInfo:
    """One schedule of one operator: a parallel strategy and its knobs.

    Knobs left ``None`` are chosen per call: the runtime completes the schedule for the graph,
    operator and width at hand (the cost model, or the heuristic without a model, picks the best
    schedule of the design space that keeps the strategy and every knob given); ``None`` for the
    whole ``parallel_info`` lets it choose the strategy too. ``num_stages``, which no selection
    varies, is 1 when unset.

    Knobs are validated on construction: a value outside a knob's range or not a power of two, a
    knob the strategy does not have, a tile over the register budget (``block_v x block_e x
    block_f``, unset knobs counted as 1) or a group smaller than its edge block raises a
    ``ValueError`` that names the knob. A knob valid in itself but too large for one operator is
    narrowed, never rejected: a ``block_f`` wider than the operator's features (rounded up to a
    power of two) runs as that width, with a ``UserWarning`` from :func:`~pyg_ugrapher.compute`
    saying so; the backward's operators, of other widths, leave such a knob to the selection. So
    a strategy alone, and any valid knobs, run at every width.

    Args:
        strategy: ``"vertex"``, ``"edge"`` or ``"group"`` (see the module's table).
        block_f: features per program (the tiling factor).
        block_v: rows (``vertex``) or chunks (``group``) side by side in a program.
        block_e: edges of a row per step (``vertex``, ``group``), or edges per program (``edge``).
        group_size: the most edges of one chunk (``group``).
        num_warps: warps per program.
        num_stages: software-pipelining stages of the edge loop (``vertex``, ``group``).

    Example::

        >>> ParallelInfo("vertex")  # the strategy fixed, the other knobs chosen per call
        ParallelInfo(vertex, block_v=?, block_e=?, block_f=?, num_warps=?, num_stages=1)
        >>> ParallelInfo("vertex", block_f=32).unset_knobs
        ('block_v', 'block_e', 'num_warps')
        >>> ParallelInfo("edge", block_e=128, block_f=32, num_warps=4).is_complete
        True
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
                    raise ValueError(
                        f"{f.name}: not a knob of the {self.strategy!r} strategy (its knobs: {', '.join(knobs)})"
                    )
                continue
            if value is None:
                if f.name in FIXED_KNOBS:
                    object.__setattr__(self, f.name, FIXED_KNOBS[f.name])
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{f.name}: must be an int, got {type(value).__name__}")
            low, high = _LIMITS[f.name]
            if not low <= value <= high:
                raise ValueError(f"{f.name}: must lie in [{low}, {high}], got {value}")
            if f.name in _POWER_OF_TWO and not _is_pow2(value):
                raise ValueError(f"{f.name}: must be a power of two, got {value}")
        rows, edges, features = self.block_v or 1, self.block_e or 1, self.block_f or 1
        if rows * edges * features > _MAX_TILE:
            blamed = next(name for name in ("block_f", "block_e", "block_v") if getattr(self, name) is not None)
            raise ValueError(
                f"{blamed}: a tile of block_v x block_e x block_f = {rows} x {edges} x {features} "
                f"exceeds {_MAX_TILE} elements (registers would spill)"
            )
        if self.strategy == "group" and None not in (self.group_size, self.block_e) and self.group_size < self.block_e:
            raise ValueError(f"group_size: must be at least block_e ({self.block_e}), got {self.group_size}")

    @property
    def knobs(self) -> Dict[str, int]:
        """The knobs this schedule sets and their values (every knob of its strategy once complete)."""
        return {name: getattr(self, name) for name in STRATEGY_KNOBS[self.strategy] if getattr(self, name) is not None}

    @property
    def unset_knobs(self) -> Tuple[str, ...]:
        """The knobs of this strategy left to the selection, in their printed order."""
        return tuple(name for name in STRATEGY_KNOBS[self.strategy] if getattr(self, name) is None)

    @property
    def is_complete(self) -> bool:
        """Whether every knob of the strategy is set: a schedule a kernel can run as it is."""
        return not self.unset_knobs

    def admits(self, other: "ParallelInfo") -> bool:
        """Whether ``other`` keeps this schedule's strategy and every knob it sets (a complete
        schedule admits itself alone)."""
        return other.strategy == self.strategy and all(getattr(other, k) == v for k, v in self.knobs.items())

    def validate_for(self, width: int) -> "ParallelInfo":
        """Check this complete schedule against an operator's output width (every strategy runs
        every operator); a partial one raises, since it has to be resolved first.

        ``width`` is the number of output features per row (for a reducing op such as ``dot``, the
        features summed per output, times the outputs). Returns ``self`` for chaining.
        """
        if not self.is_complete:
            raise ValueError(
                f"parallel_info: {self} leaves {', '.join(self.unset_knobs)} unset; a partial "
                f"schedule runs once resolved for a graph and operator "
                f"(autotune.selection.resolve)"
            )
        limit = feature_limit(width)
        if self.block_f > limit:
            raise ValueError(
                f"block_f: {self.block_f} exceeds the {width} features of this operator "
                f"(at most {limit}); lanes past the last feature would idle"
            )
        return self

    def narrowed_for(self, width: int) -> Tuple["ParallelInfo", Dict[str, int]]:
        """This schedule with the knobs that cannot serve an operator of ``width`` features
        narrowed to ones that can, and the values they had (empty where none changed).

        The one such knob is ``block_f``: past :func:`feature_limit` lanes would idle, so it
        narrows to that limit (a smaller tile, valid wherever the wider one was)."""
        limit = feature_limit(width)
        if self.block_f is None or self.block_f <= limit:
            return self, {}
        return replace(self, block_f=limit), {"block_f": self.block_f}

    def with_knobs(self, **knobs: Optional[int]) -> "ParallelInfo":
        """This schedule with ``knobs`` replaced (``None`` unsets one), validated again."""
        return replace(self, **knobs)

    def serialize(self) -> str:
        """Compact text that :meth:`deserialize` reads back, e.g. ``vertex:block_v=4,...`` (the
        knobs set; ``vertex:`` for the strategy alone)."""
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
        values = (getattr(self, k) for k in STRATEGY_KNOBS[self.strategy])
        knobs = (f"{k}={'?' if v is None else v}" for k, v in zip(STRATEGY_KNOBS[self.strategy], values))
        return f"ParallelInfo({', '.join([self.strategy, *knobs])})"
