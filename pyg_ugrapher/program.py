r"""A captured ``message()`` as what a propagation runs (:class:`Capture`).

:func:`~pyg_ugrapher.capture.capture` traces ``message()`` into this record: the fused operator
that computes the aggregated messages, how each of its operands is built from an argument of
``message()`` (:class:`Operand`), and the values computed before it into operand arguments of their
own (:data:`Value`): Linear maps of node rows (:class:`Product`), parameters of the module
(:class:`Broadcast`) and tensors computed from them (:class:`Computed`), per-vertex values
(:class:`NodeStep`) and operators run first (:class:`Step`). Every value reads the module's
current weights and the call's tensors, so that one capture serves every call;
:meth:`Capture.operand_tensors` computes them, and :func:`build_value` does the same from the
plain constants a compiled model holds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .ir import Expr, OpInfo, parse_expr
from .reference import evaluate

Shape = Tuple[int, ...]
#: A selection of features, per dimension: ``(start, stop, step)`` of a slice, or an int (the
#: dimension is dropped).
FeatureIndex = Tuple[Any, ...]


@dataclass(frozen=True)
class Operand:
    """How one operand slot of a captured op is built from an argument of ``message()``.

    The argument's rows are kept; its features are viewed as ``view`` and the features ``index``
    selects are taken (where ``message()`` indexed them), then reshaped to ``shape`` (the views
    ``message()`` applied; with ``transposed``, to ``shape`` with its last two dimensions swapped,
    which are then transposed: a matmul's right operand, a sum over the next-to-last dimension)
    and, where the kernels cannot broadcast them as they are, expanded to ``expand``.
    """

    argument: str  #: the ``message()`` parameter it comes from (``x_j``, ``edge_weight``...)
    kind: str  #: ``"src_v"``, ``"dst_v"`` or ``"edge"``
    shape: Shape  #: feature shape after ``message()``'s views
    expand: Optional[Shape] = None  #: broadcast feature shape (a stride-0 view), if needed
    view: Optional[Shape] = None  #: feature shape the features are selected from, with ``index``
    index: Optional[FeatureIndex] = None  #: the features selected, per dimension of ``view``
    transposed: bool = False  #: whether its last two feature dimensions are transposed (a copy)

    @property
    def features(self) -> Shape:
        """The feature shape the operator reads."""
        return self.shape if self.expand is None else self.expand

    def build(self, tensor: Tensor) -> Tensor:
        """The operand from the real tensor (node features for vertex kinds, per-edge values for edges)."""
        return build_operand(tensor, self.shape, self.expand, self.view, self.index, self.transposed)

    def recipe(self) -> Tuple[Any, ...]:
        """``(argument, shape, expand, view, index, transposed)``: what a compiled model holds."""
        return (self.argument, self.shape, self.expand, self.view, self.index, self.transposed)


def swapped(shape: Shape) -> Shape:
    """``shape`` with its last two dimensions swapped."""
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def build_operand(
    tensor: Tensor,
    shape: Shape,
    expand: Optional[Shape] = None,
    view: Optional[Shape] = None,
    index: Optional[FeatureIndex] = None,
    transposed: bool = False,
) -> Tensor:
    """:meth:`Operand.build` from the operand's fields (a compiled model holds them as constants)."""
    rows = tensor.shape[0]
    built = swapped(shape) if transposed else shape
    if index is None:
        out = tensor.reshape((rows,) + built)
    else:
        selection = (slice(None),) + tuple(slice(*entry) if isinstance(entry, tuple) else entry for entry in index)
        # A copy of the selected features, whole rows of them, as the kernels read operands.
        out = tensor.reshape((rows,) + view)[selection].contiguous().reshape((rows,) + built)
    if transposed:
        out = out.transpose(-1, -2).contiguous()
    return out if expand is None else out.expand((rows,) + expand)


@dataclass(frozen=True)
class Product:
    r"""A Linear of operand rows, computed before the kernel from the module's current weights.

    ``F.linear`` of a linear combination of arguments (or of a ``torch.cat`` of such pieces) is
    split by linearity: :math:`W [\mathbf{x}_i \| \mathbf{x}_j - \mathbf{x}_i] = (W_1 - W_2)
    \mathbf{x}_i + W_2 \mathbf{x}_j`. Each term multiplies the rows of one operand (``N`` node rows,
    not ``E`` per-edge ones) and becomes an operand of the fused kernel itself, named ``name``.
    The weights are read from ``module`` by their attribute paths at every call, so training
    updates reach the capture.
    """

    name: str  #: the operand argument it fills
    source: Operand  #: the rows it multiplies: an argument of ``message()``, or an earlier product
    weight: str  #: attribute path of the weight in the module (``lin.weight``)
    weight_shape: Shape  #: the weight's shape when traced; another shape traces ``message()`` again
    dtype: torch.dtype  #: the weight's dtype when traced
    #: the weight's column blocks applied to ``source``: ``(start, stop, coefficient)`` each
    columns: Tuple[Tuple[int, int, float], ...]
    bias: Optional[str] = None  #: attribute path of the bias added to this term, if any

    def build(self, tensors: Mapping[str, Tensor], module: torch.nn.Module, run: "OpRunner", num_edges: int) -> Tensor:
        """The product's rows, from the real ``tensors`` (arguments and earlier values)."""
        return build_value(self.constants(), tensors, module, run, num_edges)

    def constants(self) -> Tuple[Any, ...]:
        """The product as plain constants, for :func:`build_value`."""
        source = self.source
        fields = (source.argument, source.shape, source.view, source.index, self.weight, self.columns, self.bias)
        return ("product", self.name) + fields + (self.dtype,)

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether the module's weight still has the traced shape and dtype."""
        return _has_shape(module, self.weight, self.weight_shape, self.dtype)


@dataclass(frozen=True)
class Broadcast:
    """A parameter or buffer of the module that ``message()`` combines with per-edge values
    (``self.beta * alpha``, a temperature): an edge operand read through a stride-0 view of the
    module's current value at every call."""

    name: str  #: the operand argument it fills
    path: str  #: its attribute path in the module
    shape: Shape  #: its shape when traced; another shape traces ``message()`` again
    dtype: torch.dtype  #: its dtype when traced
    features: Shape  #: the operand's feature shape: ``shape`` with leading 1s to the message's rank

    def build(self, tensors: Mapping[str, Tensor], module: torch.nn.Module, run: "OpRunner", num_edges: int) -> Tensor:
        """The parameter, viewed with a row per edge."""
        return build_value(self.constants(), tensors, module, run, num_edges)

    def constants(self) -> Tuple[Any, ...]:
        """The broadcast as plain constants, for :func:`build_value`."""
        return ("broadcast", self.name, self.path, self.features)

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether the module's tensor still has the traced shape and dtype."""
        return _has_shape(module, self.path, self.shape, self.dtype)


#: An argument of a replayed torch call (:class:`Computed`), tagged: ``("tensor", path)`` a tensor
#: of the module, ``("result", k)`` the result of call ``k``, ``("list", items)`` / ``("tuple",
#: items)`` a sequence of tagged items, ``("slice", (start, stop, step))``, ``("value", v)`` a constant.
TaggedArgument = Tuple[str, Any]
#: One torch call: ``(name, args, kwargs)``, the function by its torch name (``torch.Tensor.pow``),
#: ``args`` a tuple and ``kwargs`` a tuple of ``(keyword, argument)``, all tagged.
Call = Tuple[str, Tuple[TaggedArgument, ...], Tuple[Tuple[str, TaggedArgument], ...]]


@dataclass(frozen=True)
class Computed:
    """A tensor that ``message()`` computes from parameters and buffers of the module alone, then
    combines with per-edge values (GMMConv's ``EPS + self.sigma.view(1, K, D).pow(2)``): an edge
    operand read through a stride-0 view, as a :class:`Broadcast`, computed at every call by
    replaying the torch calls that made it on the module's current tensors, so that training
    updates reach it and gradients reach the parameters."""

    name: str  #: the operand argument it fills
    calls: Tuple[Call, ...]  #: the calls that make it, the last one its value
    #: the module tensors the calls read: ``(path, shape, dtype)`` when traced; another shape or
    #: dtype traces ``message()`` again
    reads: Tuple[Tuple[str, Shape, torch.dtype], ...]
    features: Shape  #: the operand's feature shape: its shape with leading 1s to the message's rank

    def build(self, tensors: Mapping[str, Tensor], module: torch.nn.Module, run: "OpRunner", num_edges: int) -> Tensor:
        """The computed tensor, viewed with a row per edge."""
        return build_value(self.constants(), tensors, module, run, num_edges)

    def constants(self) -> Tuple[Any, ...]:
        """The computed tensor as plain constants, for :func:`build_value`."""
        return ("computed", self.name, self.calls, self.features)

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether every module tensor the calls read still has its traced shape and dtype."""
        return all(_has_shape(module, path, shape, dtype) for path, shape, dtype in self.reads)


def torch_function(name: str) -> Callable[..., Any]:
    """The torch function of a name :func:`torch.overrides.resolve_name` gives (``torch.Tensor.pow``,
    ``torch.nn.functional.softplus``)."""
    owner, *attributes = name.split(".")
    if owner != "torch":
        raise ValueError(f"name: {name!r} is not a torch function")
    return functools.reduce(getattr, attributes, torch)


def replay_calls(calls: Sequence[Call], module: torch.nn.Module) -> Tensor:
    """The result of the last of ``calls`` (see :data:`Call`), made on ``module``'s tensors."""
    results: List[Tensor] = []

    def argument(tagged: TaggedArgument) -> Any:
        tag, value = tagged
        if tag == "tensor":
            return module_attribute(module, value)
        if tag == "result":
            return results[value]
        if tag == "list":
            return [argument(item) for item in value]
        if tag == "tuple":
            return tuple(argument(item) for item in value)
        if tag == "slice":
            return slice(*value)
        return value

    for name, args, kwargs in calls:
        function = torch_function(name)
        results.append(function(*[argument(a) for a in args], **{key: argument(a) for key, a in kwargs}))
    return results[-1]


@dataclass(frozen=True)
class Step:
    """An operator that runs before the fused one, whose result later operators read: a per-edge
    value the fused kernel cannot recompute (a dot product that ``message()`` computes with, a
    value it stores on the module), or one aggregate per receiver (the maxima and the sums of
    PyG's ``softmax`` over each receiver's edges)."""

    name: str  #: the operand argument its result fills
    op: OpInfo  #: per edge when ``op.gather`` is ``None``, else per receiver
    operands: Tuple[Operand, ...]
    features: Shape  #: the result's feature shape
    grad: bool = True  #: whether it is differentiated (a softmax's maxima are not, as in PyG)

    def build(self, tensors: Mapping[str, Tensor], module: torch.nn.Module, run: "OpRunner", num_edges: int) -> Tensor:
        """The operator's result, from the real ``tensors``."""
        operands = [operand.build(tensors[operand.argument]) for operand in self.operands]
        return run_step(run, self.op, operands, self.features, self.grad)

    def constants(self) -> Tuple[Any, ...]:
        """The step as plain constants (its op serialised), for :func:`build_value`."""
        operands = tuple(o.recipe() for o in self.operands)
        return ("step", self.name, self.op.serialize(), operands, self.features, self.grad)

    def matches(self, module: torch.nn.Module) -> bool:
        return True


@dataclass(frozen=True)
class NodeStep:
    """A value of one end of the edges (``(x_i * att).sum(-1)``, GAT's scores) that ``message()``
    computes with but the fused kernel cannot recompute (a dot product): computed once per vertex in
    PyTorch, ``N`` rows instead of ``E``, and read by later operators as a vertex operand."""

    name: str  #: the operand argument it fills
    expr: Expr  #: over ``operands``, in slot order
    #: vertex operands of one kind, and parameters (:class:`Broadcast`, kind ``edge``)
    operands: Tuple[Operand, ...]
    shape: Shape  #: the feature shape ``expr`` is evaluated at
    features: Shape  #: the result's feature shape
    reduce: bool  #: whether ``expr`` is summed over its last dimension

    def build(self, tensors: Mapping[str, Tensor], module: torch.nn.Module, run: "OpRunner", num_edges: int) -> Tensor:
        """The value of every vertex."""
        recipes = [(o.argument, o.kind) + o.recipe()[1:] for o in self.operands]
        return evaluate_on_vertices(
            self.expr, _vertex_operands(recipes, tensors), self.shape, self.features, self.reduce
        )

    def constants(self) -> Tuple[Any, ...]:
        """The node step as plain constants (its expression serialised), for :func:`build_value`."""
        operands = tuple((o.argument, o.kind) + o.recipe()[1:] for o in self.operands)
        return ("node", self.name, self.expr.serialize(), operands, self.shape, self.features, self.reduce)

    def matches(self, module: torch.nn.Module) -> bool:
        return True


def evaluate_on_vertices(expr: Expr, operands: Sequence[Tensor], shape: Shape, features: Shape, reduce: bool) -> Tensor:
    """:meth:`NodeStep.build` once its operands are built (``[N or 1, *their shape]``): ``expr``
    broadcast to ``shape`` over the vertices, summed over its last dimension if ``reduce``, viewed
    as ``features``; half types are computed in float32, as the kernels do."""
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in operands])
    wide = torch.promote_types(dtype, torch.float32)
    inputs = [
        t.to(wide).reshape(t.shape[:1] + (1,) * (len(shape) - (t.dim() - 1)) + tuple(t.shape[1:])) for t in operands
    ]
    out = evaluate(expr, inputs)
    rows = max(t.shape[0] for t in inputs)
    out = out.expand((rows,) + tuple(shape))
    if reduce:
        out = out.sum(dim=-1)
    return out.to(dtype).reshape((rows,) + tuple(features))


