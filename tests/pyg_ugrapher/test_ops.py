"""``ug.compute``: argument checking, where it runs, and ``torch.compile`` without graph breaks,
forward and backward."""

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ops import observe


@pytest.fixture
def graph(graph_factory):
    return graph_factory("mixed")


def _inputs(graph, width=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(graph.num_src, width, generator=gen), torch.randn(graph.num_edges, width, generator=gen)


def test_names_ops_and_edge_index(graph, check_close):
    x, w = _inputs(graph)
    expected = reference.execute(graph, ug.OpInfo.from_name("u_mul_e_sum"), [x, w])
    check_close(ug.compute(graph, "u_mul_e_sum", x, w), expected)
    check_close(ug.compute(graph, ug.OpInfo.from_name("u_mul_e_sum"), lhs=x, rhs=w), expected)
    check_close(ug.compute(graph.edge_index, "u_mul_e_sum", x, w, num_nodes=graph.num_src), expected)
    op = ug.OpInfo(ug.Expr.input(0) * ug.Expr.input(1), "sum", operands=("src_v", "edge"))
    check_close(ug.compute(graph, op, operands=[x, w]), expected)


def test_observers_see_every_call(graph):
    x, w = _inputs(graph)
    calls = []
    info = ug.ParallelInfo("edge", block_f=4)
    with observe(calls.append):
        ug.compute(graph, "u_mul_e_sum", x, w, parallel_info=info)
    ug.compute(graph, "copy_u_sum", x)
    assert len(calls) == 1 and calls[0].op.name == "u_mul_e_sum" and calls[0].parallel_info == info
    assert calls[0].graph is graph and calls[0].layout.message_shape == (4,)


@pytest.mark.parametrize(
    "call,error,field",
    [
        (lambda g, x, w: ug.compute(g, 3, x, w), TypeError, "op"),
        (lambda g, x, w: ug.compute(g, "u_pow_e_sum", x, w), ValueError, "name"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, w, parallel_info="vertex"), TypeError, "parallel_info"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, "copy_u_sum", x, w), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, "copy_u_sum", x, operands=[x]), ValueError, "operands"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, x), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x[:3], w), ValueError, "lhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x.long(), w), TypeError, "lhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, w.to(torch.complex64)), TypeError, "rhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, w.tolist()), TypeError, "rhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", torch.tensor(1.0), w), ValueError, "lhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, w.to("meta")), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, "u_mul_e_sum", x, w[:, :3]), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, "u_dot_v", x, x[:, :1]), ValueError, "rhs"),
        (lambda g, x, w: ug.compute(g, ug.OpInfo(ug.Expr.input(0), "sum", operands=("src_v",)), x), ValueError, "lhs"),
        (
            lambda g, x, w: ug.compute(g, ug.OpInfo(ug.Expr.input(0), "sum", operands=("src_v",)), operands=[x, w]),
            ValueError,
            "operands",
        ),
    ],
)
def test_argument_errors(graph, call, error, field):
    x, w = _inputs(graph)
    with pytest.raises(error, match=f"^{field}:"):
        call(graph, x, w)


def test_explicit_schedule_runs_the_backward_too(monkeypatch, interpret, graph):
    """An explicit schedule runs the backward ops where it is valid for them."""
    import triton_kernels
    from triton_kernels import dispatch

    seen = []
    run = triton_kernels.run
    monkeypatch.setattr(
        triton_kernels,
        "run",
        lambda op, layout, g, xs, info, dtype: seen.append(info) or run(op, layout, g, xs, info, dtype),
    )
    monkeypatch.setattr(
        dispatch.Plan,
        "__call__",
        lambda self, *args, _call=dispatch.Plan.__call__: seen.append(self.info) or _call(self, *args),
    )
    x, w = _inputs(graph)
    x.requires_grad_()
    info = ug.ParallelInfo("edge", block_e=16, block_f=4, num_warps=4)
    ug.compute(graph, "u_mul_e_sum", x, w, parallel_info=info).sum().backward()
    assert seen == [info, info]


