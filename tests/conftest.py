"""Shared set-up of the test suite.

* Triton is imported in interpreter mode on a machine without a GPU (before anything else imports
  it), so a test can run the real kernels on the CPU by asking for the ``interpret`` or ``device``
  fixture, while every other test runs ``compute`` on the reference executor.
* Markers: ``cuda`` tests are skipped without a GPU; ``slow`` marks the long ones
  (``pytest -m "not slow"`` leaves them out).
* Graphs with what trips kernels up (:data:`GRAPH_CASES`), operands for any
  :class:`~pyg_ugrapher.ir.OpInfo`, poisoned kernel outputs and the relative-error check of the
  suite (:func:`assert_close`), as fixtures.
* :class:`FakeSparseTensor`, a stand-in for ``torch_sparse.SparseTensor`` (tests import it:
  ``isinstance`` needs the class itself).
"""

import dataclasses
import math
import os
import subprocess
import sys
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest
import torch


def _import_triton_interpretable() -> None:
    """Import Triton in interpreter mode, without making the interpreter the default.

    Triton decides at import whether its language functions are interpreted, while
    ``triton_kernels`` reads ``TRITON_INTERPRET`` at every call. Importing Triton with the variable
    set and then restoring it keeps the reference executor the default on the CPU and lets a test
    switch to the interpreter with ``monkeypatch.setenv`` (the ``interpret`` fixture). Only on a
    machine without a GPU, and only if nothing imported Triton before this conftest.
    """
    if "triton" in sys.modules or torch.cuda.is_available():
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    _skip_overflow_checks()


def _skip_overflow_checks() -> None:
    """Stop the interpreter from computing int32 overflow checks that it never asserts.

    With its default options (``sanitize_overflow=True``, ``debug=False``) Triton's interpreter
    redoes every int32 add, sub and mul of a kernel in int64 and compares the result with the int32
    range, then drops the comparison: ``device_assert`` does nothing outside debug mode (an int32
    product that overflows wraps without an error either way). That dead work is about a fifth of
    the interpreted tests' time.
    """
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


_import_triton_interpretable()

import torch_geometric.nn as pyg_nn  # noqa: E402  (PyG imports Triton)
from torch_geometric.typing import SparseTensor  # noqa: E402

import pyg_ugrapher as ug  # noqa: E402
import triton_kernels  # noqa: E402
from autotune import selection  # noqa: E402
from benchmarks import rows  # noqa: E402
from pyg_ugrapher import graph_argument  # noqa: E402
from pyg_ugrapher.ops import decisions  # noqa: E402
from triton_kernels import buffers  # noqa: E402

CUDA = torch.cuda.is_available()
#: Triton's interpreter turns 1-element arrays into Python ints, which NumPy 2.4 refuses (the
#: project pins ``numpy<2.4``; a GPU machine may bring a newer one).
INTERPRETER_NUMPY_OK = tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 4)


# -- markers -------------------------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """Skip ``cuda`` tests on a machine without a GPU, ``two_gpus`` tests on one with fewer than two,
    and tests that need Triton's interpreter where NumPy is too new for it."""
    skips = []
    if not CUDA:
        skips.append(
            (
                lambda item: "cuda" in item.keywords,
                pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
            )
        )
    if torch.cuda.device_count() < 2:
        skips.append((lambda item: "two_gpus" in item.keywords, pytest.mark.skip(reason="needs two GPUs")))
    if not INTERPRETER_NUMPY_OK:
        skips.append(
            (
                _runs_the_interpreter,
                pytest.mark.skip(reason=f"Triton's interpreter needs numpy<2.4, found {np.__version__}"),
            )
        )
    for item in items:
        for applies, skip in skips:
            if applies(item):
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def pyg_fused_propagations():
    """PyG generates a class's ``propagate()`` at its first instance, with that instance's ``fuse``:
    a first ``SAGEConv`` with a list of aggregations (``fuse=False``) leaves the class without the
    fused branch, and every later ``SAGEConv(aggr="mean")`` given a sparse adjacency raises
    ``NotImplementedError`` (PyG 2.8, without this project). Building one default instance of the
    classes the tests also build with lists first keeps the tests independent of their order."""
    pyg_nn.SAGEConv(1, 1)
    pyg_nn.GraphConv(1, 1)