#: A value computed before the fused operator, into an operand argument of its own.
Value = Union[Product, Broadcast, Computed, Step, NodeStep]
#: Runs one IR operator on the propagation's graph: ``run(op, operands)``, ``op`` an
#: :class:`~pyg_ugrapher.ir.OpInfo` or, in a compiled model, its serialised form.
OpRunner = Callable[[Any, List[Tensor]], Tensor]


def _has_shape(module: torch.nn.Module, path: str, shape: Shape, dtype: torch.dtype) -> bool:
    value = module_attribute(module, path)
    return isinstance(value, Tensor) and tuple(value.shape) == shape and value.dtype == dtype


def run_step(run: OpRunner, op: Any, operands: List[Tensor], features: Shape, grad: bool) -> Tensor:
    """:meth:`Step.build` once its operands are built."""
    if grad:
        out = run(op, operands)
    else:
        with torch.no_grad():
            out = run(op, operands)
    return out.reshape(out.shape[:1] + tuple(features))


def _vertex_operands(recipes: Sequence[Tuple[Any, ...]], tensors: Mapping[str, Tensor]) -> List[Tensor]:
    """The operands of a :class:`NodeStep` from ``(argument, kind, *build_operand fields)``: vertex
    rows, and one row of each parameter."""
    return [
        build_operand(_single_row(tensors[argument]) if kind == "edge" else tensors[argument], *fields)
        for argument, kind, *fields in recipes
    ]


