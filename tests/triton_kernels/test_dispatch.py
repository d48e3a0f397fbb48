"""Launch plans (``dispatch.prepare``): when a call may skip ``run``'s per-call work, and that the
plan's launch computes what ``run`` does, call after call, on fresh operands and on other graphs."""

import contextlib
import math

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.ops import graph_arrays
from pyg_ugrapher.structure import chunk_table, derived_cache, keeping_nothing
from triton_kernels import dispatch
from triton_kernels.csr_pair import grouped

pytestmark = pytest.mark.usefixtures("poison")

CASES = [  # op, operand layout, dtype, schedule
    ("copy_u_sum", "vector", torch.float32, ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4)),
    (
        "u_mul_v_max",
        "head_bcast",
        torch.float32,
        ug.ParallelInfo("group", group_size=3, block_v=2, block_e=2, block_f=4, num_warps=4),
    ),
    ("u_dot_v", "heads", torch.float32, ug.ParallelInfo("edge", block_e=8, block_f=4, num_warps=4)),
    ("u_sub_v_min", "vector", torch.float16, ug.ParallelInfo("edge", block_e=8, block_f=8, num_warps=1)),
    ("copy_u_mean", "scalar", torch.bfloat16, ug.ParallelInfo("vertex", block_v=1, block_e=4, block_f=1, num_warps=4)),
]


def _arrays_of(graph, device):
    return graph_arrays(graph.structure(device))