@pytest.fixture(autouse=True)
def staged_and_fused_on_small_graphs(monkeypatch):
    """Propagations that run staged or fused, and the layers' graph operators, do so on the tests'
    small graphs too: by default a graph of fewer than ``MessagePassing.staged_min_edges`` edges
    (and, eager on a GPU, of fewer than ``MessagePassing.fused_min_edges``) runs PyG's propagation
    instead, and eager on a GPU the layers' operators on a graph of fewer than
    ``graph_argument.HOST_BOUND_EDGES`` run as torch operations; the tests of those rules ask for
    them themselves."""
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", 0)
    monkeypatch.setattr(ug.MessagePassing, "fused_min_edges", 0)
    monkeypatch.setattr(graph_argument, "HOST_BOUND_EDGES", 0)


# -- where compute runs --------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def reference_executor(monkeypatch):
    """Every test runs ``compute`` on the reference executor on the CPU unless it asks for the
    ``interpret`` or ``device`` fixture, whatever ``TRITON_INTERPRET`` the shell set."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _interpreter_importable() -> bool:
    """Whether Triton was imported in interpreter mode (see :func:`_import_triton_interpretable`)."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return triton_kernels.interpreting()
    except RuntimeError:
        return False
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


INTERPRETER_IN_PROCESS = _interpreter_importable()


# -- structures in the user's order ----------------------------------------------------------------
@pytest.fixture(autouse=True)
def sorted_structures(monkeypatch):
    """Graphs built in a test get sorted structures on every device, as graphs past
    :data:`autotune.selection.SMALL_GRAPH_EDGES` edges do on a GPU, unless the test asks for
    ``user_order``: the kernel tests' small graphs then run the same path on a GPU as through the
    interpreter (reads in CSR order, permuted edge operands), and the user-order path has tests of
    its own on every device."""
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: False)


@pytest.fixture
def user_order(monkeypatch):
    """Graphs built in this test keep their structures' edges in the user's order
    (:func:`~pyg_ugrapher.graph.build_user_order_pair`), as a small GPU graph's do by default, on
    any device."""
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: True)


@pytest.fixture(params=["sorted", "user"])
def edge_order(request) -> str:
    """The test runs twice: on sorted structures and on structures in the user's order."""
    if request.param == "user":
        request.getfixturevalue("user_order")
    return request.param


@pytest.fixture
def small_graph_mode(monkeypatch, user_order):
    """What a small GPU graph runs, on any device: structures in the user's order, the
    edge-parallel schedules of :func:`autotune.heuristic.small_graph_schedule` for every automatic
    decision, each made once for every graph."""
    from autotune.heuristic import small_graph_schedule

    monkeypatch.setattr(selection, "select", lambda graph, op, F, *args, **kwargs: small_graph_schedule(op, F))
    monkeypatch.setattr(selection, "graph_independent", lambda graph, device: True)
    monkeypatch.setattr(decisions, "SHARED_DECISIONS", {})


@pytest.fixture
def custom_op_graphs(monkeypatch):
    """Compiled layers run their graph operators as the custom ops whatever the graph's size, as
    on a graph above :data:`~pyg_ugrapher.graph_argument.TRACED_GRAPH_EDGES` edges."""
    monkeypatch.setattr(graph_argument, "TRACED_GRAPH_EDGES", -1)


@pytest.fixture(params=["traced", "custom ops"])
def compiled_route(request) -> str:
    """The test runs twice: compiled layers trace their operators as torch operations (a small
    graph, :func:`~pyg_ugrapher.graph_argument.traced_graph`), then call the custom ops."""
    if request.param == "custom ops":
        request.getfixturevalue("custom_op_graphs")
    return request.param