def _single_row(broadcast: Tensor) -> Tensor:
    """The one row a :class:`Broadcast` operand repeats (with a stride of 0): what broadcasts over
    the vertices, also when the graph has no edge."""
    return broadcast.as_strided((1,) + tuple(broadcast.shape[1:]), broadcast.stride())


def build_value(
    constants: Tuple[Any, ...], tensors: Mapping[str, Tensor], module: torch.nn.Module, run: OpRunner, num_edges: int
) -> Tensor:
    """A :data:`Value` from its :meth:`constants` (which a compiled model holds)."""
    kind = constants[0]
    if kind == "product":
        _, _, argument, shape, view, index, weight, columns, bias, dtype = constants
        return build_product(tensors[argument], module, shape, view, index, weight, columns, bias, dtype)
    if kind == "broadcast":
        _, _, path, features = constants
        return _per_edge(module_attribute(module, path), features, num_edges)
    if kind == "computed":
        _, _, calls, features = constants
        return _per_edge(replay_calls(calls, module), features, num_edges)
    if kind == "node":
        _, _, expr, operands, shape, features, reduce = constants
        built = _vertex_operands(operands, tensors)
        return evaluate_on_vertices(parse_expr(expr), built, shape, features, reduce)
    _, _, op, operands, features, grad = constants
    built = [build_operand(tensors[argument], *recipe) for argument, *recipe in operands]
    return run_step(run, op, built, features, grad)


