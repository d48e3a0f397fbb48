"""``softmax_aggregate``: GAT's softmax and aggregation with a closed-form backward, against the
same computation written with PyG's ``softmax`` and ``index_add``, on every graph case, through
the reference executor and through the kernels. Both forms of the logits: given as an ``[E, H]``
tensor, and computed per edge by a score op from source, destination and edge operands (GAT's
``leaky_relu(a_src[u] + a_dst[v] + a_edge[e])``), whose gradients reach those operands."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax

import pyg_ugrapher as ug
from pyg_ugrapher import attention
from pyg_ugrapher import ops as ug_ops
from pyg_ugrapher.attention import GIVEN_LOGITS, attention_ops, softmax_aggregate, softmax_aggregate_op
from pyg_ugrapher.ir import Expr, OpInfo

HEADS, CHANNELS = 3, 5
SLOPE = 0.2
#: GAT's score: a leaky ReLU of a source, a destination and an edge term.
SCORE = OpInfo(
    Expr.apply("leaky_relu", Expr.input(0) + Expr.input(1) + Expr.input(2), SLOPE),
    None,
    operands=("src_v", "dst_v", "edge"),
)
FORMS = ["logits", "score"]


def _inputs(graph, form="logits", dtype=torch.float32, seed=0, dropout=False):
    """``(logits, x, keep)``: ``logits`` is a tensor, or for the score form the list of its operands."""
    gen = torch.Generator().manual_seed(seed)
    if form == "logits":
        logits = torch.randn(graph.num_edges, HEADS, generator=gen, dtype=dtype)
    else:
        logits = [
            torch.randn(rows, HEADS, generator=gen, dtype=dtype)
            for rows in (graph.num_src, graph.num_dst, graph.num_edges)
        ]
    x = torch.randn(graph.num_src, HEADS, CHANNELS, generator=gen, dtype=dtype)
    keep = None
    if dropout:
        keep = (torch.rand(graph.num_edges, HEADS, generator=gen) > 0.4).to(dtype) / 0.6
    return logits, x, keep


def _edge_logits(graph, logits):
    if isinstance(logits, torch.Tensor):
        return logits
    src, dst = graph.edge_index
    a_src, a_dst, a_edge = logits
    return F.leaky_relu(a_src[src] + a_dst[dst] + a_edge, SLOPE)


def _pyg(graph, logits, x, keep):
    """PyG's GATConv computation: softmax over incoming edges, dropout, weighted sum."""
    src, dst = graph.edge_index
    alpha = softmax(_edge_logits(graph, logits), dst, num_nodes=graph.num_dst)
    if keep is not None:
        alpha = alpha * keep
    out = x.new_zeros(graph.num_dst, HEADS, CHANNELS)
    return out.index_add(0, dst, alpha.unsqueeze(-1) * x[src])


def _ours(graph, logits, x, keep):
    if isinstance(logits, torch.Tensor):
        return softmax_aggregate(graph, logits, x, keep)
    return softmax_aggregate(graph, logits, x, keep, score=SCORE)


def _leaves(logits, x):
    logits = (
        logits.clone().requires_grad_()
        if isinstance(logits, torch.Tensor)
        else [t.clone().requires_grad_() for t in logits]
    )
    return logits, x.clone().requires_grad_()


def _flat(logits, x):
    return ([logits] if isinstance(logits, torch.Tensor) else list(logits)) + [x]


def _forward_backward(fn, graph, logits, x, keep, seed=1):
    logits, x = _leaves(logits, x)
    out = fn(graph, logits, x, keep)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    return [out] + list(torch.autograd.grad(out, _flat(logits, x), grad))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_matches_pyg(graph_factory, graph_case, check_close, dropout, form):
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, form, dropout=dropout)
    for ours, theirs in zip(_forward_backward(_ours, graph, *inputs), _forward_backward(_pyg, graph, *inputs)):
        check_close(ours, theirs)


def _to(value, device):
    if value is None or isinstance(value, torch.Tensor):
        return None if value is None else value.to(device)
    return [t.to(device) for t in value]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_kernels_match_pyg(device, graph_factory, graph_case, poison, check_close, dropout, form):
    """The same through the Triton kernels (the interpreter on a CPU), outputs poisoned first."""
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, form, seed=2, dropout=dropout)
    moved = [_to(t, device) for t in inputs]
    for ours, theirs in zip(_forward_backward(_ours, graph, *moved), _forward_backward(_pyg, graph, *inputs)):
        check_close(ours.cpu(), theirs)


