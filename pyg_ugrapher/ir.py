r"""The unified IR of graph operators.

Every graph operator of a GNN is one nested loop over the edges :math:`(u, e, v)`:

.. math::
    \mathrm{out}[v] = \bigoplus_{(u, e, v) \in E} \phi(a[\cdot], b[\cdot])
    \qquad\text{or}\qquad
    \mathrm{out}[e] = \phi(a[\cdot], b[\cdot])

where :math:`\phi` is the *edge op* (``mul``, ``add``, ``dot``, ... or an expression traced from a
PyG ``message()``), :math:`\bigoplus` the *gather op* (``sum``, ``mean``, ``max``, ``min``, or
``None`` for message creation) and each operand is read at the source vertex ``u``, the
destination vertex ``v`` or the edge ``e``.

An :class:`OpInfo` says *what* is computed and nothing else: no shapes, no graph, no schedule.
Edge ops are data: every edge op, built-in or traced, is an :class:`Expr` tree over the operand
slots, plus an optional reduction over the last feature dimension (``dot``). The code generator,
the reference executor and the backward pass all read that tree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Optional, Sequence, Tuple, Union

OPERAND_KINDS = ("src_v", "dst_v", "edge")
OUTPUT_KINDS = ("dst_v", "edge")
GATHER_OPS = ("sum", "mean", "max", "min")
EDGE_OPS = ("copy_lhs", "copy_rhs", "add", "sub", "mul", "div", "dot")

#: DGL's single-letter targets.
TARGET_TO_KIND = {"u": "src_v", "v": "dst_v", "e": "edge"}
KIND_TO_TARGET = {kind: letter for letter, kind in TARGET_TO_KIND.items()}

#: Expression functions and their arity. Comparisons (``eq``, ``gt``, ``ge``) return 1.0 / 0.0 so
#: that masks are arithmetic (the backward of max/min and of relu multiplies by them);
#: ``where(c, a, b)`` is ``a`` where ``c`` is not 0 and ``b`` elsewhere. ``gelu`` is the exact
#: (erf) form, ``gelu_tanh`` torch's ``approximate="tanh"`` one; ``softplus`` has torch's defaults
#: (``beta=1``, linear above ``threshold=20``).
UNARY_FNS = (
    "neg",
    "exp",
    "log",
    "relu",
    "sigmoid",
    "tanh",
    "abs",
    "sqrt",
    "square",
    "reciprocal",
    "erf",
    "sin",
    "cos",
    "silu",
    "gelu",
    "gelu_tanh",
    "softplus",
)
BINARY_FNS = (
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "eq",
    "gt",
    "ge",
    "leaky_relu",
    "elu",
    "clamp_min",
    "clamp_max",
)
TERNARY_FNS = ("where",)
#: Binary functions whose second argument is a constant parameter: the negative slope of
#: ``leaky_relu``, ``alpha`` of ``elu``, the bound of ``clamp_min`` / ``clamp_max``.
PARAMETRIZED_FNS = ("leaky_relu", "elu", "clamp_min", "clamp_max")
_LEAVES = ("input", "const")

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


@dataclass(frozen=True)
class Expr:
    """A node of an elementwise expression over the operands of one edge.

    ``Expr.input(i)`` is operand slot ``i``; ``Expr.const(c)`` a scalar constant; other nodes apply
    one of :data:`UNARY_FNS` / :data:`BINARY_FNS` / :data:`TERNARY_FNS` to their ``args``; the second
    argument of a :data:`PARAMETRIZED_FNS` function is its constant parameter. Expressions are
    hashable and compare structurally, so they key kernel caches.
    """

    fn: str
    args: Tuple["Expr", ...] = ()
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.fn in UNARY_FNS:
            arity = 1
        elif self.fn in BINARY_FNS:
            arity = 2
        elif self.fn in TERNARY_FNS:
            arity = 3
        elif self.fn in _LEAVES:
            arity = 0
        else:
            raise ValueError(
                f"Expr.fn: unknown function {self.fn!r}; expected one of "
                f"{_LEAVES + UNARY_FNS + BINARY_FNS + TERNARY_FNS}"
            )
        if len(self.args) != arity:
            raise ValueError(f"Expr.args: {self.fn!r} takes {arity} arguments, got {len(self.args)}")
        if self.fn == "input" and (self.value != int(self.value) or self.value < 0):
            raise ValueError(f"Expr.value: an input index must be a non-negative integer, got {self.value}")
        if self.fn in PARAMETRIZED_FNS and self.args[1].fn != "const":
            raise ValueError(f"Expr.args: the second argument of {self.fn} (its parameter) must be a constant")

    def __hash__(self) -> int:
        # Expressions key the kernel and schedule caches that every operator call looks up: a
        # tree's structural hash is computed once, not once per node per lookup.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.fn, self.args, self.value))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        # String hashes differ between processes: a pickled tree computes its hash again.
        return {key: value for key, value in self.__dict__.items() if key != "_hash"}

    def __setstate__(self, state: dict) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def input(index: int) -> "Expr":
        return Expr("input", (), float(index))

    @staticmethod
    def const(value: float) -> "Expr":
        return Expr("const", (), float(value))

    @staticmethod
    def apply(fn: str, *args: "ExprLike") -> "Expr":
        """``fn(*args)`` with constants folded and neutral elements dropped."""
        nodes = tuple(_as_expr(a) for a in args)
        return _simplify(Expr(fn, nodes))

    def __add__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("add", self, other)

    def __radd__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("add", other, self)

    def __sub__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("sub", self, other)

    def __rsub__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("sub", other, self)

    def __mul__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("mul", self, other)

    def __rmul__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("mul", other, self)

    def __truediv__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("div", self, other)

    def __rtruediv__(self, other: "ExprLike") -> "Expr":
        return Expr.apply("div", other, self)

    def __neg__(self) -> "Expr":
        return Expr.apply("neg", self)

    # -- inspection --------------------------------------------------------------------------
    @property
    def index(self) -> int:
        """The operand slot of an ``input`` node."""
        if self.fn != "input":
            raise ValueError(f"Expr.index: only input nodes have an index, this is {self.fn!r}")
        return int(self.value)

    def walk(self) -> Iterator["Expr"]:
        yield self
        for arg in self.args:
            yield from arg.walk()

    def inputs(self) -> Tuple[int, ...]:
        """Sorted operand slots the expression reads."""
        return tuple(sorted({node.index for node in self.walk() if node.fn == "input"}))

    def remap(self, mapping: dict) -> "Expr":
        """Renumber input slots: ``input(i)`` becomes ``input(mapping[i])``."""
        if self.fn == "input":
            return Expr.input(mapping[self.index])
        if not self.args:
            return self
        return Expr(self.fn, tuple(arg.remap(mapping) for arg in self.args), self.value)

    # -- calculus ----------------------------------------------------------------------------
    def grad(self, index: int) -> "Expr":
        """Symbolic derivative with respect to operand slot ``index``.

        At kinks the derivative is torch's: ``relu``'s is 0 at 0, ``clamp_min`` / ``clamp_max``'s 1 at
        the bound, ``elu``'s ``alpha`` at 0 (and 1 for NaN), ``softplus``'s the sigmoid up to its
        threshold. ``where`` differentiates the branch it picks only: an unpicked branch that is
        not finite there does not make the derivative NaN.
        """
        fn, args = self.fn, self.args
        if fn == "input":
            return Expr.const(1.0 if self.index == index else 0.0)
        if fn == "const":
            return Expr.const(0.0)
        if fn in UNARY_FNS:
            (x,) = args
            outer = {
                "neg": lambda: Expr.const(-1.0),
                "exp": lambda: self,
                "log": lambda: 1.0 / x,
                "relu": lambda: Expr.apply("gt", x, 0.0),
                "sigmoid": lambda: self * (1.0 - self),
                "tanh": lambda: 1.0 - Expr.apply("square", self),
                "abs": lambda: 2.0 * Expr.apply("gt", x, 0.0) - 1.0 + Expr.apply("eq", x, 0.0),
                "sqrt": lambda: 0.5 / self,
                "square": lambda: 2.0 * x,
                "reciprocal": lambda: -Expr.apply("square", self),
                "erf": lambda: (2.0 / math.sqrt(math.pi)) * Expr.apply("exp", -Expr.apply("square", x)),
                "sin": lambda: Expr.apply("cos", x),
                "cos": lambda: -Expr.apply("sin", x),
                "silu": lambda: _silu_derivative(x),
                "gelu": lambda: _gelu_derivative(x),
                "gelu_tanh": lambda: _gelu_tanh_derivative(x),
                "softplus": lambda: Expr.apply(
                    "where", Expr.apply("gt", x, SOFTPLUS_THRESHOLD), 1.0, Expr.apply("sigmoid", x)
                ),
            }[fn]
            inner = x.grad(index)
            return Expr.const(0.0) if _is_const(inner, 0.0) else outer() * inner
        if fn == "where":
            condition, a, b = args
            return Expr.apply("where", condition, a.grad(index), b.grad(index))
        a, b = args
        da, db = a.grad(index), b.grad(index)
        if fn == "add":
            return da + db
        if fn == "sub":
            return da - db
        if fn == "mul":
            return da * b + a * db
        if fn == "div":
            return da / b - a * db / Expr.apply("square", b)
        if fn in ("maximum", "minimum"):
            # Ties split evenly, as torch.maximum / torch.minimum do.
            wins = Expr.apply("gt", a, b) if fn == "maximum" else Expr.apply("gt", b, a)
            share = wins + 0.5 * Expr.apply("eq", a, b)
            return share * da + (1.0 - share) * db
        if fn in ("eq", "gt", "ge"):
            return Expr.const(0.0)
        parameter = b.value
        if fn == "leaky_relu":
            return (parameter + (1.0 - parameter) * Expr.apply("gt", a, 0.0)) * da
        if fn == "elu":
            return Expr.apply("where", Expr.apply("ge", 0.0, a), parameter * Expr.apply("exp", a), 1.0) * da
        inside = Expr.apply("ge", a, b) if fn == "clamp_min" else Expr.apply("ge", b, a)
        return inside * da

    # -- display -----------------------------------------------------------------------------
    def render(self, names: Sequence[str]) -> str:
        """Infix text with operand slot ``i`` shown as ``names[i]``."""
        if self.fn == "input":
            return names[self.index]
        if self.fn == "const":
            return _format_number(self.value)
        if self.fn in _INFIX:
            a, b = (arg.render(names) for arg in self.args)
            return f"({a} {_INFIX[self.fn]} {b})"
        if self.fn == "neg":
            return f"-{self.args[0].render(names)}"
        return f"{self.fn}({', '.join(arg.render(names) for arg in self.args)})"

    def serialize(self) -> str:
        """Prefix form that :func:`parse_expr` reads back, e.g. ``(mul $0 (exp $1))``."""
        if self.fn == "input":
            return f"${self.index}"
        if self.fn == "const":
            return repr(self.value)
        return "(" + " ".join([self.fn] + [arg.serialize() for arg in self.args]) + ")"

    def __repr__(self) -> str:
        return f"Expr[{self.render([f'${i}' for i in range(max(self.inputs(), default=-1) + 1)])}]"


ExprLike = Union[Expr, float, int]


def _as_expr(value: ExprLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Expr.const(float(value))
    raise TypeError(f"expected an Expr or a number, got {type(value).__name__}")


def _is_const(node: Expr, value: Optional[float] = None) -> bool:
    return node.fn == "const" and (value is None or node.value == value)


_SQRT1_2 = math.sqrt(0.5)
_GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715
#: ``softplus`` is the identity above this (torch's default threshold).
SOFTPLUS_THRESHOLD = 20.0


def _silu_derivative(x: Expr) -> Expr:
    s = Expr.apply("sigmoid", x)
    return s * (1.0 + x * (1.0 - s))


def _gelu_derivative(x: Expr) -> Expr:
    cdf = 0.5 * (1.0 + Expr.apply("erf", _SQRT1_2 * x))
    pdf = (1.0 / math.sqrt(2.0 * math.pi)) * Expr.apply("exp", -0.5 * Expr.apply("square", x))
    return cdf + x * pdf


def _gelu_tanh_derivative(x: Expr) -> Expr:
    t = Expr.apply("tanh", _GELU_TANH_SCALE * (x + _GELU_TANH_CUBIC * Expr.apply("square", x) * x))
    slope = _GELU_TANH_SCALE * (1.0 + 3.0 * _GELU_TANH_CUBIC * Expr.apply("square", x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - Expr.apply("square", t)) * slope


def _gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x * _SQRT1_2))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(_GELU_TANH_SCALE * (x + _GELU_TANH_CUBIC * x * x * x)))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


_FOLD = {
    "neg": lambda x: -x,
    "exp": math.exp,
    "log": math.log,
    "relu": lambda x: max(x, 0.0),
    "sigmoid": _sigmoid,
    "tanh": math.tanh,
    "abs": abs,
    "sqrt": math.sqrt,
    "square": lambda x: x * x,
    "reciprocal": lambda x: 1.0 / x,
    "erf": math.erf,
    "sin": math.sin,
    "cos": math.cos,
    "silu": lambda x: x * _sigmoid(x),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "softplus": lambda x: x if x > SOFTPLUS_THRESHOLD else math.log1p(math.exp(x)),
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": max,
    "minimum": min,
    "eq": lambda a, b: float(a == b),
    "gt": lambda a, b: float(a > b),
    "ge": lambda a, b: float(a >= b),
    "leaky_relu": lambda a, s: a if a >= 0 else a * s,
    "elu": lambda a, alpha: a if a > 0 else alpha * math.expm1(a),
    "clamp_min": lambda a, bound: bound if a < bound else a,
    "clamp_max": lambda a, bound: bound if a > bound else a,
    "where": lambda c, a, b: a if c != 0 else b,
}


def _simplify(node: Expr) -> Expr:
    """Fold constants and drop neutral elements so derivatives stay small."""
    fn, args = node.fn, node.args
    if args and all(_is_const(a) for a in args):
        return Expr.const(_FOLD[fn](*(a.value for a in args)))
    if fn == "mul":
        a, b = args
        if _is_const(a, 0.0) or _is_const(b, 0.0):
            return Expr.const(0.0)
        if _is_const(a, 1.0):
            return b
        if _is_const(b, 1.0):
            return a
        if _is_const(a, -1.0) or _is_const(b, -1.0):
            return _simplify(Expr("neg", (b if _is_const(a) else a,)))
        for x, y in ((a, b), (b, a)):
            if y.fn == "div" and _is_const(y.args[0], 1.0):
                return Expr("div", (x, y.args[1]))
    if fn == "add":
        a, b = args
        if _is_const(a, 0.0):
            return b
        if _is_const(b, 0.0):
            return a
    if fn == "sub":
        a, b = args
        if _is_const(b, 0.0):
            return a
        if _is_const(a, 0.0):
            return _simplify(Expr("neg", (b,)))
    if fn == "div" and _is_const(args[1], 1.0):
        return args[0]
    if fn == "div" and _is_const(args[0], 0.0):
        return args[0]
    if fn == "neg" and args[0].fn == "neg":
        return args[0].args[0]
    if fn == "where" and (_is_const(args[0]) or args[1] == args[2]):
        return args[2] if _is_const(args[0], 0.0) else args[1]
    return node


def _format_number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


@lru_cache(maxsize=1024)
def parse_expr(text: str) -> Expr:
    """Read the prefix form written by :meth:`Expr.serialize` (once per text: a compiled model's
    constants name their expressions as text, read at every call)."""
    tokens = tuple(re.findall(r"\(|\)|[^\s()]+", text))
    result, position = _read_expr(tokens, 0, text)
    if position != len(tokens):
        raise ValueError(f"expr: trailing text in {text!r}")
    return result


def _read_expr(tokens: Tuple[str, ...], position: int, text: str) -> Tuple[Expr, int]:
    """The expression starting at ``tokens[position]`` and the position after it."""
    if position >= len(tokens):
        raise ValueError(f"expr: unexpected end of {text!r}")
    token = tokens[position]
    position += 1
    if token == "(":
        if position >= len(tokens):
            raise ValueError(f"expr: unclosed parenthesis in {text!r}")
        fn = tokens[position]
        position += 1
        args = []
        while position < len(tokens) and tokens[position] != ")":
            arg, position = _read_expr(tokens, position, text)
            args.append(arg)
        if position >= len(tokens):
            raise ValueError(f"expr: unclosed parenthesis in {text!r}")
        return Expr(fn, tuple(args)), position + 1
    if token.startswith("$"):
        return Expr.input(int(token[1:])), position
    try:
        return Expr.const(float(token)), position
    except ValueError:
        raise ValueError(f"expr: cannot read token {token!r} of {text!r}") from None


def _builtin_expr(edge_op: str) -> Tuple[Expr, bool]:
    """The expression and feature reduction of a named edge op, over slots 0 (lhs) and 1 (rhs)."""
    a, b = Expr.input(0), Expr.input(1)
    if edge_op in ("copy_lhs", "copy_rhs"):
        return a, False
    if edge_op == "dot":
        return Expr("mul", (a, b)), True
    return Expr(edge_op, (a, b)), False


@dataclass(frozen=True)
class OpInfo:
    r"""What one graph operator computes.

    Args:
        edge_op: one of :data:`EDGE_OPS`, or an :class:`Expr` over operand slots (traced from a
            ``message()``); an expression's operand kinds are given by ``operands``.
        gather_op: one of :data:`GATHER_OPS`, or ``None`` for message creation (output on edges).
        lhs: kind of the left operand (``"src_v"``, ``"dst_v"``, ``"edge"`` or ``None``).
        rhs: kind of the right operand.
        out: ``"dst_v"`` or ``"edge"``; inferred from ``gather_op`` when omitted.
        operands: for an :class:`Expr` edge op, the kind of each operand slot in order.
        reduce: for an :class:`Expr` edge op, sum the expression over the last feature dimension
            (what ``dot`` does for ``mul``). Only for message creation.

    Example::

        >>> OpInfo.from_name("u_mul_e_sum")
        OpInfo u_mul_e_sum
          for each edge (u, e, v):
              out[v] = sum(out[v], (lhs[u] * rhs[e]))
    """

    edge_op: Union[str, Expr]
    gather_op: Optional[str] = None
    lhs: Optional[str] = None
    rhs: Optional[str] = None
    out: Optional[str] = None
    operands: Tuple[str, ...] = ()
    reduce: bool = False
    _expr: Expr = field(init=False, repr=False, compare=False, hash=False)
    _reduce: bool = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.gather_op is not None and self.gather_op not in GATHER_OPS:
            raise ValueError(f"gather_op: unknown gather op {self.gather_op!r}; expected one of {GATHER_OPS + (None,)}")
        for name in ("lhs", "rhs"):
            kind = getattr(self, name)
            if kind is not None and kind not in OPERAND_KINDS:
                raise ValueError(f"{name}: unknown operand kind {kind!r}; expected one of {OPERAND_KINDS + (None,)}")
        inferred = "dst_v" if self.gather_op is not None else "edge"
        if self.out is None:
            object.__setattr__(self, "out", inferred)
        elif self.out not in OUTPUT_KINDS:
            raise ValueError(f"out: unknown output kind {self.out!r}; expected one of {OUTPUT_KINDS}")
        elif self.out != inferred:
            reason = (
                "a gather op reduces over edges into vertices"
                if self.gather_op
                else "without a gather op there is one output per edge"
            )
            raise ValueError(
                f"out: {self.out!r} does not fit gather_op={self.gather_op!r} ({reason}); use out={inferred!r}"
            )
        if isinstance(self.edge_op, Expr):
            self._init_expr()
        elif self.edge_op in EDGE_OPS:
            self._init_builtin()
        else:
            raise ValueError(f"edge_op: unknown edge op {self.edge_op!r}; expected one of {EDGE_OPS} or an Expr")
        if self._reduce and self.gather_op is not None:
            raise ValueError(
                f"gather_op: {self.edge_op if isinstance(self.edge_op, str) else 'a reducing'}"
                f" edge op creates messages only (as in DGL); use gather_op=None"
            )

    def _init_builtin(self) -> None:
        edge_op, lhs, rhs = self.edge_op, self.lhs, self.rhs
        if self.operands or self.reduce:
            raise ValueError(
                "operands: `operands` and `reduce` are only for Expr edge ops; built-in ops take `lhs` and `rhs`"
            )
        if edge_op == "copy_lhs":
            if lhs is None:
                raise ValueError("lhs: copy_lhs needs an lhs operand kind")
            if rhs is not None:
                raise ValueError("rhs: copy_lhs reads no rhs; leave rhs=None")
        elif edge_op == "copy_rhs":
            if rhs is None:
                raise ValueError("rhs: copy_rhs needs an rhs operand kind")
            if lhs is not None:
                raise ValueError("lhs: copy_rhs reads no lhs; leave lhs=None")
        else:
            for name, kind in (("lhs", lhs), ("rhs", rhs)):
                if kind is None:
                    raise ValueError(f"{name}: the binary edge op {edge_op!r} needs an {name} operand kind")
        expr, reduce = _builtin_expr(edge_op)
        object.__setattr__(self, "_expr", expr)
        object.__setattr__(self, "_reduce", reduce)

    def _init_expr(self) -> None:
        if self.lhs is not None or self.rhs is not None:
            raise ValueError("lhs: an Expr edge op names its operand kinds in `operands`, not lhs/rhs")
        operands = tuple(self.operands)
        object.__setattr__(self, "operands", operands)
        for kind in operands:
            if kind not in OPERAND_KINDS:
                raise ValueError(f"operands: unknown operand kind {kind!r}; expected one of {OPERAND_KINDS}")
        used = self.edge_op.inputs()
        if used != tuple(range(len(operands))):
            raise ValueError(
                f"operands: the expression reads slots {used} but {len(operands)} operand "
                f"kinds were given; every slot 0..n-1 must be read exactly by index"
            )
        object.__setattr__(self, "_expr", self.edge_op)
        object.__setattr__(self, "_reduce", bool(self.reduce))

    # -- derived fields ----------------------------------------------------------------------
    @property
    def expr(self) -> Expr:
        """The edge function over operand slots ``0 .. len(inputs) - 1``."""
        return self._expr

    @property
    def reduces(self) -> bool:
        """Whether messages are summed over the last feature dimension (``dot``)."""
        return self._reduce

    @property
    def inputs(self) -> Tuple[str, ...]:
        """Kind of each operand slot, in slot order."""
        if isinstance(self.edge_op, Expr):
            return self.operands
        return tuple(kind for kind in (self.lhs, self.rhs) if kind is not None)

    @property
    def is_builtin(self) -> bool:
        return isinstance(self.edge_op, str)

    @property
    def name(self) -> str:
        """DGL-style name for built-in ops (``u_mul_e_sum``), a readable expression otherwise."""
        suffix = f"_{self.gather_op}" if self.gather_op else ""
        if self.is_builtin:
            if self.edge_op == "copy_lhs":
                body = f"copy_{KIND_TO_TARGET[self.lhs]}"
            elif self.edge_op == "copy_rhs":
                body = f"copy_{KIND_TO_TARGET[self.rhs]}"
            else:
                body = f"{KIND_TO_TARGET[self.lhs]}_{self.edge_op}_{KIND_TO_TARGET[self.rhs]}"
            return body + suffix
        body = self.expr.render(self._slot_names())
        return f"{'sum_last(' + body + ')' if self.reduces else body}{suffix}"

    def _slot_names(self) -> list:
        return [f"{KIND_TO_TARGET[kind]}{i}" for i, kind in enumerate(self.inputs)]

    # -- (de)serialisation, so an op can cross torch.library custom-op boundaries as a string --
    def serialize(self) -> str:
        if self.is_builtin:
            return self.name
        gather = self.gather_op or "none"
        return f"expr|{self.expr.serialize()}|{','.join(self.operands)}|{gather}|{int(self.reduces)}"

    @staticmethod
    def deserialize(text: str) -> "OpInfo":
        if not text.startswith("expr|"):
            return OpInfo.from_name(text)
        _, body, kinds, gather, reduce = text.split("|")
        return OpInfo(
            parse_expr(body),
            None if gather == "none" else gather,
            operands=tuple(k for k in kinds.split(",") if k),
            reduce=bool(int(reduce)),
        )

    @staticmethod
    def from_name(name: str) -> "OpInfo":
        """Parse a DGL-style name: ``copy_u_sum``, ``u_mul_e_sum``, ``u_dot_v``, ``e_div_v``, ...

        Grammar: ``copy_<t>[_<gather>]`` or ``<t>_<op>_<t>[_<gather>]`` with targets ``u`` (source
        vertex), ``v`` (destination vertex), ``e`` (edge), ``op`` in add/sub/mul/div/dot and gather
        in sum/mean/max/min. Without a gather op the output lives on the edges (DGL's gsddmm).
        """
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        parts = name.split("_")
        gather = None
        if parts[-1] in GATHER_OPS:
            gather = parts.pop()
        targets = "|".join(TARGET_TO_KIND)
        binary = "|".join(op for op in EDGE_OPS if not op.startswith("copy"))
        text = "_".join(parts)
        copy = re.fullmatch(f"copy_({targets})", text)
        if copy:
            return OpInfo("copy_lhs", gather, lhs=TARGET_TO_KIND[copy.group(1)])
        pair = re.fullmatch(f"({targets})_({binary})_({targets})", text)
        if pair:
            lhs, op, rhs = pair.groups()
            return OpInfo(op, gather, lhs=TARGET_TO_KIND[lhs], rhs=TARGET_TO_KIND[rhs])
        raise ValueError(
            f"name: cannot parse {name!r}; expected copy_<t>[_<gather>] or "
            f"<t>_<op>_<t>[_<gather>] with t in u/v/e, op in "
            f"add/sub/mul/div/dot and gather in {'/'.join(GATHER_OPS)}"
        )

    @staticmethod
    def names() -> Iterator[str]:
        """Every name :meth:`from_name` accepts: DGL's gspmm (with a gather op) and gsddmm names."""
        binary = [op for op in EDGE_OPS if not op.startswith("copy")]
        for gather in (None,) + GATHER_OPS:
            suffix = f"_{gather}" if gather else ""
            for target in TARGET_TO_KIND:
                yield f"copy_{target}{suffix}"
            for lhs in TARGET_TO_KIND:
                for rhs in TARGET_TO_KIND:
                    for op in binary:
                        if op != "dot" or gather is None:
                            yield f"{lhs}_{op}_{rhs}{suffix}"

    # -- display -----------------------------------------------------------------------------
    def loop_text(self) -> str:
        """The nested loop this op stands for, as pseudo-code."""
        names = []
        counts = {"src_v": 0, "dst_v": 0, "edge": 0}
        for i, kind in enumerate(self.inputs):
            base = ("lhs", "rhs")[i] if self.is_builtin else f"in{i}"
            names.append(f"{base}[{KIND_TO_TARGET[kind]}]")
            counts[kind] += 1
        message = self.expr.render(names)
        if self.reduces:
            message = f"sum over last dim of {message}"
        if self.gather_op is None:
            body = f"out[e] = {message}"
        elif self.gather_op == "mean":
            body = f"out[v] = sum(out[v], {message}) / in_degree(v)"
        else:
            body = f"out[v] = {self.gather_op}(out[v], {message})"
        return f"for each edge (u, e, v):\n    {body}"

    def __repr__(self) -> str:
        loop = self.loop_text().replace("\n", "\n  ")
        return f"OpInfo {self.name}\n  {loop}"