def test_eager_calls_skip_the_custom_op(monkeypatch, interpret, graph, check_close):
    """Eager forward and backward run the kernels without dispatching the custom op (its host
    cost is as large as a kernel's on a 1e6-edge graph); the gradients stay the reference's."""
    from pyg_ugrapher.ops import custom_ops

    for name in ("graph_op", "recordable_graph_op"):  # the small test graph would take the twin
        monkeypatch.setattr(custom_ops, name, lambda *args: pytest.fail("the custom op was dispatched"))
    x, w = _inputs(graph)
    x.requires_grad_()
    w.requires_grad_()
    out = ug.compute(graph, "u_mul_e_max", x, w)
    grad = torch.randn_like(out)
    out.backward(grad)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    reference.execute(graph, ug.OpInfo.from_name("u_mul_e_max"), [xr, wr]).backward(grad)
    check_close(x.grad, xr.grad)
    check_close(w.grad, wr.grad)
    with torch.no_grad():
        check_close(
            ug.compute(graph, "copy_u_sum", x), reference.execute(graph, ug.OpInfo.from_name("copy_u_sum"), [x])
        )


def test_double_backward_stays_differentiable(interpret, graph, check_close):
    """With ``create_graph=True`` the backward's IR ops record their own backward."""
    x, w = _inputs(graph)
    op = ug.OpInfo.from_name("u_mul_e_sum")
    grads = []
    for run in (lambda a, b: ug.compute(graph, op, a, b), lambda a, b: reference.execute(graph, op, [a, b])):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        (ga,) = torch.autograd.grad(run(a, b).square().sum(), a, create_graph=True)
        grads.append(torch.autograd.grad(ga.sum(), b))
    check_close(grads[0][0], grads[1][0])


def test_cpu_default_is_the_reference(monkeypatch, graph):
    import triton_kernels

    monkeypatch.setattr(triton_kernels, "run", lambda *args: pytest.fail("a kernel ran without the interpreter"))
    x, w = _inputs(graph)
    ug.compute(graph, "u_mul_e_max", x, w)


MUL, MAX, DOT = (ug.OpInfo.from_name(n) for n in ("u_mul_e_sum", "copy_u_max", "u_dot_v"))


def test_torch_compile_without_graph_breaks(graph_factory, check_close):
    """fullgraph=True fails on any graph break; a second graph of another size reuses the
    compiled function (the graph is just tensors)."""
    torch._dynamo.reset()
    weight = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)

    def layer(graph, x, w):
        h = ug.compute(graph, MUL, x @ weight, w)
        return ug.compute(graph, MAX, torch.relu(h)) + ug.compute(graph, DOT, h, h).sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    for case in ("mixed", "hub"):
        graph = graph_factory(case)
        graph.structure()  # built outside: see test_torch_compile_builds_structures
        x, w = _inputs(graph, seed=1)
        x.requires_grad_()
        out = compiled(graph, x, w)
        (dx, dweight) = torch.autograd.grad(out.square().sum(), [x, weight])
        x_ref = x.detach().requires_grad_()
        ref = layer(graph, x_ref, w)
        (dx_ref, dweight_ref) = torch.autograd.grad(ref.square().sum(), [x_ref, weight])
        check_close(out.detach(), ref.detach(), context=case)
        check_close(dx, dx_ref, context=case)
        check_close(dweight, dweight_ref, context=case)


@pytest.mark.parametrize("by_name", [True, False])
def test_torch_compile_builds_structures(by_name, graph_factory, check_close):
    """An op given by name and a graph whose structure is not built yet compile without a graph
    break: names are looked up in a table, the structure is built by an op inside the graph."""
    torch._dynamo.reset()
    graph = graph_factory("mixed")
    x, w = _inputs(graph)
    out = torch.compile(
        lambda g, x, w: ug.compute(g, "u_mul_e_sum" if by_name else MUL, x, w), fullgraph=True, backend="aot_eager"
    )(graph, x, w)
    check_close(out, reference.execute(graph, MUL, [x, w]))