#: Schedules the forward's decision may pick for ``HEADS`` x ``CHANNELS``: tiles inside one head,
#: vertex-parallel or in neighbour groups (one pass), tiles straddling heads and edge-parallel
#: schedules (three operators).
FORWARD_SCHEDULES = {
    "one_pass": ug.ParallelInfo("vertex", block_f=1, block_v=4, block_e=2, num_warps=1),
    "group_one_pass": ug.ParallelInfo("group", block_f=1, group_size=4, block_v=2, block_e=2, num_warps=1),
    "straddling": ug.ParallelInfo("vertex", block_f=8, block_v=4, block_e=2, num_warps=1),
    "group_straddling": ug.ParallelInfo("group", block_f=8, group_size=4, block_v=2, block_e=2, num_warps=1),
    "edge": ug.ParallelInfo("edge", block_f=1, block_e=4, num_warps=1),
}
ONE_PASS = ("one_pass", "group_one_pass")


@pytest.fixture
def forward_schedule(request, monkeypatch):
    """The forward's decision takes ``FORWARD_SCHEDULES[request.param]``; counts one-pass launches."""
    from autotune import selection
    from triton_kernels import group_softmax, vertex_softmax

    monkeypatch.setattr(selection, "generation", object())  # decisions made before this test are stale
    monkeypatch.setattr(attention, "schedule_for", lambda *args, **kwargs: FORWARD_SCHEDULES[request.param])
    # A GPU's small graphs take the small-graph rule's schedule, here the test's too.
    monkeypatch.setattr(attention, "small_graph_softmax_schedule", lambda width: FORWARD_SCHEDULES[request.param])
    launches = []
    for template in (vertex_softmax, group_softmax):
        monkeypatch.setattr(
            template, "launch", lambda *args, launch=template.launch: launches.append(args[-1]) or launch(*args)
        )
    return request.param, launches


@pytest.mark.parametrize("forward_schedule", list(FORWARD_SCHEDULES), indirect=True)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_forward_in_one_pass_or_three(
    device, graph_factory, graph_case, poison, check_close, forward_schedule, dropout, form
):
    """The forward runs in one pass exactly where the decided schedule can run it, and both routes
    give PyG's output and gradients, as eager Function and as custom op."""
    name, launches = forward_schedule
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, form, seed=6, dropout=dropout)
    moved = [_to(t, device) for t in inputs]
    theirs = _forward_backward(_pyg, graph, *inputs)
    for fn in (_ours, _custom_op):
        for ours, expected in zip(_forward_backward(fn, graph, *moved), theirs):
            check_close(ours.cpu(), expected, context=f"{fn.__name__} {name}")
    assert launches == ([FORWARD_SCHEDULES[name]] * 2 if name in ONE_PASS else [])


@pytest.mark.parametrize("forward_schedule", ["one_pass"], indirect=True)
def test_plan_lists_the_one_pass(device, graph_factory, forward_schedule):
    """``ug.plan`` observers see the one pass as one operator, with its own kernel's source."""
    graph = graph_factory("mixed")
    logits, x, keep = (_to(t, device) for t in _inputs(graph, "score", dropout=True))
    calls = []
    with ug_ops.observe(calls.append):
        softmax_aggregate(graph, logits, x, keep, score=SCORE)
    ops = attention_ops(SCORE.serialize(), True)
    assert [call.op for call in calls] == [ops.one_pass]
    assert calls[0].parallel_info == FORWARD_SCHEDULES["one_pass"]
    assert "def vertex_softmax_" in calls[0].source