@pytest.mark.parametrize("name,shape,dtype,info", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_run_and_the_reference(
    name, shape, dtype, info, edge_order, device, graph_factory, operand_factory, check_close
):
    graph = graph_factory("mixed")
    op = OpInfo.from_name(name)
    first = operand_factory(graph, op, shape, dtype=dtype, device=device)
    layout = infer_layout(op, [t.shape for t in first])
    out_dtype = reference.result_dtype(first)
    plan = dispatch.prepare(op, layout, first, info, out_dtype)
    assert isinstance(plan, dispatch.Plan)
    # The plan serves later calls, with other values, and other graphs (of other sizes).
    for case, seed in (("mixed", 1), ("mixed", 2), ("hub", 3), ("bipartite", 4), ("isolated", 5)):
        on = graph_factory(case)
        operands = operand_factory(on, op, shape, dtype=dtype, seed=seed, device=device)
        planned = plan(_arrays_of(on, device), operands)
        expected = reference.execute(on, op, [t.double() for t in operands]).to(out_dtype)
        assert planned.dtype == out_dtype and planned.shape == expected.shape
        check_close(planned, expected, dtype, f"{name} planned on {case}, seed {seed}")
        check_close(planned, dispatch.run(op, layout, _arrays_of(on, device), operands, info, out_dtype), dtype)


def _row_strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as every other row-block of a wider tensor whose other half is NaN: packed
    rows that are not contiguous, and a kernel reading past a row would take a NaN."""
    wide = torch.full((t.shape[0], 2) + t.shape[1:], float("nan"), dtype=t.dtype, device=t.device)
    wide[:, 1] = t
    return wide[:, 1]


def test_packed_rows():
    x = torch.randn(5, 4, 3)
    assert dispatch.packed_rows(x) and dispatch.packed_rows(_row_strided(x))
    assert dispatch.packed_rows(torch.randn(5, 2)[:, 1])  # one value per row, any row stride
    assert dispatch.packed_rows(torch.randn(5, 2, 4).unbind(1)[0].unsqueeze(-1))
    assert dispatch.packed_rows(torch.randn(0, 3)) and dispatch.packed_rows(torch.randn(5, 1, 3)[:, :, :1])
    assert not dispatch.packed_rows(x.transpose(1, 2))
    assert not dispatch.packed_rows(x[:, :, :2])  # rows of two runs
    assert not dispatch.packed_rows(x[:, ::2])


@pytest.mark.parametrize("name,shape,dtype,info", CASES, ids=[c[0] for c in CASES])
def test_plan_reads_row_strided_operands(name, shape, dtype, info, device, graph_factory, operand_factory, check_close):
    """Operands that are views into wider rows get a plan, which reads their rows and nothing
    between them, on a hub, on isolated vertices; a graph without edges is left to ``run``."""
    op = OpInfo.from_name(name)
    plan = None
    for case, seed in (("hub", 6), ("isolated", 7), ("empty", 8)):
        graph = graph_factory(case)
        operands = [_row_strided(t) for t in operand_factory(graph, op, shape, dtype=dtype, seed=seed, device=device)]
        if plan is None:
            assert not all(t.is_contiguous() for t in operands if t.dim() > 1 or t.shape[0] > 1)
            out_dtype = reference.result_dtype(operands)
            plan = dispatch.prepare(op, infer_layout(op, [t.shape for t in operands]), operands, info, out_dtype)
            assert isinstance(plan, dispatch.Plan)
        planned = plan(_arrays_of(graph, device), operands)
        if case == "empty":
            assert planned is None
            continue
        expected = reference.execute(graph, op, [t.double() for t in operands]).to(out_dtype)
        check_close(planned, expected, dtype, f"{name} planned on {case}, row-strided")


def test_no_plan_where_each_call_must_decide(device, graph_factory, operand_factory, check_close):
    """Invalid schedules get no plan; a graph without edges, and a narrow edge operand that comes
    back to a plan made for first calls (read in CSR order from then on), are left to ``run``."""
    graph = graph_factory("mixed")
    arrays = _arrays_of(graph, device)
    vertex = ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4)

    def plan_for(name, operands, info=vertex):
        op = OpInfo.from_name(name)
        layout = infer_layout(op, [t.shape for t in operands])
        return dispatch.prepare(op, layout, operands, info, torch.float32)

    op = OpInfo.from_name("u_mul_e_sum")
    x, weight = operand_factory(graph, op, "row_bcast", device=device)
    weighted = plan_for("u_mul_e_sum", [x, weight])
    expected = reference.execute(graph, op, [x.double(), weight.double()]).float()
    check_close(weighted(arrays, [x, weight]), expected)  # first seen: through the plan, marked
    assert dispatch.seen(weight, arrays.csr.eid)
    assert weighted(arrays, [x, weight]) is None  # back again: run permutes it
    empty = graph_factory("empty")
    (x_empty,) = operand_factory(empty, OpInfo.from_name("copy_u_sum"), "vector", device=device)
    assert plan_for("copy_u_sum", [x])(_arrays_of(empty, device), [x_empty]) is None
    with pytest.raises(ValueError, match="^block_f:"):
        plan_for("copy_u_sum", [x[:, :1, :1].contiguous()], vertex.with_knobs(block_f=64))
    with pytest.raises(ValueError, match="^parallel_info: .* unset"):  # kernels run complete schedules only
        plan_for("copy_u_sum", [x], ug.ParallelInfo("vertex", block_f=4))


@pytest.mark.parametrize(
    "info",
    [
        ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4),
        ug.ParallelInfo("edge", block_e=8, block_f=4, num_warps=4),
        ug.ParallelInfo("group", group_size=3, block_v=2, block_e=2, block_f=4, num_warps=4),
    ],
    ids=["vertex", "edge", "group"],
)
@pytest.mark.parametrize("case", ["hub", "isolated"])
def test_plan_for_reused_operands_reads_them_in_csr_order(
    info, case, device, graph_factory, operand_factory, check_close
):
    """A plan made for a narrow edge operand that comes back (a static weight, every step) reads
    it in CSR order, as ``run`` does, on this graph and on its reverse; a tensor it has not seen
    yet is left to ``run``, which marks it, and so is a graph without edges."""
    op = OpInfo.from_name("u_mul_e_sum")
    graph = graph_factory(case)
    x, weight = operand_factory(graph, op, "row_bcast", device=device)
    layout = infer_layout(op, [x.shape, weight.shape])
    plan = dispatch.prepare(op, layout, [x, weight], info, torch.float32, reused=(False, True))
    assert plan.in_csr == (False, True)
    structure = graph.structure(device)
    for on, arrays in ((graph, graph_arrays(structure)), (graph.reverse(), graph_arrays(structure.reverse()))):
        x_on, _ = operand_factory(on, op, "row_bcast", device=device)
        assert plan(arrays, [x_on, weight]) is None  # not seen on this graph yet
        check_close(dispatch.run(op, layout, arrays, [x_on, weight], info), reference.execute(on, op, [x_on, weight]))
        assert dispatch.seen(weight, arrays.csr.eid)
        for seed in (1, 2):
            x_on, _ = operand_factory(on, op, "row_bcast", seed=seed, device=device)
            check_close(
                plan(arrays, [x_on, weight]),
                reference.execute(on, op, [x_on, weight]),
                None,
                f"planned in CSR order, seed {seed}",
            )
    permuted = {id(eid): t for eid, _, t in dispatch._PERMUTED[weight]}
    assert len(permuted) == 2 and all(t is not None for t in permuted.values())
    empty = graph_factory("empty")
    x_empty, w_empty = operand_factory(empty, op, "row_bcast", device=device)
    assert plan(_arrays_of(empty, device), [x_empty, w_empty]) is None


@pytest.mark.parametrize(
    "info",
    [
        ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4),
        ug.ParallelInfo("group", group_size=3, block_v=2, block_e=2, block_f=4, num_warps=4),
    ],
    ids=["vertex", "group"],
)
def test_a_copy_read_as_its_original_is_read_in_its_csr_order(
    info, device, graph_factory, operand_factory, check_close
):
    """A :func:`read_as` copy of a weight that came back (a compiled graph's copy of a cached
    weight, a new tensor every call) comes back too, and is read from the rows of the original
    permuted once; a copy changed in place, or one that requires grad, is read as itself."""
    op = OpInfo.from_name("u_mul_e_sum")
    graph = graph_factory("mixed")
    x, weight = operand_factory(graph, op, "row_bcast", device=device)
    layout = infer_layout(op, [x.shape, weight.shape])
    arrays = _arrays_of(graph, device)
    eid = arrays.csr.eid
    expected = reference.execute(graph, op, [x, weight])
    check_close(dispatch.run(op, layout, arrays, [x, weight], info), expected, None, "first read marks the weight")
    plan = dispatch.prepare(op, layout, [x, weight], info, torch.float32, reused=(False, True))
    rows = []
    for call in range(3):
        copy = weight.clone()
        dispatch.read_as(copy, weight)
        assert dispatch.seen(copy, eid)
        check_close(plan(arrays, [x, copy]), expected, None, f"copy {call}")
        [(_, _, permuted)] = dispatch._PERMUTED[weight]
        rows.append(permuted)
        assert dispatch._PERMUTED.get(copy) is None
    assert rows[0] is not None and rows[0] is rows[1] is rows[2]

    changed = weight.clone()
    dispatch.read_as(changed, weight)
    changed.mul_(-2.0)
    assert not dispatch.seen(changed, eid)
    check_close(
        dispatch.run(op, layout, arrays, [x, changed], info),
        reference.execute(graph, op, [x, changed]),
        None,
        "changed",
    )
    trained = weight.clone().requires_grad_()
    dispatch.read_as(trained, weight)
    assert not dispatch.seen(trained, eid) and dispatch._COPIES.get(trained) is None


@pytest.mark.parametrize(
    "info",
    [
        ug.ParallelInfo("edge", block_e=8, block_f=4, num_warps=4),
        ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4),
    ],
    ids=["edge", "vertex"],
)
def test_reused_operands_on_a_user_order_structure(
    info, user_order, device, graph_factory, operand_factory, check_close, monkeypatch
):
    """On a structure in the user's order a CSR position is an edge id: an edge-parallel kernel
    reads a reused narrow edge operand as it is, never permuted, through ``run`` and through a
    plan; a template that walks rows reads it in the order of the structure grouped by row."""
    op = OpInfo.from_name("u_mul_e_sum")
    graph = graph_factory("hub")
    x, weight = operand_factory(graph, op, "row_bcast", device=device)
    layout = infer_layout(op, [x.shape, weight.shape])
    arrays = _arrays_of(graph, device)
    assert arrays.csr.user_order
    permuted = []
    permute = dispatch.in_csr_order
    monkeypatch.setattr(dispatch, "in_csr_order", lambda t, eid: permuted.append(eid) or permute(t, eid))
    plan = dispatch.prepare(op, layout, [x, weight], info, torch.float32, reused=(False, True))
    expected = reference.execute(graph, op, [x, weight])
    check_close(dispatch.run(op, layout, arrays, [x, weight], info), expected, None, "first read")
    for call in range(2):
        check_close(plan(arrays, [x, weight]), expected, None, f"planned read {call}")
        check_close(dispatch.run(op, layout, arrays, [x, weight], info), expected, None, f"read {call}")
    if info.strategy == "edge":
        assert not permuted
    else:
        assert permuted and all(eid is grouped(arrays.csr).eid for eid in permuted)


@pytest.mark.parametrize(
    "name,case,shape,schedule,calls,paths",
    [
        (
            "copy_u_max",
            "hub",
            (6, 4),
            ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=8, num_warps=4).serialize(),
            lambda x, w: ([x], [x.transpose(1, 2)], [_row_strided(x)]),
            ["plan", "run", "plan"],
        ),
        (
            "copy_u_sum",
            "mixed",
            (8,),
            "auto",
            lambda x, w: ([x.sum().expand_as(x)], [x], [x * 2]),
            ["run", "plan", "plan"],
        ),
        ("u_mul_e_sum", "hub", (8,), "auto", lambda x, w: ([x, w], [x * 2, w], [x * 3, w]), ["plan", "plan", "plan"]),
    ],
    ids=["packed", "first-call-unpacked", "static-weight"],
)
def test_operators_take_the_plan_only_for_packed_operands(
    name, case, shape, schedule, calls, paths, monkeypatch, interpret, graph_factory, check_close
):
    """``run_graph_op`` launches through the decision's plan when the operands are packed rows, and
    through ``run`` otherwise; both give the reference's result. A decision first made for operands
    whose rows are not packed (the expanded gradient of ``out.sum()``) still gets a plan, which
    later calls with packed operands take; so does a static edge weight that comes back (read in
    CSR order from its second call on)."""
    from pyg_ugrapher.ops import run_graph_op, serialized

    graph = graph_factory(case)
    op = OpInfo.from_name(name)
    structure = graph.structure(torch.device("cpu"))
    through = []
    monkeypatch.setattr(
        dispatch.Plan,
        "__call__",
        lambda self, *args, _call=dispatch.Plan.__call__: through.append("plan") or _call(self, *args),
    )
    monkeypatch.setattr(
        dispatch,
        "_launch",
        lambda *args, _launch=dispatch._launch, **kwargs: through.append("run") or _launch(*args, **kwargs),
    )
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((graph.num_src,) + shape, generator=generator)
    weight = torch.rand(graph.num_edges, generator=generator)
    for operands in calls(x, weight):
        check_close(run_graph_op(structure, operands, serialized(op), schedule), reference.execute(graph, op, operands))
    assert through == paths
    assert name != "u_mul_e_sum" or dispatch._PERMUTED[weight][-1][2] is not None  # read in CSR order


def test_atomic_max_and_min_start_rows_from_a_cached_identity(device, graph_factory, operand_factory, check_close):
    """Edge-parallel max and min start rows with edges at the identity and empty rows at 0. That
    start depends on the structure alone and is kept with it, one per identity and dtype: calls in
    other dtypes, and a min after a max, on one structure get the start of their own."""
    graph = graph_factory("isolated")
    arrays = _arrays_of(graph, device)
    cache = derived_cache(arrays.csr.rowptr)
    # One feature first: the start is then a contiguous view of the kept rows, which the output
    # must not be (the kernel writes into it).
    for round_, shape in enumerate(("scalar", "vector", "scalar")):
        info = ug.ParallelInfo("edge", block_e=8, block_f=1 if shape == "scalar" else 4, num_warps=4)
        for name, dtype in (
            ("u_sub_v_max", torch.float32),
            ("u_sub_v_max", torch.float16),
            ("u_sub_v_min", torch.float32),
        ):
            op = OpInfo.from_name(name)
            operands = operand_factory(graph, op, shape, dtype=dtype, seed=round_, device=device)
            layout = infer_layout(op, [t.shape for t in operands])
            out = dispatch.run(op, layout, arrays, operands, info, dtype)
            expected = reference.execute(graph, op, [t.double() for t in operands]).to(dtype)
            check_close(out, expected, dtype, f"{name} {dtype}, {shape}, call {round_}")
    starts = {key: value for key, value in cache.items() if key[0] == "row identities"}
    # a half output is combined in float32: it shares float32's start
    assert {(-math.inf, torch.float32), (math.inf, torch.float32)} <= {key[1:] for key in starts}
    for (_, identity, dtype), start in starts.items():
        assert start.dtype == dtype
        empty = arrays.csr.rowptr[1:] == arrays.csr.rowptr[:-1]
        assert empty.any() and bool((start[empty] == 0).all()) and bool((start[~empty] == identity).all())


def test_calls_keep_nothing_inside_keeping_nothing(device, graph_factory, operand_factory, check_close):
    """The recordable ops of a compiled graph run inside ``keeping_nothing`` (CUDA graphs refuse a
    tensor a cache kept from their memory): the same results, and no cache of the structure or of
    a reused edge operand takes an entry; outside the block the same calls fill them."""
    graph = graph_factory("isolated")
    arrays = _arrays_of(graph, device)
    cache = derived_cache(arrays.csr.rowptr)
    op = OpInfo.from_name("u_mul_e_max")
    operands = operand_factory(graph, op, "vector", seed=3, device=device)
    weight = operands[1]
    layout = infer_layout(op, [t.shape for t in operands])
    expected = reference.execute(graph, op, [t.double() for t in operands]).float()
    info = ug.ParallelInfo("edge", block_e=8, block_f=4, num_warps=4)
    group = ug.ParallelInfo("group", group_size=2, block_v=2, block_e=2, block_f=4, num_warps=4)
    for keep in (False, True):
        with contextlib.nullcontext() if keep else keeping_nothing():
            for call in range(2):  # the second call of a reused weight reads it in CSR order where kept
                for schedule in (info, group):
                    reused = dispatch.is_reused(weight, arrays.csr.eid)
                    out = dispatch.run(op, layout, arrays, operands, schedule, torch.float32)
                    check_close(out, expected, torch.float32, f"{schedule.strategy}, call {call}, kept {keep}")
        kept = [key for key in cache if key[0] in ("row identities", "chunks")]
        assert bool(kept) == keep, kept
        assert (dispatch._PERMUTED.get(weight) is not None) == keep
        assert reused == keep
    # What was kept before is read inside the block (a CUDA graph capture could not build it again).
    table = chunk_table(arrays.csr, 2)
    with keeping_nothing():
        assert chunk_table(arrays.csr, 2) is table
