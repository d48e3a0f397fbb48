"""The layers' dense steps (``pyg_ugrapher.nn._dense``): the matrix-vector bias gradient equals
autograd's sum, a root term added in a GEMM's epilogue equals the modules' sum, a user's
``Sequential`` network equals its own forward, hooks included, and its modules are never changed
(a hook fires once per call, another thread calling them meanwhile runs their own forward), GAT's
projection and attention halves as one node equal PyTorch's ops, the plain paths are kept where they
must be, and every layer that uses them still matches PyG with them switched on for small graphs; a
narrowing map runs before a sum or mean aggregation where that adds no aggregation to the backward."""

import threading
import weakref

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.utils import to_torch_csr_tensor

import pyg_ugrapher.nn as ug_nn
from pyg_ugrapher import graph_argument, ops
from pyg_ugrapher.nn import _dense

#: The threshold the tests that compare both paths run under: their tensors are small.
THRESHOLD = 256


@pytest.fixture
def threshold(monkeypatch):
    """:data:`_dense.MIN_ELEMENTS` lowered to :data:`THRESHOLD`."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", THRESHOLD)
    return THRESHOLD


def _grads(fn, out, bias):
    out = out.detach().requires_grad_()
    bias = bias.detach().requires_grad_()
    result = fn(out, bias)
    probe = torch.randn(result.shape, generator=torch.Generator().manual_seed(1))
    return (result,) + torch.autograd.grad((result * probe).sum(), (out, bias))


@pytest.mark.parametrize("shape", [(THRESHOLD // 8, 8), (3, THRESHOLD // 8, 4)], ids=["2d", "3d"])
def test_add_bias_gradient_is_the_row_sum(shape, check_close, threshold):
    generator = torch.Generator().manual_seed(0)
    out, bias = torch.randn(shape, generator=generator), torch.randn(shape[-1], generator=generator)
    ours = _grads(_dense.add_bias, out, bias)
    plain = _grads(lambda o, b: o + b, out, bias)
    assert ours[0].grad_fn.name().endswith("_AddBiasBackward")
    for a, b in zip(ours, plain):
        check_close(a, b)


def test_row_sum_reuses_its_vector_of_ones(check_close, monkeypatch):
    """Sums over fewer, more and fewer rows, in two dtypes: each equals the plain sum; the vector
    of ones grows once per dtype and is reused for fewer rows."""
    monkeypatch.setattr(_dense, "_ONES", {})
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for count in (5, 9, 3):
            rows = torch.randn(count, 4, generator=generator, dtype=dtype)
            check_close(_dense._row_sum(rows), rows.sum(0))
        assert _dense._ONES[(rows.device, dtype)].shape == (9,)
    kept = _dense._ONES[(rows.device, torch.float64)]
    _dense._row_sum(torch.randn(2, 4, dtype=torch.float64))
    assert _dense._ONES[(rows.device, torch.float64)] is kept and len(_dense._ONES) == 2


def test_plain_sum_where_the_product_does_not_pay_or_apply(threshold):
    """Outputs of fewer than the threshold's elements, a bias without gradient, no grad mode, dtype
    mismatch: ``out + bias``."""
    big, small = torch.randn(threshold // 4, 4), torch.randn(threshold // 4 - 1, 4)
    bias = torch.randn(4, requires_grad=True)
    assert _dense.add_bias(big, bias).grad_fn.name().endswith("_AddBiasBackward")
    assert _dense.add_bias(small, bias).grad_fn.name() == "AddBackward0"
    assert _dense.add_bias(big, bias.detach()).grad_fn is None
    with torch.no_grad():
        assert _dense.add_bias(big, bias).grad_fn is None
    assert _dense.add_bias(big.double(), bias).dtype == torch.float64


@pytest.mark.parametrize("shape", [(20, 6), (2, 10, 6)], ids=["2d", "3d"])
@pytest.mark.parametrize(
    "make",
    [lambda: torch.nn.Linear(6, 5), lambda: pyg_nn.Linear(6, 5), lambda: pyg_nn.Linear(6, 5, bias=False)],
    ids=["torch", "pyg", "no_bias"],
)
def test_linear_equals_the_module(make, shape, check_close, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    torch.manual_seed(0)
    lin = make()
    x = torch.randn(shape, requires_grad=True)
    ours, theirs = _dense.linear(lin, x), lin(x)
    expected = {(True, 2): "_LinearBackward", (True, 3): "_AddBiasBackward"}.get((lin.bias is not None, len(shape)))
    assert ours.grad_fn.name().endswith(expected or theirs.grad_fn.name())
    check_close(ours, theirs)
    params = [x] + list(lin.parameters())
    for a, b in zip(
        torch.autograd.grad(ours.square().sum(), params), torch.autograd.grad(theirs.square().sum(), params)
    ):
        check_close(a, b)


def test_linear_keeps_the_module_where_the_product_does_not_pay(threshold):
    """Products of fewer than the threshold's elements, no grad mode, a frozen bias, a dtype other
    than the weight's: the module's own ``addmm`` (which raises for the dtype, as PyG's would)."""
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(-(-threshold // 3), 4)
    assert _dense.linear(lin, x).grad_fn.name().endswith("_LinearBackward")
    assert _dense.linear(lin, x[:-1]).grad_fn.name() == "AddmmBackward0"
    with torch.no_grad():
        assert _dense.linear(lin, x).grad_fn is None
    lin.bias.requires_grad_(False)
    assert _dense.linear(lin, x).grad_fn.name() == "AddmmBackward0"
    with pytest.raises(RuntimeError):
        _dense.linear(lin, x.double())


def test_linear_keeps_lazy_modules_and_autocast(threshold):
    """A lazy ``Linear`` initialises through its own forward; under autocast the module's dtype
    (bias included) is kept."""
    lazy = pyg_nn.Linear(-1, 5)
    out = _dense.linear(lazy, torch.randn(threshold, 3))
    assert out.shape == (threshold, 5) and lazy.weight.shape == (5, 3)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(threshold, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _dense.linear(lin, x).dtype == lin(x).dtype == torch.bfloat16


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("make", [torch.nn.Linear, pyg_nn.Linear], ids=["torch", "pyg"])
def test_linear_sum_equals_the_modules(make, bias, check_close, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    torch.manual_seed(0)
    lin, root = make(6, 5, bias=bias), make(3, 5, bias=False)
    x, root_x = torch.randn(20, 6, requires_grad=True), torch.randn(20, 3, requires_grad=True)
    ours, theirs = _dense.linear_sum(lin, x, root, root_x), lin(x) + root(root_x)
    assert ours.grad_fn.name().endswith("_LinearBackward")
    check_close(ours, theirs)
    params = [x, root_x] + list(lin.parameters()) + list(root.parameters())
    probe = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(
        torch.autograd.grad((ours * probe).sum(), params), torch.autograd.grad((theirs * probe).sum(), params)
    ):
        check_close(a, b)


def test_linear_sum_frees_its_input_before_the_root_gradient(monkeypatch):
    """The backward releases ``x`` (a layer's aggregation) before it computes the root term's
    gradients (the bias's with them): a step's peak then holds one weight gradient, not two."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    lin, root = torch.nn.Linear(6, 5), torch.nn.Linear(3, 5, bias=False)
    x = torch.randn(20, 6)
    alive = weakref.ref(x)
    out = _dense.linear_sum(lin, x, root, torch.randn(20, 3))
    del x
    seen = []
    row_sum = _dense._row_sum
    monkeypatch.setattr(_dense, "_row_sum", lambda rows: seen.append(alive() is None) or row_sum(rows))
    out.sum().backward()
    assert seen == [True] and root.weight.grad is not None and lin.weight.grad is not None


def test_linear_sum_keeps_the_modules_where_it_does_not_apply(threshold):
    """Products of fewer than the threshold's elements, a root with a bias, a lazy map, autocast:
    the modules' own sum."""
    torch.manual_seed(0)
    lin, root = torch.nn.Linear(6, 5), torch.nn.Linear(3, 5, bias=False)
    rows = -(-threshold // 5)
    x, root_x = torch.randn(rows, 6), torch.randn(rows, 3)
    assert _dense.linear_sum(lin, x, root, root_x).grad_fn.name().endswith("_LinearBackward")
    assert _dense.linear_sum(lin, x[:-1], root, root_x[:-1]).grad_fn.name() == "AddBackward0"
    assert _dense.linear_sum(lin, x, torch.nn.Linear(3, 5), root_x).grad_fn.name() == "AddBackward0"
    lazy = pyg_nn.Linear(-1, 5, bias=False)
    assert _dense.linear_sum(lin, x, lazy, root_x).shape == (rows, 5) and lazy.weight.shape == (5, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _dense.linear_sum(lin, x, root, root_x).dtype == torch.bfloat16


def _attention_halves(lin, raw, vectors):
    """GAT's projection and attention halves as PyG computes them (through the projection)."""
    heads, channels = vectors[0].shape[1:]
    x = lin(raw).view(-1, heads, channels)
    return x, tuple((x * vector).sum(-1) for vector in vectors)


@pytest.mark.parametrize("project", [True, False], ids=["projection", "edge"])
@pytest.mark.parametrize("count", [2, 1], ids=["shared", "one"])
@pytest.mark.parametrize(
    "make", [lambda: torch.nn.Linear(6, 12, bias=False), lambda: pyg_nn.Linear(6, 12, False)], ids=["torch", "pyg"]
)
def test_projection_attention_equals_pytorch(make, count, project, check_close):
    torch.manual_seed(0)
    lin = make()
    vectors = [torch.randn(1, 3, 4, requires_grad=True) for _ in range(count)]
    raw = torch.randn(20, 6, requires_grad=True)
    x, alphas = _dense.projection_attention(lin, raw, vectors, project)
    assert alphas[0].grad_fn.name().endswith("_ProjectionAttentionBackward")
    ref_x, ref_alphas = _attention_halves(lin, raw, vectors)
    assert (x is None) != project and len(alphas) == count
    outputs, expected = list(alphas) + ([x] if project else []), list(ref_alphas) + ([ref_x] if project else [])
    generator = torch.Generator().manual_seed(2)
    probes = [torch.randn(t.shape, generator=generator) for t in expected]
    params = [raw, lin.weight] + vectors
    ours = torch.autograd.grad(sum((t * p).sum() for t, p in zip(outputs, probes)), params)
    theirs = torch.autograd.grad(sum((t * p).sum() for t, p in zip(expected, probes)), params)
    for a, b in zip(outputs + list(ours), expected + list(theirs)):
        check_close(a, b)


def test_projection_attention_gradients_only_where_asked(check_close):
    """Features without gradient (a layer's input), one of two vectors frozen: the others' gradients
    as PyTorch's; a head whose attention gradients are exactly 0 gets exactly 0."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 12, bias=False)
    vectors = [torch.randn(1, 3, 4, requires_grad=True), torch.randn(1, 3, 4)]
    raw = torch.randn(20, 6)
    (x, (src, dst)), (ref_x, (ref_src, ref_dst)) = (
        f(lin, raw, vectors) for f in (_dense.projection_attention, _attention_halves)
    )
    params = [lin.weight, vectors[0]]
    ours = torch.autograd.grad((x.square().sum() + src.sum()), params, retain_graph=True)
    theirs = torch.autograd.grad((ref_x.square().sum() + ref_src.sum()), params)
    for a, b in zip(ours, theirs):
        check_close(a, b)
    silent = torch.autograd.grad((src * 0).sum(), vectors[0])[0]
    assert torch.equal(silent, torch.zeros_like(silent))


@pytest.mark.parametrize("create_graph", [False, True], ids=["first-order", "double"])
def test_projection_attention_folds_again_only_for_a_double_backward(create_graph, monkeypatch, check_close):
    """A first-order backward reads the forward's fold of the vectors into the weight; a backward
    that builds a graph of its own folds them again, from its differentiable inputs."""
    folds = []
    fold = _dense._fold
    monkeypatch.setattr(_dense, "_fold", lambda *args: folds.append(args) or fold(*args))
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 12, bias=False)
    vectors = [torch.randn(1, 3, 4, requires_grad=True) for _ in range(2)]
    raw = torch.randn(20, 6, requires_grad=True)
    x, alphas = _dense.projection_attention(lin, raw, vectors)
    params = [raw, lin.weight] + vectors
    loss = x.square().sum() + sum(a.square().sum() for a in alphas)
    ours = torch.autograd.grad(loss, params, create_graph=create_graph)
    assert len(folds) == (2 if create_graph else 1)
    ref_x, ref_alphas = _attention_halves(lin, raw, vectors)
    theirs = torch.autograd.grad(ref_x.square().sum() + sum(a.square().sum() for a in ref_alphas), params)
    for a, b in zip(ours, theirs):
        check_close(a, b)


def test_projection_attention_keeps_pytorch_where_it_does_not_apply():
    """A lazy map initialises through its own forward (an edge projection too); under autocast the
    products are the autocast dtype, as PyG's; a dtype other than the weight's goes through the
    module, which raises as PyG's would."""
    vectors = (torch.randn(1, 2, 3, requires_grad=True),)
    for project in (True, False):
        lazy = pyg_nn.Linear(-1, 6, bias=False)
        x, (alpha,) = _dense.projection_attention(lazy, torch.randn(7, 5), vectors, project)
        assert lazy.weight.shape == (6, 5) and alpha.shape == (7, 2)
        assert not alpha.grad_fn.name().endswith("_ProjectionAttentionBackward")
        assert (x is None) != project
    lin = torch.nn.Linear(5, 6, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x, (alpha,) = _dense.projection_attention(lin, torch.randn(7, 5), vectors)
        assert x.dtype == alpha.dtype == torch.bfloat16
    with pytest.raises(RuntimeError):
        _dense.projection_attention(lin, torch.randn(7, 5, dtype=torch.float64), vectors)


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8),
        torch.nn.ReLU(),
        pyg_nn.Linear(8, 8),
        torch.nn.Dropout(0.0),
        torch.nn.Linear(8, 3, bias=False),
    )


def _run_both(net, x, check_close):
    """``network(net, x)`` and ``net(x)``: outputs and gradients equal; the output's node."""
    params = [x] + list(net.parameters())
    ours, theirs = _dense.network(net, x), net(x)
    probe = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3))
    check_close(ours, theirs)
    for a, b in zip(
        torch.autograd.grad((ours * probe).sum(), params), torch.autograd.grad((theirs * probe).sum(), params)
    ):
        check_close(a, b)
    return ours


def _nested():
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8),
        torch.nn.Sequential(torch.nn.ReLU(), pyg_nn.Linear(8, 8)),
        torch.nn.LayerNorm(8),
        torch.nn.Linear(8, 3),
    )


# Batch norm in evaluation mode: in training mode a bias before it has an analytic gradient of 0,
# which both paths compute as rounding noise.
@pytest.mark.parametrize(
    "make,routed",
    [
        (_mlp, 2),
        (_nested, 3),
        (lambda: pyg_nn.MLP([6, 8, 8, 3]).eval(), 0),
        (lambda: pyg_nn.MLP([6, 8, 3], norm="layer_norm", act="gelu", dropout=0.0), 0),
    ],
    ids=["sequential", "nested_sequential", "pyg_mlp_batch_norm", "pyg_mlp_layer_norm"],
)
def test_network_runs_linear_children_as_linear(make, routed, check_close, monkeypatch):
    """A ``Sequential``'s ``Linear`` children with a bias (in nested ``Sequential`` s too) compute
    through ``linear``, the other children as they are; any other network (PyG's ``MLP``) runs as
    ``net(x)``. The results are the network's own either way."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    torch.manual_seed(0)
    net = make()
    applied = []
    monkeypatch.setattr(
        _dense._Linear, "apply", lambda *args, apply=_dense._Linear.apply: applied.append(1) or apply(*args)
    )
    _run_both(net, torch.randn(20, 6, requires_grad=True), check_close)
    assert len(applied) == routed


def test_network_routes_only_maps_whose_bias_gradient_reaches_the_threshold(check_close, monkeypatch, threshold):
    """With ``x``'s rows, ``Linear(6, 8)`` and ``Linear(8, 8)`` reach the threshold and run as
    :class:`_dense._Linear`; ``Linear(8, 3)`` does not and stays native; with one row fewer none
    is routed and the network runs as it is."""
    torch.manual_seed(0)
    net = _mlp()
    applied = []
    monkeypatch.setattr(
        _dense._Linear,
        "apply",
        lambda *args, apply=_dense._Linear.apply: applied.append(args[1].shape[0]) or apply(*args),
    )
    rows = threshold // 8
    out = _run_both(net, torch.randn(rows, 6, requires_grad=True), check_close)
    assert applied == [8, 8] and out.grad_fn.name() == "MmBackward0"
    applied.clear()
    _run_both(net, torch.randn(rows - 1, 6, requires_grad=True), check_close)
    assert applied == []


def test_network_keeps_hooks_and_the_networks_own_forward(check_close, monkeypatch):
    """A hook on the container, on a child or global runs as in ``net(x)``, once per call; a
    network with a forward of its own (a residual) runs as it is, a bare ``Linear`` through
    ``linear``; under no-grad the modules run as they are."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(20, 6, requires_grad=True)
    seen = []

    def double(module, args, output):
        seen.append(type(module).__name__)
        return 2 * output

    for owner in (net, net[2]):
        handle = owner.register_forward_hook(double)
        _run_both(net, x, check_close)
        assert seen == [type(owner).__name__] * 2
        handle.remove()
        seen.clear()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: seen.append(1))
    try:
        _run_both(net, x, check_close)
    finally:
        handle.remove()
    assert len(seen) == 2 * (len(net) + 1)

    class Residual(torch.nn.Sequential):
        def forward(self, x):
            return super().forward(x) + x[:, :3]

    net = Residual(*_mlp())
    assert _run_both(net, x, check_close).grad_fn.name() == "AddBackward0"
    assert _run_both(net[0], x, check_close).grad_fn.name().endswith("_LinearBackward")
    with pytest.raises(RuntimeError):
        _dense.network(net, torch.randn(20, 5))
    with torch.no_grad():
        assert _dense.network(net[0], x).grad_fn is None


def _module_state(net):
    """Each module's attributes, by name and object identity (what a call must leave alone)."""
    return [{name: id(value) for name, value in vars(module).items()} for module in net.modules()]


def test_network_never_changes_the_users_modules(check_close, monkeypatch):
    """While ``network`` runs, the modules' attributes are the user's (no ``forward`` set on an
    instance), a hook on a child fires once per call, and the first ``Linear`` called directly
    from another thread meanwhile runs its own forward (ATen's ``addmm``, no hook of ours); two
    threads running the network at once get the sequential results and every hook call."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    torch.manual_seed(0)
    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, h):
            seen["state"] = _module_state(net)

            def direct():
                seen["direct"] = net[0](x).grad_fn.name()

            thread = threading.Thread(target=direct)
            thread.start()
            thread.join()
            return h

    net = torch.nn.Sequential(
        torch.nn.Linear(6, 8), Probe(), torch.nn.ReLU(), pyg_nn.Linear(8, 8), torch.nn.Linear(8, 3)
    )
    state = _module_state(net)
    x = torch.randn(20, 6, requires_grad=True)
    calls = []
    net[3].register_forward_pre_hook(lambda module, args: calls.append("pre"))
    net[3].register_forward_hook(lambda module, args, output: calls.append("post"))
    applied = []
    monkeypatch.setattr(
        _dense._Linear, "apply", lambda *args, apply=_dense._Linear.apply: applied.append(1) or apply(*args)
    )
    out = _dense.network(net, x)
    assert len(applied) == 2 and calls == ["pre", "post"]
    assert seen == {"state": state, "direct": "AddmmBackward0"}
    check_close(out, net(x))
    assert _module_state(net) == state

    net = torch.nn.Sequential(*(module for module in net if not isinstance(module, Probe)))
    state = _module_state(net)
    expected = net(x).detach()
    calls.clear()
    results = [[] for _ in range(2)]

    def work(into):
        for _ in range(10):
            into.append(_dense.network(net, x).detach())

    threads = [threading.Thread(target=work, args=(into,)) for into in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 2 * 2 * 10
    for out in results[0] + results[1]:
        check_close(out, expected)
    assert _module_state(net) == state


LAYERS = [
    ("GCNConv", lambda ns: ns.GCNConv(6, 4)),
    ("GATConv", lambda ns: ns.GATConv(6, 4, heads=2)),
    ("SAGEConv", lambda ns: ns.SAGEConv(6, 4)),
    ("GraphConv", lambda ns: ns.GraphConv(6, 4, aggr="max")),
    (
        "GINConv",
        lambda ns: ns.GINConv(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))),
    ),
    ("GINConv-MLP", lambda ns: ns.GINConv(pyg_nn.MLP([6, 8, 4]))),
]


#: Layers none of whose dense steps is replaced: GIN's network is not a ``Sequential``.
PLAIN_LAYERS = ("GINConv-MLP",)


@pytest.mark.parametrize("name,make", LAYERS, ids=[name for name, _ in LAYERS])
def test_layers_with_the_product_match_pyg(name, make, compare, small_graph, monkeypatch):
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)
    applied = []
    for function in (_dense._AddBias, _dense._Linear, _dense._ProjectionAttention):
        monkeypatch.setattr(function, "apply", lambda *args, apply=function.apply: applied.append(1) or apply(*args))
    x, edge_index = small_graph
    torch.manual_seed(0)
    compare(make(ug_nn), make(pyg_nn), lambda layer, x: layer(x, edge_index), [x], train=True)
    assert bool(applied) == (name not in PLAIN_LAYERS)


#: Layers whose linear map follows a gather that commutes with it, narrowing 6 -> 4 features, and a
#: call of each on ``(layer, x, edge_index, edge_weight)``.
NARROWING = [
    ("SAGEConv-mean", lambda ns: ns.SAGEConv(6, 4), lambda layer, x, ei, w: layer(x, ei)),
    (
        "SAGEConv-sum-no-root",
        lambda ns: ns.SAGEConv(6, 4, aggr="sum", root_weight=False),
        lambda layer, x, ei, w: layer(x, ei),
    ),
    ("SAGEConv-bipartite", lambda ns: ns.SAGEConv((6, 5), 4), lambda layer, x, ei, w: layer((x, x[:, :5]), ei)),
    (
        "SAGEConv-sparse-adjacency",
        lambda ns: ns.SAGEConv(6, 4),
        lambda layer, x, ei, w: layer(x, to_torch_csr_tensor(ei.flip(0), size=(x.size(0), x.size(0)))),
    ),
    ("GraphConv-add-weighted", lambda ns: ns.GraphConv(6, 4), lambda layer, x, ei, w: layer(x, ei, w)),
    ("GraphConv-mean", lambda ns: ns.GraphConv(6, 4, aggr="mean"), lambda layer, x, ei, w: layer(x, ei)),
]


def _aggregated_widths(run) -> list:
    """The feature width of every graph operator call ``run()`` makes."""
    calls = []
    with ops.observe(calls.append):
        run()
    return [call.operands[0].shape[-1] for call in calls]


@pytest.fixture
def isolated_graph(small_graph):
    """``(x, edge_index, edge_weight)``: the small graph without the edges of vertices 10 and 11
    (isolated: their sum and mean are empty), a self loop and a duplicate edge added."""
    x, edge_index = small_graph
    keep = (edge_index < 10).all(0)
    edge_index = torch.cat([edge_index[:, keep], torch.tensor([[3, 4], [3, 5]])], 1)
    edge_index = torch.cat([edge_index, edge_index[:, :1]], 1)
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(3))
    return x, edge_index, weight


@pytest.fixture
def any_size(monkeypatch):
    """:data:`_dense.MIN_ELEMENTS` lowered to 1: the test graphs are small."""
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", 1)


@pytest.mark.parametrize("name,make,call", NARROWING, ids=[name for name, _, _ in NARROWING])
def test_a_narrowing_map_runs_before_the_aggregation(name, make, call, compare, isolated_graph, any_size):
    x, edge_index, weight = isolated_graph
    torch.manual_seed(0)
    ours, theirs = make(ug_nn), make(pyg_nn)
    # Outputs and the gradients of x, the edge weights and every parameter, against PyG's.
    compare(ours, theirs, lambda layer, x, w: call(layer, x, edge_index, w), [x, weight], train=True)
    assert _aggregated_widths(lambda: call(ours, x.detach().requires_grad_(), edge_index, weight)) == [4]
    with torch.no_grad():
        assert _aggregated_widths(lambda: call(ours, x.detach(), edge_index, weight)) == [4]


#: First layers (features without a gradient, weights with one) on the 6 features of the test
#: graph, and the width they aggregate: 6 -> 4 once at 6 (map first would aggregate 4 twice, forward
#: and for the weight's gradient), 6 -> 2 twice at 2.
FIRST_LAYERS = [
    ("SAGEConv-6-4", lambda ns: ns.SAGEConv(6, 4), lambda layer, x, ei, w: layer(x, ei), 6),
    ("SAGEConv-6-2", lambda ns: ns.SAGEConv(6, 2), lambda layer, x, ei, w: layer(x, ei), 2),
    ("GraphConv-6-4", lambda ns: ns.GraphConv(6, 4), lambda layer, x, ei, w: layer(x, ei, w), 6),
    ("GraphConv-6-2", lambda ns: ns.GraphConv(6, 2, aggr="mean"), lambda layer, x, ei, w: layer(x, ei, w), 2),
]


@pytest.mark.parametrize("name,make,call,width", FIRST_LAYERS, ids=[case[0] for case in FIRST_LAYERS])
def test_a_first_layer_maps_first_where_that_aggregates_fewer_features(
    name, make, call, width, check_close, isolated_graph, any_size
):
    """Features that need no gradient under a weight that does: map first, the weight's gradient
    needs a second aggregation (of the output gradient), so the map goes first only where it
    narrows the features to less than half."""
    x, edge_index, weight = isolated_graph
    x = x.detach()
    torch.manual_seed(0)
    ours, theirs = make(ug_nn), make(pyg_nn)
    ours.load_state_dict(theirs.state_dict())
    assert _aggregated_widths(lambda: call(ours, x, edge_index, weight)) == [width]
    results = []
    for layer in (ours, theirs):
        out = call(layer, x, edge_index, weight)
        results.append((out, *torch.autograd.grad(out.square().sum(), list(layer.parameters()))))
    for mine, pyg in zip(*results):
        check_close(mine, pyg)


def test_the_aggregation_stays_first_where_the_map_cannot_move(small_graph, monkeypatch):
    x, edge_index = small_graph
    x = x.detach().requires_grad_()
    # Features of fewer than MIN_ELEMENTS elements: host time, which the check would add to.
    assert _aggregated_widths(lambda: ug_nn.SAGEConv(6, 4)(x, edge_index)) == [6]
    monkeypatch.setattr(_dense, "MIN_ELEMENTS", x.numel())
    assert _aggregated_widths(lambda: ug_nn.SAGEConv(6, 4)(x, edge_index)) == [4]
    assert _aggregated_widths(lambda: ug_nn.SAGEConv(6, 8)(x, edge_index)) == [6]  # a widening map
    assert _aggregated_widths(lambda: ug_nn.SAGEConv(6, 4, aggr="max")(x, edge_index)) == [6]
    hooked = ug_nn.SAGEConv(6, 4)
    seen = []
    hooked.lin_l.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[-1]))
    assert _aggregated_widths(lambda: hooked(x, edge_index)) == [6]
    assert seen == [6]  # the hook sees the call the layer's code makes: lin_l on the aggregation
    replaced = ug_nn.SAGEConv(6, 4)
    replaced.lin_l = torch.nn.Sequential(torch.nn.Linear(6, 4))  # not a plain Linear: runs as written
    assert _aggregated_widths(lambda: replaced(x, edge_index)) == [6]
    lazy = ug_nn.SAGEConv(-1, 4)
    assert _aggregated_widths(lambda: lazy(x, edge_index)) == [6]  # its weight is made by this call


@pytest.mark.parametrize("name", ["SAGEConv", "GraphConv"])
def test_a_narrowing_map_runs_before_the_kernels_aggregation(name, compare, interpret, tiny_graph, any_size):
    """The same order on the Triton kernels (the interpreter), the weighted GraphConv's edge
    weights' gradient included."""
    x, edge_index = tiny_graph
    weight = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    ours, theirs = getattr(ug_nn, name)(4, 3), getattr(pyg_nn, name)(4, 3)
    if name == "SAGEConv":
        compare(ours, theirs, lambda layer, x: layer(x, edge_index), [x], train=True)
    else:
        compare(ours, theirs, lambda layer, x, w: layer(x, edge_index, w), [x, weight], train=True)
    assert _aggregated_widths(lambda: ours(x.detach().requires_grad_(), edge_index)) == [3]


@pytest.mark.parametrize("traced", [False, True], ids=["custom-ops", "traced"])
def test_a_compiled_narrowing_map_runs_before_the_aggregation(
    traced, compare, compile_ours, isolated_graph, any_size, monkeypatch
):
    """Compiled, the graph Dynamo makes holds the same order, on the custom ops and on the traced
    aggregation of small graphs, with no graph break, and matches PyG."""
    if not traced:
        monkeypatch.setattr(graph_argument, "TRACED_GRAPH_EDGES", -1)
    x, edge_index, _ = isolated_graph
    torch.manual_seed(0)
    ours, theirs = ug_nn.SAGEConv(6, 4), pyg_nn.SAGEConv(6, 4)
    forward, counter = compile_ours(lambda layer, x: layer(x, edge_index), ours)
    compare(ours, theirs, forward, [x], train=True)
    assert counter.frame_count == 1
    graphs = []

    def backend(graph_module, inputs):
        graphs.append(graph_module.graph)
        return graph_module.forward

    torch._dynamo.reset()
    torch.compile(lambda x: ours(x, edge_index), backend=backend)(x.detach().requires_grad_())
    (graph,) = graphs
    linears = [node for node in graph.nodes if node.target is torch._C._nn.linear]
    # The projection without its bias, of the input itself: the aggregation reads its output.
    (projection,) = [node for node in linears if len(node.args) == 2 and node.args[0].op == "placeholder"]
    assert all(user.target is not torch._C._nn.linear for user in projection.users)


@pytest.mark.parametrize("graph", ["empty", "hub"])
@pytest.mark.parametrize("name,make,call", NARROWING, ids=[name for name, _, _ in NARROWING])
def test_a_narrowing_map_on_an_empty_graph_and_a_hub(name, make, call, graph, compare, any_size):
    """Map first on a graph without edges (every output the root term and the bias) and on one
    vertex receiving 2,000 edges (duplicates among them) while the others receive none."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(12, 6, generator=generator)
    if graph == "empty":
        edge_index = torch.empty(2, 0, dtype=torch.long)
    else:
        edge_index = torch.stack(
            [torch.randint(0, 12, (2000,), generator=generator), torch.zeros(2000, dtype=torch.long)]
        )
    weight = torch.rand(edge_index.size(1), generator=generator)
    torch.manual_seed(0)
    ours, theirs = make(ug_nn), make(pyg_nn)
    compare(ours, theirs, lambda layer, x, w: call(layer, x, edge_index, w), [x, weight], train=True)
    assert _aggregated_widths(lambda: call(ours, x.detach().requires_grad_(), edge_index, weight)) == [4]