def _measured_selection(monkeypatch, candidates, costs, rounds=0):
    """Every graph counts as large; the shortlist is ``candidates``, timed as ``costs`` in turn (a
    sequence), or as ``costs(result)`` of each timed run's result (a function), with ``rounds``
    rounds of refinement. Each timing still runs its candidate. Returns the list of results the
    timed runs made."""
    from autotune import selection

    ran = []
    costs = costs if callable(costs) else (lambda result, _costs=iter(costs): next(_costs))

    def timer(call, repeats):
        ran.append(call())
        return costs(ran[-1])

    # Decisions made here stay here: later tests see the selection caches as they were.
    monkeypatch.setattr(selection, "_CACHE", {})
    monkeypatch.setattr(selection, "_MEASURED", {})
    monkeypatch.setattr(selection, "measures", lambda graph, device: True)
    monkeypatch.setattr(selection, "shortlist", lambda *args, **kwargs: list(candidates))
    monkeypatch.setattr(selection, "_cuda_ms", timer)
    monkeypatch.setattr(selection, "REFINE_ROUNDS", rounds)
    return ran


def test_large_graphs_run_the_fastest_of_the_shortlist(monkeypatch, interpret, graph_factory, check_close):
    """The decision is the candidate the timing favours; the timing runs left the operands unmarked
    (a narrow edge weight is not taken for a reused one), and the call's result is right."""
    from pyg_ugrapher.graph import derived_cache
    from triton_kernels import dispatch
    from triton_kernels.space import space

    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    candidates = [
        next(info for info in space(op, 6) if info.strategy == strategy) for strategy in ("vertex", "group", "edge")
    ]
    ran = _measured_selection(monkeypatch, candidates, (3.0, 1.0, 2.0))
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(graph.num_src, 6, generator=gen), torch.rand(graph.num_edges, 1, generator=gen)
    out = ug.compute(graph, op, x, weight)
    expected = reference.execute(graph, op, [x, weight])
    assert len(ran) == 3
    for result in ran + [out]:
        check_close(result, expected)
    decisions = derived_cache(graph.structure(torch.device("cpu")).csr.rowptr)["decisions"]
    assert [decision[2] for decision in decisions.values()] == [candidates[1]]
    [(_, _, permuted)] = dispatch._PERMUTED[weight]
    assert permuted is None


def _weighted_sum_timed_twice(monkeypatch, graph_factory):
    """``u_mul_e_sum`` on a graph with a narrow edge weight, every graph counting as large: a
    vertex and a group schedule timed (3.0, 1.0) at the first decision and (1.0, 3.0) at the
    second. Returns the graph, the op, the two schedules, the timed runs' results, ``x`` and the
    weight."""
    from triton_kernels.space import space

    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    candidates = [next(info for info in space(op, 6) if info.strategy == strategy) for strategy in ("vertex", "group")]
    ran = _measured_selection(monkeypatch, candidates, (3.0, 1.0, 1.0, 3.0))
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(graph.num_src, 6, generator=gen), torch.rand(graph.num_edges, 1, generator=gen)
    return graph, op, candidates, ran, x, weight


def test_a_reused_edge_operand_is_decided_again_as_it_is_read(monkeypatch, interpret, graph_factory, check_close):
    """A narrow edge weight that comes back is read in CSR order: its op is decided (timed) again,
    with the timing runs reading the weight in CSR order as the call does; the first decision
    stays for new weights."""
    from pyg_ugrapher.graph import derived_cache
    from triton_kernels import dispatch

    graph, op, candidates, ran, x, weight = _weighted_sum_timed_twice(monkeypatch, graph_factory)
    permuted = []
    permute = dispatch.in_csr_order
    monkeypatch.setattr(dispatch, "in_csr_order", lambda t, eid: permuted.append(t) or permute(t, eid))
    expected = reference.execute(graph, op, [x, weight])
    check_close(ug.compute(graph, op, x, weight), expected)
    assert len(ran) == 2 and not permuted
    check_close(ug.compute(graph, op, x, weight), expected)
    assert len(ran) == 4 and len(permuted) == 3 and all(t is weight for t in permuted)
    for result in ran:
        check_close(result, expected)
    decisions = derived_cache(graph.structure(torch.device("cpu")).csr.rowptr)["decisions"]
    assert sorted(decision[2].strategy for decision in decisions.values()) == ["group", "vertex"]
    check_close(ug.compute(graph, op, x, weight.clone()), expected)  # a new weight: the first decision
    assert len(ran) == 4
    from pyg_ugrapher.ops import decided_schedule

    assert decided_schedule(graph, op, [x, weight]).strategy == "vertex"  # what runs for the reused one
    assert decided_schedule(graph, op, [x, weight.clone()]).strategy == "group"
    assert len(ran) == 4  # both were decided already