@pytest.fixture(params=["reference", "interpreter"])
def executor(request, monkeypatch) -> str:
    """Run ``compute`` on the reference executor, or the Triton kernels through the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1" if request.param == "interpreter" else "0")
    if request.param == "interpreter":
        try:
            triton_kernels.interpreting()
        except RuntimeError as error:
            pytest.skip(f"Triton interpreter unavailable in this process: {error}")
    return request.param


@pytest.fixture
def interpret(monkeypatch):
    """Run ``compute`` through the Triton interpreter in this test (in a child process when this
    one imported Triton without it, see :func:`pytest_pyfunc_call`)."""
    if INTERPRETER_IN_PROCESS:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device(monkeypatch) -> torch.device:
    """Where the Triton kernels run: the GPU when there is one, else the CPU through the
    interpreter."""
    if CUDA:
        return torch.device("cuda")
    if INTERPRETER_IN_PROCESS:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device("cpu")


def _needs_interpreter(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "interpret" in names or ("device" in names and not CUDA)


#: Fixtures that run Triton's interpreter in a child process of their own (the autotune smoke
#: collection, ``python -m autotune collect --device cpu``, a command started with
#: ``interpreter_env``).
CHILD_INTERPRETER_FIXTURES = ("collected", "collect_cli", "interpreter_env")


@pytest.fixture
def interpreter_env() -> Dict[str, str]:
    """The environment of a child process that runs kernels through Triton's interpreter."""
    return {**os.environ, "TRITON_INTERPRET": "1"}


def _runs_the_interpreter(item) -> bool:
    """Whether a test runs kernels through Triton's interpreter, in this process or a child."""
    names = getattr(item, "fixturenames", ())
    return _needs_interpreter(item) or any(name in names for name in CHILD_INTERPRETER_FIXTURES)


#: nodeid -> outcome of the interpreter tests run in a child pytest.
_CHILD_OUTCOMES: Dict[str, str] = {}


def pytest_pyfunc_call(pyfuncitem):
    """When another module imported Triton first (so that it cannot interpret here), run the tests
    that need the interpreter in one child pytest started with ``TRITON_INTERPRET=1``."""
    if INTERPRETER_IN_PROCESS or not _needs_interpreter(pyfuncitem):
        return None
    if not _CHILD_OUTCOMES:
        nodeids = [item.nodeid for item in pyfuncitem.session.items if _needs_interpreter(item)]
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *nodeids],
            cwd=pyfuncitem.config.rootpath,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        for line in result.stdout.splitlines():
            outcome, _, rest = line.partition(" ")
            if outcome in ("PASSED", "FAILED", "ERROR", "SKIPPED"):
                _CHILD_OUTCOMES[rest.split(" - ")[0]] = line
        _CHILD_OUTCOMES.setdefault("", result.stdout[-4000:] + result.stderr[-2000:])
    outcome = _CHILD_OUTCOMES.get(pyfuncitem.nodeid)
    if outcome is None or not outcome.startswith("PASSED"):
        pytest.fail(f"with TRITON_INTERPRET=1 in a child process: {outcome}\n{_CHILD_OUTCOMES['']}")
    return True


# -- graphs --------------------------------------------------------------------------------------
def _random_edges(generator: torch.Generator, num_src: int, num_dst: int, num_edges: int) -> torch.Tensor:
    return torch.stack(
        [
            torch.randint(0, num_src, (num_edges,), generator=generator),
            torch.randint(0, num_dst, (num_edges,), generator=generator),
        ]
    )


def _isolated(g: torch.Generator) -> torch.Tensor:
    # Vertex 8 has no edge in either direction.
    return _random_edges(g, 8, 8, 29)


def _self_loops(g: torch.Generator) -> torch.Tensor:
    edges = _random_edges(g, 8, 8, 23)
    edges[1, ::3] = edges[0, ::3]
    return edges


def _duplicates(g: torch.Generator) -> torch.Tensor:
    edges = _random_edges(g, 8, 8, 11)
    return torch.cat([edges, edges, edges[:, :5]], dim=1)  # 27 edges, some three times


def _hub(g: torch.Generator) -> torch.Tensor:
    # Vertex 0 receives 32 of the 47 edges and sends 6 of them.
    edges = _random_edges(g, 10, 10, 47)
    edges[1, :32] = 0
    edges[0, 32:38] = 0
    return edges


def _bipartite(g: torch.Generator) -> torch.Tensor:
    # Source 6 and destination 4 are isolated.
    return _random_edges(g, 6, 4, 31)