def _per_edge(value: Tensor, features: Shape, num_edges: int) -> Tensor:
    """``value`` viewed as ``features`` with one row, repeated for every edge (a stride-0 view)."""
    return value.reshape((1,) + tuple(features)).expand((num_edges,) + tuple(features))


def module_attribute(module: torch.nn.Module, path: str) -> Any:
    """``module.<path>`` for a dotted attribute path (``lin.weight``)."""
    for name in path.split("."):
        module = getattr(module, name)
    return module


def combine_columns(weight: Tensor, columns: Sequence[Tuple[int, int, float]]) -> Tensor:
    r""":math:`\sum_k c_k W_{:, a_k:b_k}`: the weight a Linear applies to one operand that appears in
    the column blocks ``(a_k, b_k)`` of its input with coefficients ``c_k``."""
    matrix: Optional[Tensor] = None
    for start, stop, coefficient in columns:
        block = weight[:, start:stop]
        if coefficient != 1.0:
            block = block * coefficient
        matrix = block if matrix is None else matrix + block
    assert matrix is not None, "a product has at least one column block"
    return matrix


def build_product(
    tensor: Tensor,
    module: torch.nn.Module,
    shape: Shape,
    view: Optional[Shape],
    index: Optional[FeatureIndex],
    weight: str,
    columns: Sequence[Tuple[int, int, float]],
    bias: Optional[str],
    dtype: torch.dtype,
) -> Tensor:
    """:meth:`Product.build` from the product's fields (a compiled model holds them as constants)."""
    rows = build_operand(tensor, shape, None, view, index)
    matrix = combine_columns(module_attribute(module, weight), columns)
    out = torch.nn.functional.linear(rows, matrix)
    if bias is not None:
        out = out + module_attribute(module, bias)
    # autocast may run the Linear in another dtype than the kernel was captured for
    return out if out.dtype == dtype else out.to(dtype)