def test_a_capture_runs_the_schedule_decided_for_the_reused_weight(monkeypatch, interpret, graph_factory, check_close):
    """Inside a CUDA graph capture nothing may be kept, so no edge operand counts as coming back:
    a weight that came back at every warm-up call (GCN's normalisation, seen first by another
    layer) arrives with a key no warm-up call decided. It runs the schedule decided for the
    reused weight, read through the edge ids, and nothing is decided (or timed) in the capture;
    that schedule then holds for the key outside captures too."""
    from pyg_ugrapher.ops import decisions
    from pyg_ugrapher.structure import keeping_nothing
    from triton_kernels import dispatch

    graph, op, candidates, ran, x, weight = _weighted_sum_timed_twice(monkeypatch, graph_factory)
    expected = reference.execute(graph, op, [x, weight])
    dispatch.is_reused(weight, graph.structure(torch.device("cpu")).csr.eid)  # seen before, by another op
    check_close(ug.compute(graph, op, x, weight), expected)
    assert len(ran) == 2
    reused_choice = decisions.decided_schedule(graph, op, [x, weight])
    assert reused_choice == candidates[1]
    monkeypatch.setattr(decisions, "capturing", lambda tensor: True)
    with keeping_nothing():
        check_close(ug.compute(graph, op, x, weight), expected)
    assert len(ran) == 2
    with keeping_nothing():
        assert decisions.decided_schedule(graph, op, [x, weight]) == reused_choice
    monkeypatch.setattr(decisions, "capturing", lambda tensor: False)
    check_close(ug.compute(graph, op, x, weight.clone()), expected)  # a new weight, outside a capture
    assert len(ran) == 2  # its key was decided in the capture


def test_a_capture_finds_its_decision_among_a_softmax_aggregations(monkeypatch, interpret, graph_factory, check_close):
    """The decisions of a graph's structure also hold a softmax aggregation's (GAT's one pass,
    keyed otherwise): a call inside a capture that looks for the schedule decided apart from
    reuse passes over them (a capture of a mini-batch step of GAT and GCN layers did not)."""
    from pyg_ugrapher.attention import softmax_aggregate
    from pyg_ugrapher.graph import derived_cache
    from pyg_ugrapher.ops import decisions
    from pyg_ugrapher.structure import keeping_nothing

    graph = graph_factory("duplicates", seed=3)
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(graph.num_edges, 2, generator=generator)
    softmax_aggregate(graph, logits, torch.randn(graph.num_src, 2, 4, generator=generator))
    cached = derived_cache(graph.structure(torch.device("cpu")).csr.rowptr)["decisions"]
    assert any(key[0][0] == "one pass" for key in cached), "no softmax decision to pass over"
    op = ug.OpInfo.from_name("u_mul_e_sum")
    x, weight = torch.randn(graph.num_src, 8, generator=generator), torch.rand(graph.num_edges, generator=generator)
    expected = reference.execute(graph, op, [x, weight])
    monkeypatch.setattr(decisions, "capturing", lambda tensor: True)
    with keeping_nothing():
        check_close(ug.compute(graph, op, x, weight), expected)