def test_measured_decision_times_each_route(device, graph_factory, monkeypatch):
    """A measured decision times each candidate as it would run (one pass, or three operators
    under it), and the fastest decides the route."""
    from autotune import selection

    graph = graph_factory("mixed")
    logits, x, keep = (_to(t, device) for t in _inputs(graph, "score", dropout=True))
    candidates = [FORWARD_SCHEDULES["straddling"], FORWARD_SCHEDULES["one_pass"]]
    timed = []

    def timer(call, repeats):
        calls = []
        with ug_ops.observe(calls.append):
            call()
        timed.append(len(calls))
        return float(len(timed))  # the first candidate timed is the fastest

    monkeypatch.setattr(selection, "generation", object())
    monkeypatch.setattr(selection, "measures", lambda graph, device: True)
    one_pass = attention_ops(SCORE.serialize(), True).one_pass
    shortlist = selection.shortlist
    monkeypatch.setattr(
        selection,
        "shortlist",
        lambda graph, op, *args, **kwargs: candidates if op == one_pass else shortlist(graph, op, *args, **kwargs)[:1],
    )
    monkeypatch.setattr(selection, "_MEASURED", {})
    monkeypatch.setattr(
        selection,
        "fastest",
        lambda schedules, run, **kwargs: (
            schedules[0]
            if schedules != candidates
            else min(schedules, key=lambda schedule: timer(lambda: run(schedule), 1))
        ),
    )
    for order in (candidates, candidates[::-1]):
        candidates[:] = order
        timed.clear()
        selection._MEASURED.clear()
        monkeypatch.setattr(selection, "generation", object())
        out = softmax_aggregate(graph, logits, x, keep, score=SCORE)
        calls = []
        with ug_ops.observe(calls.append):
            softmax_aggregate(graph, logits, x, keep, score=SCORE)
        assert timed == [0, 0]  # timing runs are not observed: the three operators run unobserved too
        assert len(calls) == (3 if order[0] is FORWARD_SCHEDULES["straddling"] else 1)
        assert torch.isfinite(out).all()


def _custom_op(graph, logits, x, keep):
    """The custom op a compiled graph calls, called directly (its autograd formula included)."""
    if isinstance(logits, torch.Tensor):
        return softmax_aggregate_op(graph.structure(x.device).flat(), [logits], x, keep, GIVEN_LOGITS.serialize())[0]
    return softmax_aggregate_op(graph.structure(x.device).flat(), list(logits), x, keep, SCORE.serialize())[0]


def _compiled(graph, logits, x, keep):
    """``softmax_aggregate`` under ``torch.compile`` (no graph break: it calls the custom op)."""
    torch._dynamo.reset()
    return torch.compile(_ours, fullgraph=True, backend="aot_eager")(graph, logits, x, keep)


