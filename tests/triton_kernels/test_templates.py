"""Every kernel template x every op of the IR, through ``ug.compute(..., parallel_info=...)``, against
the reference executor.

Outputs are poisoned (NaN) before each launch, so an element a kernel forgets fails the
comparison; the atomic templates accumulate into an initialised output, so there the rows
without edges are checked to be exactly the reference's zeros. On a CPU the kernels run through
the Triton interpreter on graphs of a few dozen edges; the ``cuda`` tests add graphs of 10^5 edges
and a hub of 10^5 edges.
"""

import itertools
import math

import pytest
import torch
import triton
import triton.language as tl

import pyg_ugrapher as ug
from autotune.heuristic import small_graph_schedule
from pyg_ugrapher import reference
from pyg_ugrapher.ir import GATHER_OPS, Expr, OpInfo
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.structure import in_user_order
from triton_kernels import dispatch, edge_parallel

pytestmark = pytest.mark.usefixtures("poison")

TARGETS = ("u", "v", "e")
PAIRS = list(itertools.product(TARGETS, repeat=2))
GATHER_NAMES = [f"copy_{t}_{g}" for g in GATHER_OPS for t in TARGETS] + [
    f"{a}_{op}_{b}_{g}" for g in GATHER_OPS for a, b in PAIRS for op in ("add", "sub", "mul", "div")
]
MESSAGE_NAMES = [f"copy_{t}" for t in TARGETS] + [
    f"{a}_{op}_{b}" for a, b in PAIRS for op in ("add", "sub", "mul", "div", "dot")
]
GRAPHS = ("empty", "isolated", "self_loops", "duplicates", "hub", "bipartite", "mixed")

#: A sample of knobs per (gather or message creation, strategy): tiles wider and narrower than the
#: 5 or 6 features of the operands, blocks that divide no edge count, a group size that splits
#: the hub into many chunks and one that splits nothing.
KNOBS = {
    ("gather", "vertex"): [
        dict(block_v=1, block_e=4, block_f=4),
        dict(block_v=4, block_e=2, block_f=8, num_warps=1),
        dict(block_v=2, block_e=8, block_f=2, num_warps=2),
    ],
    ("gather", "edge"): [
        dict(block_e=8, block_f=4),
        dict(block_e=32, block_f=8, num_warps=1),
        dict(block_e=2, block_f=2),
    ],
    ("gather", "group"): [
        dict(group_size=3, block_v=2, block_e=2, block_f=4),
        dict(group_size=8, block_v=4, block_e=4, block_f=8, num_warps=1),
        dict(group_size=128, block_v=1, block_e=16, block_f=2),
    ],
    ("message", "vertex"): [
        dict(block_v=1, block_e=4, block_f=4),
        dict(block_v=4, block_e=2, block_f=8),
        dict(block_v=2, block_e=16, block_f=2, num_warps=1),
    ],
    ("message", "edge"): [
        dict(block_e=8, block_f=4),
        dict(block_e=32, block_f=8, num_warps=1),
        dict(block_e=2, block_f=2),
    ],
    ("message", "group"): [
        dict(group_size=3, block_v=2, block_e=2, block_f=4),
        dict(group_size=8, block_v=4, block_e=4, block_f=8, num_warps=1),
        dict(group_size=128, block_v=1, block_e=16, block_f=2),
    ],
}
#: The knobs a test leaves out: blocks smaller than the test graphs' rows and edge counts, so that
#: templates run several programs (left unset, the interpreter's heuristic would pick one per graph).
SMALL_BLOCKS = {
    "vertex": dict(block_v=4, block_e=32, num_warps=4),
    "edge": dict(block_e=64, num_warps=4),
    "group": dict(group_size=128, block_v=4, block_e=16, num_warps=4),
}


def small_blocks(strategy: str, **knobs: int) -> ug.ParallelInfo:
    """A complete schedule of ``strategy`` with ``knobs``, the others from :data:`SMALL_BLOCKS`."""
    return ug.ParallelInfo(strategy, **{**SMALL_BLOCKS[strategy], **knobs})


MATRIX = [(strategy, name) for strategy in ("vertex", "edge", "group") for name in GATHER_NAMES] + [
    (strategy, name) for strategy in ("vertex", "edge", "group") for name in MESSAGE_NAMES
]


def schedule(op: OpInfo, strategy: str, knobs: dict, operands) -> ug.ParallelInfo:
    """The knobs as a ParallelInfo, the feature tile clipped to the operator's width."""
    width = infer_layout(op, [t.shape for t in operands]).message_width
    block_f = min(knobs["block_f"], 1 << max(width - 1, 0).bit_length())
    return small_blocks(strategy, **{**knobs, "block_f": block_f})