def _mixed(g: torch.Generator) -> torch.Tensor:
    # An isolated vertex (11), a hub (0), self loops and duplicate edges in one graph.
    edges = _random_edges(g, 11, 11, 30)
    edges[1, :12] = 0
    edges[1, 25:] = edges[0, 25:]
    return torch.cat([edges, edges[:, 3:14]], dim=1)  # 41 edges


def _tiny(g: torch.Generator) -> torch.Tensor:
    # For gradcheck: vertex 5 isolated, vertex 0 a hub, a self loop and a duplicate edge.
    return torch.tensor([[1, 2, 3, 4, 0, 2, 3, 4, 1, 1, 2, 4, 3], [0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 4]])


#: name -> (builder of the ``[2, E]`` edge index, ``(num_src, num_dst)``). Edge counts are primes,
#: so that no block size divides them.
GRAPH_CASES: Dict[str, tuple] = {
    "empty": (lambda g: torch.empty(2, 0, dtype=torch.int64), (5, 5)),
    "isolated": (_isolated, (9, 9)),
    "self_loops": (_self_loops, (8, 8)),
    "duplicates": (_duplicates, (8, 8)),
    "hub": (_hub, (10, 10)),
    "bipartite": (_bipartite, (7, 5)),
    "mixed": (_mixed, (12, 12)),
    "tiny": (_tiny, (6, 6)),
}


def make_graph(case: str, seed: int = 0, index_dtype: Optional[torch.dtype] = None) -> ug.GraphTensor:
    """The graph ``case`` of :data:`GRAPH_CASES`, with random edges drawn from ``seed``."""
    build, sizes = GRAPH_CASES[case]
    edge_index = build(torch.Generator().manual_seed(seed))
    return ug.GraphTensor.from_edge_index(edge_index, sizes, index_dtype=index_dtype)


def pytest_generate_tests(metafunc):
    """A test with a ``graph_case`` argument runs on every graph of :data:`GRAPH_CASES`."""
    if "graph_case" in metafunc.fixturenames:
        metafunc.parametrize("graph_case", list(GRAPH_CASES))


@pytest.fixture
def hub_graph(device) -> ug.GraphTensor:
    """20k vertices and 150k random edges on ``device``, 100k of them into vertex 0: a row of 100k
    edges (a column too, on the reversed graph)."""
    gen = torch.Generator().manual_seed(0)
    num_nodes = 20_000
    edges = torch.randint(0, num_nodes, (2, 150_000), generator=gen)
    edges[1, :100_000] = 0
    return ug.GraphTensor.from_edge_index(edges.to(device), num_nodes)


@pytest.fixture(scope="session")
def graph_factory() -> Callable[..., ug.GraphTensor]:
    """``graph_factory(case, seed=0, index_dtype=None)``, see :func:`make_graph`."""
    return make_graph


class FakeSparseTensor(SparseTensor):
    """A stand-in for ``torch_sparse.SparseTensor`` (not installed here): just what PyG's message path
    reads (``size``, ``coo``, ``csr``, ``nnz``), rows sorted."""

    def __init__(self, row: torch.Tensor, col: torch.Tensor, value: Optional[torch.Tensor], sizes):
        order = torch.argsort(row * sizes[1] + col)
        self.row, self.col = row[order], col[order]
        self.value = None if value is None else value[order]
        self.sizes = sizes

    def size(self, dim: int) -> int:
        return self.sizes[dim]

    def nnz(self) -> int:
        return self.row.numel()

    def coo(self):
        return self.row, self.col, self.value

    def csr(self):
        rowptr = torch.zeros(self.sizes[0] + 1, dtype=torch.long)
        rowptr[1:] = torch.cumsum(torch.bincount(self.row, minlength=self.sizes[0]), 0)
        return rowptr, self.col, self.value


# -- operands ------------------------------------------------------------------------------------
#: Feature shapes of operand layouts: the first operand's, then the others'. ``F = 5`` and
#: ``C = 3`` are not powers of two, so feature tiles are always partly masked.
OPERAND_SHAPES: Dict[str, tuple] = {
    "scalar": ((), ()),  # [rows]
    "vector": ((5,), (5,)),  # [rows, F]
    "heads": ((2, 3), (2, 3)),  # [rows, H, C]
    "head_bcast": ((2, 3), (2, 1)),  # GAT: per-head vectors times per-head scalars
    "inner": ((2, 3), (3,)),  # one C-vector shared by every head
    "row_bcast": ((2, 3), ()),  # one value per row times per-head vectors
}