@pytest.mark.parametrize("path", [_custom_op, _compiled], ids=["custom_op", "compiled"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_custom_op_matches_pyg(graph_factory, graph_case, check_close, dropout, form, path):
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, form, seed=3, dropout=dropout)
    for ours, theirs in zip(_forward_backward(path, graph, *inputs), _forward_backward(_pyg, graph, *inputs)):
        check_close(ours, theirs)


@pytest.mark.parametrize("fn", [_ours, _custom_op], ids=["function", "custom_op"])
@pytest.mark.parametrize("wrt", [0, 1, 2, 3], ids=["a_src", "a_dst", "a_edge", "x"])
def test_one_sided_gradients(graph_factory, check_close, fn, wrt):
    """Only the gradients asked for are computed (the backward's one-sided branches): each score
    operand alone, and the features alone."""
    graph = graph_factory("mixed")
    logits, x, keep = _inputs(graph, "score", seed=4, dropout=True)
    grad = torch.randn(graph.num_dst, HEADS, CHANNELS, generator=torch.Generator().manual_seed(5))
    results = []
    for f in (fn, _pyg):
        tensors = [t.clone() for t in _flat(logits, x)]
        tensors[wrt].requires_grad_()
        out = f(graph, tensors[:3], tensors[3], keep)
        results.append(torch.autograd.grad(out, tensors[wrt], grad)[0])
    check_close(*results)


def test_given_logits_one_sided(graph_factory, check_close):
    graph = graph_factory("mixed")
    logits, x, keep = _inputs(graph, seed=6, dropout=True)
    grad = torch.randn(graph.num_dst, HEADS, CHANNELS, generator=torch.Generator().manual_seed(7))
    results = []
    for f in (_ours, _pyg):
        leaf = logits.clone().requires_grad_()
        results.append(torch.autograd.grad(f(graph, leaf, x, keep), leaf, grad)[0])
    check_close(*results)


def test_the_score_is_never_an_edge_tensor(graph_factory):
    """With a score op, no forward or backward operator reads or writes the ``[E, H]`` logits:
    the only edge operands are the score's own edge term, the dropout scale and the products
    ``<x_u, G_v>``; the score operands' gradients are gathers, not message ops."""
    ops = attention_ops(SCORE.serialize(), True)
    for op in (ops.shift, ops.denominator, ops.output, ops.grad_x):
        assert op.gather_op is not None
    a_src, a_dst, a_edge = ops.grad_scores
    assert (a_src.reverse, a_src.op.gather_op) == (True, "sum")
    assert (a_dst.reverse, a_dst.op.gather_op) == (False, "sum")
    assert a_edge.op.gather_op is None
    graph = graph_factory("mixed")
    calls = []
    with ug_ops.observe(calls.append):
        softmax_aggregate(graph, *_inputs(graph, "score")[:2], score=SCORE)
    assert [call.op for call in calls] == [ops.shift, ops.denominator, attention_ops(SCORE.serialize(), False).output]


@pytest.mark.parametrize("form", FORMS)
def test_edge_operands_are_never_permuted(device, graph_factory, monkeypatch, form):
    """The edge logits (or the score's edge term), the dropout scale and the products each feed
    several operators of a pass: each gets a view of its own per operator, so none is taken for a
    reused static weight and permuted into CSR order (an ``[E, H]`` gather per step, which costs
    more than the operators on large graphs), over two steps."""
    from triton_kernels import dispatch

    permuted = []
    permute = dispatch.in_csr_order
    monkeypatch.setattr(dispatch, "in_csr_order", lambda t, eid: permuted.append(t.shape) or permute(t, eid))
    graph = graph_factory("mixed")
    logits, x, keep = (_to(t, device) for t in _inputs(graph, form, dropout=True))
    # Gradients for the node terms (two steps read the products), none for the edge term: a tensor
    # that requires grad is never taken for a reused one.
    trained = [logits] if isinstance(logits, torch.Tensor) else logits[:2]
    for t in trained + [x]:
        t.requires_grad_()
    for _ in range(2):
        out = _ours(graph, logits, x, keep)
        out.backward(torch.ones_like(out))
    assert permuted == []


def test_isolated_destinations_get_zero(graph_factory, isolated):
    graph = graph_factory("isolated")
    for form in FORMS:
        logits, x, _ = _inputs(graph, form)
        out = _ours(graph, logits, x, None)
        assert torch.equal(out[isolated(graph)], torch.zeros_like(out[isolated(graph)]))


@pytest.mark.parametrize("form, dropout", [("logits", False), ("score", True)])
def test_gradcheck(graph_factory, form, dropout):
    """The closed form against finite differences in float64, on the reference executor (through
    the interpreter it took 45 s per case; the kernels' gradients are checked against PyG's
    autograd by :func:`test_kernels_match_pyg`)."""
    graph = graph_factory("tiny")
    logits, x, keep = _inputs(graph, form, dtype=torch.float64, dropout=dropout)
    leaves = [t.requires_grad_() for t in _flat(logits, x)]
    assert torch.autograd.gradcheck(
        lambda *t: _ours(graph, t[0] if form == "logits" else list(t[:3]), t[-1], keep), leaves
    )


@pytest.mark.parametrize("form, dropout", [("logits", False), ("score", True)])
def test_gradgradcheck(graph_factory, form, dropout):
    """Second derivatives against finite differences of the first, in float64 on the reference
    executor: a double backward differentiates the three forward operators. The closed form ran
    under ``once_differentiable``, which refuses a double backward only when the upstream gradient
    needs one, and otherwise dropped every second-order term through it without an error (a
    gradient penalty on GAT got no gradient for its attention vectors)."""
    graph = graph_factory("tiny")
    logits, x, keep = _inputs(graph, form, dtype=torch.float64, dropout=dropout)
    leaves = [t.requires_grad_() for t in _flat(logits, x)]
    assert torch.autograd.gradgradcheck(
        lambda *t: _ours(graph, t[0] if form == "logits" else list(t[:3]), t[-1], keep), leaves
    )


@pytest.mark.parametrize(
    "change, error, name",
    [
        (lambda g, logits, x, k: (g.edge_index, logits, x, k), TypeError, "graph"),
        (lambda g, logits, x, k: (g, logits.long(), x, k), TypeError, "logits"),
        (lambda g, logits, x, k: (g, logits[1:], x, k), ValueError, "logits"),
        (lambda g, logits, x, k: (g, logits, x[:, :2], k), ValueError, "x"),
        (lambda g, logits, x, k: (g, logits, x.flatten(1), k), ValueError, "x"),
        (lambda g, logits, x, k: (g, logits, x, logits[:, :1]), ValueError, "keep"),
    ],
)
def test_bad_input(graph_factory, change, error, name):
    graph = graph_factory("tiny")
    with pytest.raises(error, match=f"{name}:"):
        softmax_aggregate(*change(graph, *_inputs(graph)[:2], None))


@pytest.mark.parametrize(
    "change, score, error, name",
    [
        (lambda t: t[:2], SCORE, TypeError, r"logits:"),
        (lambda t: t[0], SCORE, TypeError, r"logits:"),
        (lambda t: [t[0], t[1][1:], t[2]], SCORE, ValueError, r"logits\[1\]:"),
        (lambda t: [t[0], t[1], t[2][:, :2]], SCORE, ValueError, r"logits\[2\]:"),
        (lambda t: [t[0].long(), t[1], t[2]], SCORE, TypeError, r"logits\[0\]:"),
        (lambda t: t, OpInfo.from_name("copy_e_sum"), TypeError, "score:"),
        (lambda t: t, "leaky_relu", TypeError, "score:"),
    ],
)
def test_bad_score_input(graph_factory, change, score, error, name):
    graph = graph_factory("tiny")
    logits, x, _ = _inputs(graph, "score")
    with pytest.raises(error, match=name):
        softmax_aggregate(graph, change(logits), x, score=score)


@pytest.mark.parametrize("largest", [None, 3], ids=["any_row", "rows_of_3"])
@pytest.mark.parametrize("heads, channels, one_pass", [(2, 4, True), (1, 5, True), (3, 5, False)])
def test_small_gpu_graphs_run_one_pass_on_grouped_rows(
    device, graph_factory, graph_case, check_close, monkeypatch, heads, channels, one_pass, largest
):
    """On a small GPU graph (a structure in the user's order, the small-graph rule) the forward
    runs :func:`~autotune.heuristic.small_graph_softmax_schedule`'s one pass over the rows grouped
    once and kept with the structure, where its feature tile holds whole heads or lies inside one
    and no row has more than ``SOFTMAX_ONE_PASS_MAX_ROW`` (``largest``) edges; three operators
    otherwise. Both give PyG's outputs and gradients."""
    from autotune import selection
    from autotune.heuristic import small_graph_softmax_schedule
    from pyg_ugrapher.structure import derived_cache, largest_row
    from triton_kernels import vertex_softmax

    monkeypatch.setattr(selection, "generation", object())  # decisions made before this test are stale
    monkeypatch.setattr(selection, "graph_independent", lambda graph, device: True)
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: True)
    if largest is not None:
        monkeypatch.setattr(attention, "SOFTMAX_ONE_PASS_MAX_ROW", largest)
    launches = []
    monkeypatch.setattr(
        vertex_softmax, "launch", lambda *args, launch=vertex_softmax.launch: launches.append(args[-1]) or launch(*args)
    )
    graph = graph_factory(graph_case)
    gen = torch.Generator().manual_seed(11)
    logits = [torch.randn(rows, heads, generator=gen) for rows in (graph.num_src, graph.num_dst, graph.num_edges)]
    x = torch.randn(graph.num_src, heads, channels, generator=gen)
    keep = (torch.rand(graph.num_edges, heads, generator=gen) > 0.4).float() / 0.6

    def pyg(graph, logits, x, keep):
        src, dst = graph.edge_index
        a_src, a_dst, a_edge = logits
        alpha = softmax(F.leaky_relu(a_src[src] + a_dst[dst] + a_edge, SLOPE), dst, num_nodes=graph.num_dst) * keep
        return x.new_zeros(graph.num_dst, heads, channels).index_add(0, dst, alpha.unsqueeze(-1) * x[src])

    structure = graph.structure(torch.device(device))
    assert structure.csr.user_order
    # On a GPU the largest row arrives after its first request; the forward reads it once arrived.
    largest_row(structure.csr)
    if structure.csr.rowptr.is_cuda:
        torch.cuda.synchronize()
    moved = [_to(logits, device), x.to(device), keep.to(device)]
    for ours, theirs in zip(_forward_backward(_ours, graph, *moved), _forward_backward(pyg, graph, logits, x, keep)):
        check_close(ours.cpu(), theirs)
    schedule = small_graph_softmax_schedule(heads * channels)
    in_degree = torch.bincount(graph.edge_index[1], minlength=graph.num_dst)
    hub = largest is not None and graph.num_edges > 0 and int(in_degree.max()) > largest
    if one_pass and not hub:  # every graph case has destination rows, which the pass writes (0 where no edge)
        assert launches == [schedule] and "grouped" in derived_cache(structure.csr.rowptr)
    else:
        assert launches == []