def check(graph, op, operands, info, check_close, isolated, dtype=None, context=""):
    """``compute`` under ``info`` equals the reference; rows without edges are exactly zero."""
    out = (
        ug.compute(graph, op, *operands, parallel_info=info)
        if op.is_builtin
        else ug.compute(graph, op, operands=operands, parallel_info=info)
    )
    # The oracle sums float32 in float64: over a hub's 1e5 edges two float32 summation orders
    # differ by about 1e-5 relative, which is rounding, not an error of either.
    exact = [t.double() if t.dtype == torch.float32 else t for t in operands]
    expected = reference.execute(graph, op, exact).to(out.dtype)
    check_close(out, expected, dtype, f"{op.name} under {info} {context}")
    if op.gather_op is not None:
        empty_rows = out[isolated(graph)]
        assert torch.equal(empty_rows, torch.zeros_like(empty_rows)), f"{op.name}: rows without edges not 0"
    return out


@pytest.mark.parametrize("strategy,name", MATRIX, ids=[f"{s}-{n}" for s, n in MATRIX])
def test_op_matrix(strategy, name, device, graph_factory, operand_factory, operand_shapes, check_close, isolated):
    """Each (template, op) runs on one graph, layout and knob set, chosen so that the matrix as a
    whole covers every graph x layout x knob set of each template."""
    op = OpInfo.from_name(name)
    index = [n for s, n in MATRIX if s == strategy].index(name)
    case = GRAPHS[index % len(GRAPHS)]
    shapes = operand_shapes(op)
    shape = shapes[index % len(shapes)]
    kind = ("gather" if op.gather_op else "message", strategy)
    knobs = KNOBS[kind][(index // len(GRAPHS)) % len(KNOBS[kind])]
    graph = graph_factory(case, seed=index)
    operands = operand_factory(graph, op, shape, seed=index, device=device)
    check(
        graph,
        op,
        operands,
        schedule(op, strategy, knobs, operands),
        check_close,
        isolated,
        context=f"on {case}, {shape} operands",
    )


SWEEP = [(kind, knobs, case) for kind in KNOBS for knobs in range(3) for case in GRAPHS]


@pytest.mark.parametrize("kind,knobs,case", SWEEP, ids=[f"{k[0]}-{k[1]}-{i}-{c}" for k, i, c in SWEEP])
def test_every_graph_under_every_knob_set(
    kind, knobs, case, edge_order, device, graph_factory, operand_factory, check_close, isolated
):
    """On sorted structures and on structures in the user's order, which the templates that walk
    rows group by row first."""
    names = ("copy_u_sum", "u_mul_e_max") if kind[0] == "gather" else ("u_dot_v", "e_sub_v")
    graph = graph_factory(case, seed=7)
    assert in_user_order(graph.structure(device).csr.rowptr) == (edge_order == "user")
    for shape, name in zip(("vector", "head_bcast"), names):
        op = OpInfo.from_name(name)
        operands = operand_factory(graph, op, "heads" if op.reduces else shape, seed=3, device=device)
        check(
            graph,
            op,
            operands,
            schedule(op, kind[1], KNOBS[kind][knobs], operands),
            check_close,
            isolated,
            context=f"on {case}",
        )


@pytest.mark.parametrize("name", GATHER_NAMES)
def test_edge_parallel_in_user_order(
    name, user_order, device, graph_factory, operand_factory, operand_shapes, check_close, isolated
):
    """Every gather op, edge-parallel on structures in the user's order (a small GPU graph's), where
    a row's edges lie anywhere and every run of equal destinations meets the others through
    atomics; the graph cases, layouts and knob sets in turn."""
    op = OpInfo.from_name(name)
    index = GATHER_NAMES.index(name)
    case = GRAPHS[index % len(GRAPHS)]
    shapes = operand_shapes(op)
    knobs = KNOBS[("gather", "edge")][(index // len(GRAPHS)) % 3]
    graph = graph_factory(case, seed=index)
    assert in_user_order(graph.structure(device).csr.rowptr)
    operands = operand_factory(graph, op, shapes[index % len(shapes)], seed=index, device=device)
    check(graph, op, operands, schedule(op, "edge", knobs, operands), check_close, isolated, context=f"on {case}")


@pytest.mark.parametrize("width", [5, 40])
@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_max", "copy_e_mean"])
def test_small_graph_rule_in_user_order(name, width, user_order, device, graph_factory, check_close, isolated):
    """The schedule a small GPU graph's gathers run (:func:`autotune.heuristic.small_graph_schedule`),
    on structures in the user's order, on every graph case (empty, isolated vertices, self loops,
    duplicates, a hub, bipartite), with one feature tile and with a masked second one."""
    op = OpInfo.from_name(name)
    info = small_graph_schedule(op, width)
    for index, case in enumerate(GRAPHS):
        graph = graph_factory(case, seed=index)
        assert in_user_order(graph.structure(device).csr.rowptr)
        generator = torch.Generator().manual_seed(index)
        rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
        operands = [(torch.rand(rows[kind], width, generator=generator) + 0.5).to(device) for kind in op.inputs]
        check(graph, op, operands, info, check_close, isolated, context=f"on {case}")


@pytest.mark.parametrize("name", ["copy_u_sum", "copy_u_mean", "u_mul_e_max", "copy_u_min"])
def test_edge_blocks_with_and_without_runs(name, edge_order, device, check_close, isolated):
    """In the user's order an edge block whose consecutive destinations all differ skips the scan,
    while sorted structures always scan: blocks of 4 edges with no run, with runs inside, with a
    run that crosses into the next block, and a last block of one run, against the reference."""
    dst = [0, 1, 2, 3, 4, 4, 4, 5, 6, 7, 6, 7, 2, 2, 2, 2, 2, 3, 1, 0, 5, 5, 5]
    src = [(3 * k + 1) % 9 for k in range(len(dst))]
    graph = ug.GraphTensor.from_edge_index(torch.tensor([src, dst]).to(device), 9)
    assert in_user_order(graph.structure(device).csr.rowptr) == (edge_order == "user")
    op = OpInfo.from_name(name)
    generator = torch.Generator().manual_seed(5)
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    operands = [torch.randn(rows[kind], 6, generator=generator).to(device) for kind in op.inputs]
    check(graph, op, operands, small_blocks("edge", block_e=4, block_f=8), check_close, isolated)


def _combine_both_ways(combine: tl.constexpr, starts_ptr, values_ptr, left_ptr, right_ptr, N: tl.constexpr):
    """``(a + b) + c`` and ``a + (b + c)`` under ``combine``, for N triples of (start, value) pairs;
    decorated in the test, once the ``device`` fixture has chosen compiled or interpreted (Triton
    decides at decoration time)."""
    i = tl.arange(0, N)
    start_a = tl.load(starts_ptr + i)
    start_b = tl.load(starts_ptr + N + i)
    start_c = tl.load(starts_ptr + 2 * N + i)
    value_a = tl.load(values_ptr + i)
    value_b = tl.load(values_ptr + N + i)
    value_c = tl.load(values_ptr + 2 * N + i)
    start_ab, value_ab = combine(start_a, value_a, start_b, value_b)
    start_left, value_left = combine(start_ab, value_ab, start_c, value_c)
    start_bc, value_bc = combine(start_b, value_b, start_c, value_c)
    start_right, value_right = combine(start_a, value_a, start_bc, value_bc)
    tl.store(left_ptr + i, value_left)
    tl.store(right_ptr + i, value_right)
    tl.store(left_ptr + N + i, start_left.to(tl.float32))
    tl.store(right_ptr + N + i, start_right.to(tl.float32))


@pytest.mark.parametrize("gather", GATHER_OPS)
def test_edge_parallel_scan_is_associative(gather, device):
    """The edge-parallel scan's combine is associative on any run starts. A GPU scans as a tree,
    the interpreter left to right, so only this catches a combine that is not: the kernel's first
    one (comparing destinations, right on sorted rows only) fails it."""
    op = OpInfo.from_name(f"copy_u_{gather}")
    spec = dispatch.kernel_spec(op, infer_layout(op, [(4, 8)]), small_blocks("edge", block_f=8, block_e=8))
    combine = dispatch.load_kernel(edge_parallel.source(spec), "_combine_runs")
    n = 64
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(0, 2, (3 * n,), generator=gen, dtype=torch.int32).to(device)
    values = torch.randint(-8, 8, (3 * n,), generator=gen).float().to(device)  # integers: exact in any order
    left, right = (torch.full((2 * n,), math.nan, device=device) for _ in range(2))
    triton.jit(_combine_both_ways)[(1,)](combine, starts, values, left, right, n)
    assert torch.equal(left, right)


HALF = [
    (strategy, name, dtype)
    for strategy in ("vertex", "edge", "group")
    for name in ("copy_u_sum", "u_mul_e_mean", "u_add_v_max", "e_div_u_min")
    for dtype in (torch.float16, torch.bfloat16)
] + [
    (strategy, name, dtype)
    for strategy in ("vertex", "edge", "group")
    for name in ("u_dot_v", "u_add_v", "e_mul_u")
    for dtype in (torch.float16, torch.bfloat16)
]


@pytest.mark.parametrize("strategy,name,dtype", HALF, ids=[f"{s}-{n}-{str(d)[6:]}" for s, n, d in HALF])
def test_half_types(strategy, name, dtype, device, graph_factory, operand_factory, check_close, isolated):
    op = OpInfo.from_name(name)
    kind = ("gather" if op.gather_op else "message", strategy)
    for case, knobs, shape in (("hub", 0, "vector"), ("mixed", 1, "heads" if op.reduces else "head_bcast")):
        graph = graph_factory(case, seed=5)
        operands = operand_factory(graph, op, shape, dtype, seed=11, device=device)
        out = check(
            graph,
            op,
            operands,
            schedule(op, strategy, KNOBS[kind][knobs], operands),
            check_close,
            isolated,
            dtype,
            f"on {case}",
        )
        assert out.dtype == dtype


FLOAT64_EXPRESSIONS = {
    "leaky_relu_derivative": Expr.input(0) * (0.2 + 0.8 * Expr.apply("gt", Expr.input(0) - Expr.input(1), 0.0)),
    "sigmoid_of_comparison": Expr.input(0) * Expr.apply("sigmoid", Expr.apply("eq", Expr.input(1), Expr.input(1))),
}


@pytest.mark.parametrize("expression", FLOAT64_EXPRESSIONS)
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_float64_constants_keep_float64_precision(strategy, expression, device, graph_factory, check_close, isolated):
    """Constants that float32 cannot hold and a comparison's 0/1 values, in a float64 kernel: Triton
    types both float32, so GAT's leaky_relu derivative ``0.2 + 0.8 * gt(s, 0)`` and a function of a
    comparison computed in float32, ~1e-8 off, past float64's tolerance (GAT's float64 gradients)."""
    graph = graph_factory("mixed")
    op = OpInfo(FLOAT64_EXPRESSIONS[expression], "sum", operands=("src_v", "dst_v"))
    generator = torch.Generator().manual_seed(0)
    operands = [
        torch.randn(rows, 6, generator=generator, dtype=torch.float64).to(device)
        for rows in (graph.num_src, graph.num_dst)
    ]
    check(graph, op, operands, small_blocks(strategy, block_f=8), check_close, isolated)


def test_mixed_operand_dtypes(device, graph_factory, operand_factory, check_close, isolated):
    graph = graph_factory("mixed")
    op = OpInfo.from_name("u_mul_e_sum")
    x, w = operand_factory(graph, op, device=device)
    for strategy in ("vertex", "edge", "group"):
        operands = [x.half(), w]
        out = check(graph, op, operands, small_blocks(strategy, block_f=8), check_close, isolated, torch.float16)
        assert out.dtype == torch.float32


@pytest.mark.parametrize(
    "strategy,name",
    [
        ("vertex", "u_mul_e_sum"),
        ("edge", "copy_e_max"),
        ("group", "u_sub_v_mean"),
        ("group", "e_div_u_min"),
        ("vertex", "u_dot_v"),
        ("edge", "e_add_v"),
        ("group", "u_dot_v"),
    ],
)
def test_int64_indices(strategy, name, device, graph_factory, operand_factory, check_close, isolated):
    """The int64 index path (what a graph past 2^31 edges uses), forced on a small graph."""
    graph = graph_factory("hub", index_dtype=torch.int64)
    assert all(t.dtype == torch.int64 for t in graph.structure(device).flat())
    op = OpInfo.from_name(name)
    operands = operand_factory(graph, op, "heads", device=device)
    info = small_blocks(strategy, block_f=8, **({"group_size": 4, "block_e": 2} if strategy == "group" else {}))
    check(graph, op, operands, info, check_close, isolated)


@pytest.mark.parametrize(
    "strategy,name",
    [
        ("vertex", "u_mul_e_sum"),
        ("edge", "e_sub_u_max"),
        ("group", "u_div_v_mean"),
        ("vertex", "u_dot_v"),
        ("edge", "e_add_v"),
        ("group", "u_sub_v"),
    ],
)
def test_int64_offsets(strategy, name, monkeypatch, device, graph_factory, operand_factory, check_close, isolated):
    """The int64 offset path (row x stride past 2^31), forced by lowering the limit."""
    sources = []
    load = dispatch.load_kernel
    dispatch._kernel.cache_clear()  # every kernel of this test is generated (and seen) afresh
    monkeypatch.setattr(dispatch, "_INT32_LIMIT", 0)
    monkeypatch.setattr(dispatch, "load_kernel", lambda source, name: sources.append(source) or load(source, name))
    graph = graph_factory("mixed")
    op = OpInfo.from_name(name)
    operands = operand_factory(graph, op, "vector", device=device)
    info = small_blocks(strategy, block_f=4, **({"group_size": 4, "block_e": 2} if strategy == "group" else {}))
    check(graph, op, operands, info, check_close, isolated)
    assert sources and all("wide=True" in s and ".to(tl.int64)" in s for s in sources)


@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_narrow_and_strided_edge_operands(strategy, device, graph_factory, check_close, isolated):
    """Edge operands are read through the edge id on first use (narrow ones in CSR order once
    reused: see test_reused_narrow_edge_operand); operands may be non-contiguous views, and an
    in-place write is seen."""
    graph = graph_factory("hub")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_src, 8, generator=gen).to(device)
    wide = torch.randn(graph.num_edges, 16, generator=gen).to(device)
    op = OpInfo.from_name("u_mul_e_sum")
    for w in (wide[:, :8], wide[:, 3:4], wide[:, ::2]):
        info = small_blocks(strategy, block_f=8, **({"group_size": 4, "block_e": 2} if strategy == "group" else {}))
        check(graph, op, [x, w], info, check_close, isolated, context=f"edge operand stride {w.stride()}")
    narrow = wide[:, :1].clone()
    first = ug.compute(graph, op, x, narrow, parallel_info=small_blocks(strategy, block_f=8))
    narrow.mul_(2)  # in place: the cached CSR-ordered copy must not be reused
    second = ug.compute(graph, op, x, narrow, parallel_info=small_blocks(strategy, block_f=8))
    check_close(second, 2 * first)


@pytest.mark.parametrize(
    "strategy,name",
    [
        ("vertex", "u_mul_e_sum"),
        ("edge", "u_mul_e_max"),
        ("group", "e_sub_v_mean"),
        ("vertex", "e_add_v"),
        ("group", "e_mul_v"),
    ],
)
def test_reused_narrow_edge_operand(
    strategy, name, graph_case, device, graph_factory, check_close, isolated, monkeypatch
):
    """A narrow edge operand seen a second time is read in CSR order (permuted once): both reads
    equal the reference, on every graph case."""
    graph = graph_factory(graph_case)
    gen = torch.Generator().manual_seed(3)
    op = OpInfo.from_name(name)
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    operands = [torch.randn(rows[kind], 4, generator=gen).to(device) for kind in op.inputs]
    permuted = []
    permute = dispatch.in_csr_order
    monkeypatch.setattr(dispatch, "in_csr_order", lambda t, eid: permuted.append(t) or permute(t, eid))
    knobs = {"group_size": 4, "block_e": 2} if strategy == "group" else {}
    info = small_blocks(strategy, block_f=4, **knobs)
    check(graph, op, operands, info, check_close, isolated, context="first read (through the edge id)")
    assert not permuted
    check(graph, op, operands, info, check_close, isolated, context="second read (CSR order)")
    assert permuted


def test_a_weight_on_a_graph_and_its_reverse_keeps_both_orders(graph_case, device, graph_factory, check_close):
    """A static weight read on a graph and (as a backward does) on the reversed graph is read in
    the CSR order of each once it came back there, permuted once per graph, right every time; a
    write to it drops its copies; a third graph evicts the oldest."""
    from pyg_ugrapher.ops import graph_arrays

    graph = graph_factory(graph_case)
    reverse = ug.GraphTensor(graph.dst, graph.src, graph.num_dst, graph.num_src)
    structure = graph.structure(device)
    op = OpInfo.from_name("u_mul_e_sum")
    info = small_blocks("vertex", block_f=4)
    gen = torch.Generator().manual_seed(5)
    weight = torch.rand(graph.num_edges, 1, generator=gen).to(device)
    x = {
        "forward": torch.randn(graph.num_src, 4, generator=gen).to(device),
        "reverse": torch.randn(graph.num_dst, 4, generator=gen).to(device),
    }
    arrays = {"forward": graph_arrays(structure), "reverse": graph_arrays(structure.reverse())}
    oracle = {"forward": graph, "reverse": reverse}

    def read(way):
        operands = [x[way], weight]
        layout = infer_layout(op, [t.shape for t in operands])
        out = dispatch.run(op, layout, arrays[way], operands, info)
        check_close(
            out, reference.execute(oracle[way], op, [t.double() for t in operands]).float(), context=f"{way} read"
        )

    def copies():
        return {id(eid): permuted for eid, _, permuted in dispatch._PERMUTED[weight]}

    for _ in range(2):
        read("forward")
        read("reverse")
    first = copies()
    assert len(first) == 2 and all(p is not None for p in first.values())
    read("forward")
    read("reverse")
    assert all(copies()[key] is first[key] for key in first)  # each order permuted once
    weight.mul_(2)
    read("forward")
    assert [p for p in copies().values()] == [None]
    read("forward")
    read("reverse")
    third = ug.GraphTensor(graph.src, graph.dst, graph.num_src, graph.num_dst)
    third_arrays = graph_arrays(third.structure(device))
    dispatch.is_reused(weight, third_arrays.csr.eid)
    assert len(dispatch._PERMUTED[weight]) == 2
    assert dispatch._PERMUTED[weight][-1][0] is third_arrays.csr.eid


def test_poison_catches_unwritten_outputs(monkeypatch, device, graph_factory, operand_factory):
    """The poison works: a template that writes nothing leaves NaN everywhere."""
    graph = graph_factory("mixed")
    op = OpInfo.from_name("copy_u_sum")
    monkeypatch.setattr(dispatch.TEMPLATES[("gather", "vertex")], "launch", lambda *args, **kwargs: None)
    out = ug.compute(
        graph, op, *operand_factory(graph, op, device=device), parallel_info=small_blocks("vertex", block_f=8)
    )
    assert torch.isnan(out).all()


@pytest.mark.parametrize("name,identity", [("copy_u_sum", 0.0), ("copy_u_max", -math.inf)])
def test_group_initialises_only_split_rows(name, identity, monkeypatch, device, graph_factory, operand_factory):
    """Neighbour groups initialise only the rows split into several chunks (their partial results
    meet through atomics): every other row is the kernel's to store, so the poison reaches it."""
    graph = graph_factory("hub")
    op = OpInfo.from_name(name)
    monkeypatch.setattr(dispatch.TEMPLATES[("gather", "group")], "launch", lambda *args, **kwargs: None)
    out = ug.compute(
        graph,
        op,
        *operand_factory(graph, op, device=device),
        parallel_info=small_blocks("group", group_size=4, block_v=2, block_e=2, block_f=8),
    )
    split = torch.bincount(graph.dst, minlength=graph.num_dst).to(out.device) > 4
    assert split.any() and not split.all()
    assert torch.isnan(out[~split]).all()
    assert (out[split] == identity).all()


NAN_CASES = [
    (gather, strategy, knobs)
    for gather in ("max", "min")
    for strategy in ("vertex", "edge", "group")
    for knobs in range(3)
]
#: One dtype per knob set: float32 and float64 atomics write a NaN through integers of their width,
#: bfloat16 accumulates in float32.
NAN_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _with_nans(x: torch.Tensor, graph: ug.GraphTensor, seed: int) -> torch.Tensor:
    """``x`` (source features) with about a fifth of its elements NaN, of either sign bit (a float
    atomic max or min treats the two differently), and every feature of one source NaN whose
    destination has no other in-edge: that row's only message is NaN."""
    generator = torch.Generator().manual_seed(seed)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    signed = torch.where(torch.rand(x.shape, generator=generator) < 0.5, nan, nan.neg())
    x = torch.where(torch.rand(x.shape, generator=generator) < 0.2, signed, x.cpu().double())
    lonely = (torch.bincount(graph.dst, minlength=graph.num_dst) == 1).nonzero().flatten()
    assert lonely.numel(), "the graph needs a destination of in-degree 1"
    x[graph.src[(graph.dst == lonely[0]).nonzero().flatten()]] = nan
    return x


@pytest.mark.parametrize("gather,strategy,knobs", NAN_CASES, ids=[f"{g}-{s}-{k}" for g, s, k in NAN_CASES])
def test_max_and_min_propagate_nan(
    gather, strategy, knobs, edge_order, device, graph_factory, operand_factory, check_close, isolated
):
    """A NaN message makes its row's max or min NaN, as torch's ``scatter_reduce`` (PyG's max
    aggregation) has it, whichever template, tile and dtype: in registers, in the edge-parallel
    scan, and through the atomics that combine a split row's or a crossing run's partial results.
    Triton's maximum dropped NaN: such rows took their other messages' max, a row whose only
    message was NaN came out -inf."""
    graph = graph_factory("mixed", seed=knobs)
    op = OpInfo.from_name(f"copy_u_{gather}")
    dtype = NAN_DTYPES[knobs]
    x = _with_nans(operand_factory(graph, op, dtype=torch.float64, seed=knobs)[0], graph, seed=knobs)
    info = schedule(op, strategy, KNOBS[("gather", strategy)][knobs], [x])
    out = ug.compute(graph, op, x.to(dtype=dtype, device=device), parallel_info=info).cpu()
    expected = reference.execute(graph, op, [x.to(dtype).double()]).to(dtype)
    assert torch.isnan(expected).any() and not torch.isnan(expected).all()
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), f"NaN elements differ under {info}"
    check_close(out.nan_to_num(0.0), expected.nan_to_num(0.0), context=f"under {info}")
    assert torch.equal(out[isolated(graph)], torch.zeros_like(out[isolated(graph)]))


@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_elementwise_max_min_and_relu_propagate_nan(strategy, device, graph_factory, check_close):
    """``maximum``, ``minimum`` and ``relu`` of a NaN are NaN in a message, as in torch."""
    graph = graph_factory("mixed")
    u, v = Expr.input(0), Expr.input(1)
    expr = Expr.apply("maximum", u, v) + Expr.apply("minimum", v, u) + Expr.apply("relu", u)
    op = OpInfo(expr, None, operands=("src_v", "dst_v"))
    generator = torch.Generator().manual_seed(0)
    operands = [
        torch.randn(rows, 6, generator=generator, dtype=torch.float64) for rows in (graph.num_src, graph.num_dst)
    ]
    operands[0][::3, 1] = math.nan
    operands[1][1::4, 4] = math.nan
    out = ug.compute(
        graph, op, operands=[t.float().to(device) for t in operands], parallel_info=small_blocks(strategy, block_f=8)
    ).cpu()
    expected = reference.execute(graph, op, operands).float()
    assert torch.isnan(expected).any()
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    check_close(out.nan_to_num(0.0), expected.nan_to_num(0.0))


# -- large graphs, on the GPU only ---------------------------------------------------------------
def _large_graphs(device):
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    uniform = torch.randint(0, n, (2, 100_000), generator=gen)
    hub = torch.randint(0, n, (2, 150_000), generator=gen)
    hub[1, :100_000] = 0  # one destination with 100k in-edges
    hub[0, 100_000:110_000] = 0  # and 10k out-edges (the backward's reversed graph)
    return {
        "uniform": ug.GraphTensor.from_edge_index(uniform.to(device), n),
        "hub": ug.GraphTensor.from_edge_index(hub.to(device), n),
    }


LARGE = [
    (strategy, name)
    for strategy in ("vertex", "edge", "group")
    for name in ("copy_u_sum", "u_mul_e_sum", "copy_u_max", "u_add_v_min", "e_div_v_mean")
] + [(strategy, name) for strategy in ("vertex", "edge", "group") for name in ("u_dot_v", "u_add_v")]


@pytest.mark.cuda
@pytest.mark.parametrize("strategy,name", LARGE, ids=[f"{s}-{n}" for s, n in LARGE])
def test_large_graphs(strategy, name, edge_order, device, operand_factory, check_close, isolated):
    op = OpInfo.from_name(name)
    for case, graph in _large_graphs(device).items():
        for shape, dtype, block_f in (
            ("vector", torch.float32, 8),
            ("heads", torch.float32, 8),
            ("vector", torch.bfloat16, 4),
        ):
            operands = operand_factory(graph, op, shape, dtype, seed=1, device=device)
            knobs = {"group_size": 128, "block_e": 16} if strategy == "group" else {}
            check(
                graph,
                op,
                operands,
                small_blocks(strategy, block_f=block_f, **knobs),
                check_close,
                isolated,
                dtype,
                f"on the large {case} graph",
            )


@pytest.mark.parametrize(
    "strategy,name,expected",
    [
        ("vertex", "u_mul_e_sum", "vertex_parallel_sum_mul_u_e"),
        ("group", "copy_u_max", "neighbor_group_max_u"),
        ("edge", "u_dot_v", "edge_message_message_mul_u_v"),
        ("group", "u_add_v", "group_message_message_add_u_v"),
    ],
)
def test_kernels_are_named_after_what_they_compute(
    strategy, name, expected, device, graph_factory, operand_factory, monkeypatch
):
    """Profilers list kernels by function name: template, gather and edge function, not ``kernel``."""
    names = []
    load = dispatch.load_kernel
    dispatch._kernel.cache_clear()
    monkeypatch.setattr(dispatch, "load_kernel", lambda source, kernel: names.append(kernel) or load(source, kernel))
    graph = graph_factory("mixed")
    op = OpInfo.from_name(name)
    operands = operand_factory(graph, op, "vector", device=device)
    ug.compute(graph, op, *operands, parallel_info=small_blocks(strategy, block_f=4))
    assert names == [expected]


HEAD_LAYOUTS = [(3, 4), (2, 8), (4, 3)]  # (H, C): tiles inside a head, of whole heads, or neither
HEAD_OPS = [
    ("vertex", "u_mul_e_sum"),
    ("edge", "u_mul_e_sum"),
    ("group", "e_sub_u_max"),
    ("vertex", "e_add_u"),
    ("edge", "u_mul_e"),
    ("group", "e_mul_v"),
]


@pytest.mark.parametrize("strategy,name", HEAD_OPS)
@pytest.mark.parametrize("heads,inner", HEAD_LAYOUTS)
def test_per_head_edge_operands_under_every_head_tiling(
    strategy, name, heads, inner, device, graph_factory, check_close, isolated
):
    """GAT's layout, ``[E, H, 1]`` edge weights with ``[N, H, C]`` features, under feature tiles
    inside one head, spanning whole heads (the last one partly past ``H``) and cutting heads, on
    a graph without edges, one with isolated vertices and one with a hub."""
    op = OpInfo.from_name(name)
    seen = set()
    for case in ("empty", "isolated", "hub"):
        graph = graph_factory(case, seed=5)
        generator = torch.Generator().manual_seed(heads * inner)
        rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
        operands = [
            torch.rand((rows[kind], heads, 1 if kind == "edge" else inner), generator=generator).to(device)
            for kind in op.inputs
        ]
        layout = infer_layout(op, [t.shape for t in operands])
        for block_f in (1, 4, 8, 16):
            seen.add(dispatch.head_tiling(layout.message_width, inner, block_f))
            knobs = dict(block_f=block_f, **({"group_size": 4, "block_e": 2} if strategy == "group" else {}))
            check(
                graph,
                op,
                operands,
                small_blocks(strategy, **knobs),
                check_close,
                isolated,
                context=f"on {case}, H={heads} C={inner} block_f={block_f}",
            )
    expected = {(3, 4): {(4, False), (4, True)}, (2, 8): {(8, False), (8, True)}, (4, 3): {(3, False), (0, False)}}
    assert seen == expected[(heads, inner)]


def _attention_like(gather_op):
    """``x_u * exp(a_u + b_v - c_e)``: GAT's weighted message, per-head operands of every kind."""
    x, a, b, c = (Expr.input(i) for i in range(4))
    return OpInfo(x * Expr.apply("exp", a + b - c), gather_op, operands=("src_v", "src_v", "dst_v", "edge"))


@pytest.mark.parametrize("gather_op", [None, "sum", "max"])
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_whole_head_tiles_compute_per_head_operands_once_per_head(
    strategy, gather_op, device, graph_factory, check_close, isolated
):
    """Tiles of whole heads load each per-head operand (source, destination or edge) once per head
    and evaluate what reads only them at that width, then broadcast over the head's features:
    against the reference on every graph shape, with two heads per tile, four, and a last tile
    partly past ``H``."""
    op = _attention_like(gather_op)
    for (heads, inner), block_f in (((4, 8), 16), ((4, 8), 32), ((3, 8), 16)):
        for case in ("empty", "isolated", "self_loops", "hub", "bipartite"):
            graph = graph_factory(case, seed=7)
            generator = torch.Generator().manual_seed(heads + block_f)
            rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
            operands = [
                torch.randn((rows[kind], heads, inner if k == 0 else 1), generator=generator).to(device)
                for k, kind in enumerate(op.inputs)
            ]
            layout = infer_layout(op, [t.shape for t in operands])
            assert dispatch.head_tiling(layout.message_width, inner, block_f) == (inner, True)
            source = dispatch.kernel_source(op, layout, small_blocks(strategy, block_f=block_f))
            assert "hs[:, None]" in source and "// C" not in source, "per-head operands loaded per feature"
            knobs = dict(block_f=block_f, **({"group_size": 4, "block_e": 2} if strategy == "group" else {}))
            check(
                graph,
                op,
                operands,
                small_blocks(strategy, **knobs),
                check_close,
                isolated,
                context=f"on {case}, H={heads} C={inner} block_f={block_f}",
            )


@pytest.mark.parametrize("gather_op", GATHER_OPS)
@pytest.mark.parametrize("strategy", ["edge", "group"])
def test_atomics_are_relaxed(strategy, gather_op):
    """Every atomic a gather's kernel issues (adds, and a max / min gather's NaN-aware pair) is
    relaxed: the rows it accumulates into are read only after the kernel, and the default order
    fences each atomic."""
    op = OpInfo(Expr.input(0), gather_op, operands=("src_v",))
    layout = infer_layout(op, [(5, 16)])
    source = dispatch.kernel_source(op, layout, small_blocks(strategy, block_f=16))
    atomics = source.count("tl.atomic_")
    assert atomics, f"no atomic in the {strategy} kernel of a {gather_op} gather"
    assert source.count('sem="relaxed"') == atomics, source