def shapes_for(op: ug.OpInfo) -> List[str]:
    """The operand layouts of :data:`OPERAND_SHAPES` that ``op`` accepts: a reducing op (``dot``)
    needs the summed last dimension in full in every operand."""
    if op.reduces:
        return ["vector", "heads", "inner"]
    if len(op.inputs) == 1:
        return ["scalar", "vector", "heads"]
    return list(OPERAND_SHAPES)


def make_operands(
    graph: ug.GraphTensor,
    op: ug.OpInfo,
    shape: str = "vector",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: Optional[torch.device] = None,
) -> List[torch.Tensor]:
    """Random operands of ``op`` on ``graph`` in slot order, laid out as ``OPERAND_SHAPES[shape]``.

    Values are distinct with probability one (so max/min have unique winners) and a divisor lies
    in ``±[0.5, 1.5]``, away from zero.
    """
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    generator = torch.Generator().manual_seed(seed)
    first, rest = OPERAND_SHAPES[shape]
    tensors = []
    for slot, kind in enumerate(op.inputs):
        size = (rows[kind],) + (first if slot == 0 else rest)
        values = torch.rand(size, generator=generator, dtype=torch.float64) * 2 - 1
        if op.edge_op == "div" and slot == 1:
            values = torch.sign(values) * (0.5 + values.abs())
        tensors.append(values.to(dtype=dtype, device=device))
    return tensors


@pytest.fixture(scope="session")
def operand_factory() -> Callable[..., List[torch.Tensor]]:
    """``operand_factory(graph, op, shape="vector", dtype=torch.float32, seed=0, device=None)``,
    see :func:`make_operands`."""
    return make_operands


@pytest.fixture(scope="session")
def operand_shapes() -> Callable[[ug.OpInfo], List[str]]:
    """``operand_shapes(op)``: the operand layouts ``op`` accepts, see :func:`shapes_for`."""
    return shapes_for


# -- checking results ----------------------------------------------------------------------------
#: Largest relative error (to the largest magnitude of the expected tensor) per dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def relative_error(actual: torch.Tensor, expected: torch.Tensor, scale: float = 0.0) -> float:
    """``max |actual - expected| / max(max |expected|, scale)``; NaN anywhere in ``actual`` counts as
    infinite."""
    if actual.numel() == 0:
        return 0.0
    actual, expected = actual.double(), expected.double()
    if torch.isnan(actual).any():
        return math.inf
    scale = max(expected.abs().max().item(), scale, 1e-12)
    return (actual - expected).abs().max().item() / scale


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: Optional[torch.dtype] = None,
    context: str = "",
    scale: float = 0.0,
) -> None:
    """Same shape and dtype, and a relative error within :data:`TOLERANCE` of ``dtype`` (default:
    ``expected.dtype``), against at least ``scale`` (the size of the quantities a value that cancels
    to zero was summed from: relative to zero, rounding alone would fail)."""
    assert actual.shape == expected.shape, f"{context}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{context}: dtype {actual.dtype} != {expected.dtype}"
    tolerance = TOLERANCE[dtype or expected.dtype]
    error = relative_error(actual, expected, scale)
    assert error <= tolerance, f"{context}: relative error {error:.3g} > {tolerance:g}"


# -- layers against PyG's ---------------------------------------------------------------------------
def layer_inputs(executor: str, features: int = 4, dtype: torch.dtype = torch.float32, seed: int = 0):
    """``(x, edge_index)``: the last vertex isolated, self loops, duplicate edges; small for the interpreter."""
    num_nodes, num_edges = (6, 12) if executor == "interpreter" else (12, 48)
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    dst = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    src[-2:] = dst[-2:]
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([src[:3], dst[:3]])], dim=1)
    x = torch.randn(num_nodes, features, generator=generator, dtype=dtype)
    return x, edge_index