@pytest.mark.parametrize("shared", [True, False], ids=["graph_independent", "per_graph"])
def test_decisions_made_once_for_every_graph_when_the_schedule_ignores_it(
    monkeypatch, interpret, graph_factory, check_close, shared
):
    """Where the automatic schedule depends on the op alone (``graph_independent``: small GPU
    graphs) or is named, a decision made on one graph serves every graph (a sampler's new graph
    per step decides nothing); otherwise each graph decides. Results are the reference's either way,
    on graphs of other sizes, one with an isolated vertex and one without edges."""
    from autotune import selection
    from pyg_ugrapher.ops import decisions

    monkeypatch.setattr(decisions, "SHARED_DECISIONS", {})
    monkeypatch.setattr(selection, "graph_independent", lambda graph, device: shared)
    decided = []
    monkeypatch.setattr(
        decisions,
        "schedule_for",
        lambda *args, _decide=decisions.schedule_for: decided.append(args[0]) or _decide(*args),
    )
    named = ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=4, num_warps=4)
    cases = ("mixed", "hub", "bipartite", "empty", "isolated", "mixed")
    for i, case in enumerate(cases):
        graph = graph_factory(case, seed=i)  # a new graph every call, as from a sampler
        gen = torch.Generator().manual_seed(i)
        x, w = torch.randn(graph.num_src, 5, generator=gen), torch.randn(graph.num_edges, 5, generator=gen)
        for name, operands in (("copy_u_mean", [x]), ("u_mul_e_max", [x, w])):
            expected = reference.execute(graph, ug.OpInfo.from_name(name), operands)
            check_close(ug.compute(graph, name, *operands), expected)
            check_close(ug.compute(graph, name, *operands, parallel_info=named), expected)
    # Named schedules: one decision per op on every path; automatic ones: per graph unless shared.
    assert len(decided) == (2 + 2 if shared else 2 + 2 * len(cases))


def test_a_gather_with_an_edge_output_times_the_fused_kernel(monkeypatch, interpret, graph_factory, check_close):
    """A backward pass's gather-with-edge-output pair is timed as the one kernel it runs, reading the
    tensor the two ops share once, as the call does; a candidate that cannot write the edge output
    in the gather's pass (edge-parallel) is left out."""
    from pyg_ugrapher.ops import run_gather_with_edge_output, serialized
    from triton_kernels import dispatch
    from triton_kernels.space import space

    shared = []
    monkeypatch.setattr(
        dispatch, "_sharing", lambda *args, _sharing=dispatch._sharing: shared.append(_sharing(*args)) or shared[-1]
    )

    graph = graph_factory("mixed")
    gather, message = ug.OpInfo.from_name("u_mul_e_sum"), ug.OpInfo.from_name("v_dot_u")
    candidates = [
        next(info for info in space(gather, 8) if info.strategy == strategy) for strategy in ("edge", "vertex", "group")
    ]
    ran = _measured_selection(monkeypatch, candidates, (1.0, 2.0))
    gen = torch.Generator().manual_seed(1)
    g, weight, x = (
        torch.randn(graph.num_dst, 2, 4, generator=gen),
        torch.rand(graph.num_edges, 2, 1, generator=gen),
        torch.randn(graph.num_src, 2, 4, generator=gen),
    )
    structure = graph.structure(torch.device("cpu"))
    grad, products = run_gather_with_edge_output(
        structure.reverse(), [g, weight], serialized(gather), [x, g], serialized(message), "auto", "auto"
    )
    assert len(ran) == 2 and all(len(result) == 2 for result in ran)  # the edge-parallel one never ran
    assert len(shared) >= 3 and set(shared) == {(-1, -1, -1, 0)}  # g read once by every timed run and the call
    reversed_graph = ug.GraphTensor(graph.dst, graph.src, graph.num_dst, graph.num_src)
    check_close(grad, reference.execute(reversed_graph, gather, [g, weight]))
    check_close(products, reference.execute(reversed_graph, message, [x, g]))