@dataclass(frozen=True)
class Capture:
    """A ``message()`` with its aggregation, as IR operators.

    ``op`` computes the aggregated messages in one kernel; its output, viewed as
    ``[rows, *message_shape]``, is the result (a view ``message()`` applied to its final result is
    applied to the aggregate instead). For a message ending in a sum over its last dimension (a dot
    product), IR reductions being message-creation only, ``op`` creates the reduced messages and
    ``gather`` aggregates them.
    """

    op: OpInfo
    operands: Tuple[Operand, ...]
    message_shape: Shape  #: feature shape of one message, as ``message()`` returns it
    gather: Optional[OpInfo] = None
    num_edges: Optional[int] = None  #: set when the trace read the number of edges: valid for that count only
    #: what is computed before ``op`` into operand arguments of its own, in order
    values: Tuple[Value, ...] = ()
    #: ``(attribute, argument)``: a value ``message()`` stores on the module (``self._alpha``),
    #: set again from the computed argument at every call
    stores: Tuple[Tuple[str, str], ...] = ()

    @property
    def ops(self) -> Tuple[OpInfo, ...]:
        """The operators one propagation runs, in order."""
        steps = tuple(value.op for value in self.values if isinstance(value, Step))
        return steps + ((self.op,) if self.gather is None else (self.op, self.gather))

    @property
    def products(self) -> Tuple[Product, ...]:
        """The Linear products among :attr:`values`."""
        return tuple(value for value in self.values if isinstance(value, Product))

    def operand_tensors(
        self,
        tensors: Mapping[str, Tensor],
        module: Optional[torch.nn.Module],
        run: Optional[OpRunner] = None,
        num_edges: int = 0,
    ) -> Mapping[str, Tensor]:
        """``tensors`` (the real arguments) with :attr:`values` computed (from ``module``'s weights,
        and by ``run`` on the propagation's graph of ``num_edges`` edges); :attr:`stores` are set
        on ``module``."""
        if not self.values:
            return tensors
        if run is None:
            raise ValueError("run: a capture with values runs operators on the propagation's graph")
        if module is None and any(isinstance(value, (Product, Broadcast, Computed)) for value in self.values):
            raise ValueError("module: a capture with Linear products or parameters reads them from its module")
        tensors = dict(tensors)
        for value in self.values:
            tensors[value.name] = value.build(tensors, module, run, num_edges)
        for attribute, argument in self.stores:
            setattr(module, attribute, tensors[argument])
        return tensors

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether every module tensor a value reads still has its traced shape and dtype."""
        return all(value.matches(module) for value in self.values)

    def __str__(self) -> str:
        inputs = ", ".join(f"{o.argument}{_selection(o.index)} as {o.kind} {list(o.features)}" for o in self.operands)
        products = "".join(
            f"\n{p.name} = linear({p.source.argument}{_selection(p.source.index)}, "
            f"{_columns_text(p.weight, p.columns)}{'' if p.bias is None else ', ' + p.bias})"
            for p in self.products
        )
        steps = "\n".join(repr(op) for op in self.ops)
        return f"Capture of message({inputs}) -> messages {list(self.message_shape)}{products}\n{steps}"


def _columns_text(weight: str, columns: Sequence[Tuple[int, int, float]]) -> str:
    """The weight :func:`combine_columns` makes, as Python: ``w[:, 0:4] - w[:, 4:8]``."""
    text = ""
    for start, stop, coefficient in columns:
        sign = "-" if coefficient < 0 else "+"
        scale = "" if abs(coefficient) == 1.0 else f"{abs(coefficient):g} * "
        term = f"{scale}{weight}[:, {start}:{stop}]"
        text = (f"-{term}" if sign == "-" else term) if not text else f"{text} {sign} {term}"
    return text


def _selection(index: Optional[FeatureIndex]) -> str:
    """``index`` as Python indexing (``[:, 0:4]``), or nothing without one."""
    if index is None:
        return ""
    entries = [str(e) if isinstance(e, int) else f"{e[0]}:{e[1]}" + (f":{e[2]}" if e[2] != 1 else "") for e in index]
    return f"[:, {', '.join(entries)}]"