def outputs_and_grads(model, x, *args, **kwargs):
    """The output and the gradients of every parameter and of ``x`` (and of a floating ``edge_attr``)."""
    x = x.clone().requires_grad_()
    floating = [
        a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    ]
    out = model(x, *floating, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    probe = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    leaves = [x] + [a for a in floating if isinstance(a, torch.Tensor) and a.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * probe).sum(), leaves + params, allow_unused=True)
    return [out.detach()] + list(grads)


def assert_same_results(ours, theirs, context=""):
    """Equal outputs and gradients; each gradient against the largest one at least (a bias before a
    softmax has a gradient that cancels to zero, where rounding alone differs)."""
    largest = max(t.abs().max().item() for t in theirs[1:] if t is not None and t.numel())
    assert len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert (a is None) == (b is None), f"{context}: tensor {index}"
        if a is not None:
            assert_close(a, b, context=f"{context}: tensor {index}", scale=largest if index else 0.0)


def ran_ops(model, *args, **kwargs):
    """The names of the graph operators one forward pass runs."""
    calls = []
    with ug.ops.observe(calls.append), torch.no_grad():
        model(*args, **kwargs)
    return [call.op.name for call in calls]


@pytest.fixture(scope="session")
def check_close() -> Callable[..., None]:
    """``check_close(actual, expected, dtype=None, context="")``, see :func:`assert_close`."""
    return assert_close


def assert_refereed(
    ours: torch.Tensor, theirs: torch.Tensor, exact: Callable[[], torch.Tensor], context: str = ""
) -> None:
    """``ours`` within the float32 tolerance of ``theirs`` (PyG in float32), or, where float32
    rounding alone makes them differ by more (gradients that sum cancelling terms, like GAT's
    attention vectors), no further from ``exact()`` (PyG in float64, computed only then) than 4x
    PyG's own float32 error."""
    assert ours.shape == theirs.shape, f"{context}: shape {tuple(ours.shape)} vs PyG's {tuple(theirs.shape)}"
    tolerance = TOLERANCE[torch.float32]
    error = relative_error(ours, theirs)
    if error <= tolerance:
        return
    reference = exact()
    ours_error, their_error = relative_error(ours, reference), relative_error(theirs, reference)
    assert ours_error <= max(4 * their_error, tolerance), (
        f"{context}: relative error {error:.2e} vs PyG; {ours_error:.2e} vs float64 where PyG's "
        f"float32 is {their_error:.2e}"
    )


@pytest.fixture(scope="session")
def check_refereed() -> Callable[..., None]:
    """``check_refereed(ours, theirs, exact, context="")``, see :func:`assert_refereed`."""
    return assert_refereed


@pytest.fixture
def poison(monkeypatch) -> None:
    """Fill every kernel output element that the kernel must write with NaN before the launch.

    :func:`triton_kernels.dispatch.run` (and ``run_with_edge_output``, for its edge output too)
    allocates outputs itself: uninitialised (:func:`triton_kernels.buffers.uninitialised`) where
    the kernel writes each element once, initialised where partial results accumulate through
    atomics (all rows for edge-parallel schedules, only the rows split into several chunks for
    neighbour groups). Poisoning the former turns any element a kernel forgets into a NaN the
    comparison catches (the softmax, ``head_dot`` and ``unit_norm`` kernels allocate theirs there
    too)."""

    def poisoned(shape, dtype, device):
        return torch.full(shape, math.nan, dtype=dtype, device=device)

    monkeypatch.setattr(buffers, "uninitialised", poisoned)


def isolated_rows(graph: ug.GraphTensor) -> torch.Tensor:
    """Mask of the destinations without an in-edge."""
    return torch.bincount(graph.dst, minlength=graph.num_dst) == 0


@pytest.fixture(scope="session")
def isolated() -> Callable[[ug.GraphTensor], torch.Tensor]:
    """``isolated(graph)``: mask of the destinations without an in-edge."""
    return isolated_rows


@pytest.fixture
def uncached_commit():
    """:func:`benchmarks.rows.commit` asked afresh, and forgotten after the test."""
    rows.commit.cache_clear()
    yield rows.commit
    rows.commit.cache_clear()