def test_a_measured_pair_refines_the_fused_kernels_own_schedule(monkeypatch, interpret, graph_factory, check_close):
    """The shortlist's gather schedules are adapted to the fused kernel (``pair_schedule``); the
    refinement then times that kernel's neighbours as they are, and the fastest is what runs (through
    its launch plan)."""
    import triton_kernels
    from pyg_ugrapher.ops import run_gather_with_edge_output, serialized
    from pyg_ugrapher.structure import derived_cache
    from triton_kernels.space import neighbours, pair_schedule

    graph = graph_factory("mixed")
    gather, message = ug.OpInfo.from_name("u_mul_e_sum"), ug.OpInfo.from_name("v_dot_u")
    start = ug.ParallelInfo("vertex", block_v=4, block_e=4, block_f=8, num_warps=4)
    adapted = pair_schedule(start, 8, 4)
    goal = next(info for info in neighbours(adapted, gather, 8) if info != pair_schedule(info, 8, 4))
    seen = []
    monkeypatch.setattr(
        triton_kernels,
        "run_with_edge_output",
        lambda *args, _run=triton_kernels.run_with_edge_output: seen.append(args[7]) or _run(*args),
    )
    planned = []
    monkeypatch.setattr(
        triton_kernels.PairPlan,
        "__call__",
        lambda self, *args, _call=triton_kernels.PairPlan.__call__: (
            planned.append(self.plan.info) or _call(self, *args)
        ),
    )
    ran = _measured_selection(monkeypatch, [start], lambda result: 1.0 if seen[-1] == goal else 2.0, rounds=1)
    gen = torch.Generator().manual_seed(2)
    g, weight, x = (
        torch.randn(graph.num_dst, 2, 4, generator=gen),
        torch.rand(graph.num_edges, 2, 1, generator=gen),
        torch.randn(graph.num_src, 2, 4, generator=gen),
    )
    structure = graph.structure(torch.device("cpu")).reverse()
    grad, products = run_gather_with_edge_output(
        structure, [g, weight], serialized(gather), [x, g], serialized(message), "auto", "auto"
    )
    timed = seen
    assert timed[0] == adapted and goal in timed and set(timed[1:]) == set(neighbours(adapted, gather, 8))
    assert planned == [goal] and len(ran) == len(timed)  # the call itself ran the winner, unadapted
    decisions = derived_cache(structure.csr.rowptr)["decisions"]
    assert [decision[2] for decision in decisions.values()] == [goal]
    reversed_graph = ug.GraphTensor(graph.dst, graph.src, graph.num_dst, graph.num_src)
    check_close(grad, reference.execute(reversed_graph, gather, [g, weight]))
    check_close(products, reference.execute(reversed_graph, message, [x, g]))


@pytest.mark.parametrize(
    "name,needs,kept_operands,kept_out",
    [
        ("copy_u_sum", (True,), (False,), False),
        ("u_mul_e_sum", (True, False), (False, True), False),  # d/dx reads the weight alone
        ("u_mul_e_sum", (False, True), (True, False), False),  # d/dw reads x alone
        ("u_mul_e_mean", (True, True), (True, True), False),
        ("copy_u_max", (True,), (True,), True),  # ties are found by comparing with the output
    ],
)
def test_eager_backward_keeps_only_what_it_reads(name, needs, kept_operands, kept_out, graph, check_close):
    """An eager op's autograd node holds the operands and output its needed gradients read, no
    more (a sum's output would stay alive for nothing), and the gradients are still exact."""
    op = ug.OpInfo.from_name(name)
    x, w = _inputs(graph, seed=3)
    operands = [t.clone().requires_grad_(need) for t, need in zip((x, w[:, :1]), needs)]
    out = ug.compute(graph, op, *operands)
    saved = out.grad_fn.saved_tensors[-len(operands) - 1 :]
    assert tuple(t is not None for t in saved[:-1]) == kept_operands and (saved[-1] is not None) == kept_out
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    wrt = [t for t in operands if t.requires_grad]
    ours = torch.autograd.grad((out * probe).sum(), wrt)
    exact = [t.detach().double().requires_grad_(t.requires_grad) for t in operands]
    expected = torch.autograd.grad(
        (reference.execute(graph, op, exact) * probe.double()).sum(), [t for t in exact if t.requires_grad]
    )
    for a, b in zip(ours, expected):
        check_close(a, b.float())
