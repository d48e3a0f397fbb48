"""``softmax_aggregate``: GAT's softmax and aggregation with a closed-form backward, against the
same computation written with PyG's ``softmax`` and ``index_add``, on every graph case, through
the reference executor and through the kernels."""
import pytest
import torch
from torch_geometric.utils import softmax

import pyg_ugrapher as ug
from pyg_ugrapher.attention import softmax_aggregate, softmax_aggregate_op

HEADS, CHANNELS = 3, 5


def _inputs(graph, dtype=torch.float32, seed=0, dropout=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(graph.num_edges, HEADS, generator=gen, dtype=dtype)
    x = torch.randn(graph.num_src, HEADS, CHANNELS, generator=gen, dtype=dtype)
    keep = None
    if dropout:
        keep = (torch.rand(graph.num_edges, HEADS, generator=gen) > 0.4).to(dtype) / 0.6
    return logits, x, keep


def _pyg(graph, logits, x, keep):
    """PyG's GATConv computation: softmax over incoming edges, dropout, weighted sum."""
    src, dst = graph.edge_index
    alpha = softmax(logits, dst, num_nodes=graph.num_dst)
    if keep is not None:
        alpha = alpha * keep
    out = x.new_zeros(graph.num_dst, HEADS, CHANNELS)
    return out.index_add(0, dst, alpha.unsqueeze(-1) * x[src])


def _forward_backward(fn, graph, logits, x, keep, seed=1):
    logits, x = logits.clone().requires_grad_(), x.clone().requires_grad_()
    out = fn(graph, logits, x, keep)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    return [out] + list(torch.autograd.grad(out, (logits, x), grad))


@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_matches_pyg(graph_factory, graph_case, check_close, dropout):
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, dropout=dropout)
    for ours, theirs in zip(_forward_backward(softmax_aggregate, graph, *inputs),
                            _forward_backward(_pyg, graph, *inputs)):
        check_close(ours, theirs)


@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_kernels_match_pyg(device, graph_factory, graph_case, check_close, dropout):
    """The same through the Triton kernels (the interpreter on a CPU), outputs poisoned first."""
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, seed=2, dropout=dropout)
    moved = [None if t is None else t.to(device) for t in inputs]
    for ours, theirs in zip(_forward_backward(softmax_aggregate, graph, *moved),
                            _forward_backward(_pyg, graph, *inputs)):
        check_close(ours.cpu(), theirs)


def _custom_op(graph, logits, x, keep):
    """The custom op a compiled graph calls, called directly (its autograd formula included)."""
    return softmax_aggregate_op(graph.structure(x.device), logits, x, keep)[0]


def _compiled(graph, logits, x, keep):
    """``softmax_aggregate`` under ``torch.compile`` (no graph break: it calls the custom op)."""
    torch._dynamo.reset()
    return torch.compile(softmax_aggregate, fullgraph=True, backend="aot_eager")(graph, logits, x, keep)


@pytest.mark.parametrize("path", [_custom_op, _compiled], ids=["custom_op", "compiled"])
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_custom_op_matches_pyg(graph_factory, graph_case, check_close, dropout, path):
    graph = graph_factory(graph_case)
    inputs = _inputs(graph, seed=3, dropout=dropout)
    for ours, theirs in zip(_forward_backward(path, graph, *inputs), _forward_backward(_pyg, graph, *inputs)):
        check_close(ours, theirs)


@pytest.mark.parametrize("fn", [softmax_aggregate, _custom_op], ids=["function", "custom_op"])
@pytest.mark.parametrize("wrt", ["logits", "x"])
def test_one_sided_gradients(graph_factory, check_close, fn, wrt):
    """Only the gradient asked for is computed (the backward's one-sided branches)."""
    graph = graph_factory("mixed")
    logits, x, keep = _inputs(graph, seed=4, dropout=True)
    leaf = (logits if wrt == "logits" else x).clone().requires_grad_()
    args = (leaf, x, keep) if wrt == "logits" else (logits, leaf, keep)
    grad = torch.randn(graph.num_dst, HEADS, CHANNELS, generator=torch.Generator().manual_seed(5))
    (ours,) = torch.autograd.grad(fn(graph, *args), leaf, grad)
    theirs_leaf = leaf.detach().clone().requires_grad_()
    theirs_args = (theirs_leaf, x, keep) if wrt == "logits" else (logits, theirs_leaf, keep)
    (theirs,) = torch.autograd.grad(_pyg(graph, *theirs_args), theirs_leaf, grad)
    check_close(ours, theirs)


def test_isolated_destinations_get_zero(graph_factory, isolated):
    graph = graph_factory("isolated")
    out = softmax_aggregate(graph, *_inputs(graph))
    assert torch.equal(out[isolated(graph)], torch.zeros_like(out[isolated(graph)]))


@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_gradcheck(interpret, graph_factory, dropout):
    graph = graph_factory("tiny")
    logits, x, keep = _inputs(graph, dtype=torch.float64, dropout=dropout)
    assert torch.autograd.gradcheck(lambda a, b: softmax_aggregate(graph, a, b, keep),
                                    (logits.requires_grad_(), x.requires_grad_()))


def test_double_backward_is_refused(graph_factory):
    graph = graph_factory("tiny")
    logits, x, _ = _inputs(graph)
    x.requires_grad_()
    (grad,) = torch.autograd.grad(softmax_aggregate(graph, logits, x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="twice|once"):
        grad.sum().backward()


@pytest.mark.parametrize("change, error, name", [
    (lambda g, l, x, k: (g.edge_index, l, x, k), TypeError, "graph"),
    (lambda g, l, x, k: (g, l.long(), x, k), TypeError, "logits"),
    (lambda g, l, x, k: (g, l[1:], x, k), ValueError, "logits"),
    (lambda g, l, x, k: (g, l, x[:, :2], k), ValueError, "x"),
    (lambda g, l, x, k: (g, l, x.flatten(1), k), ValueError, "x"),
    (lambda g, l, x, k: (g, l, x, l[:, :1]), ValueError, "keep"),
])
def test_bad_input(graph_factory, change, error, name):
    graph = graph_factory("tiny")
    with pytest.raises(error, match=f"{name}:"):
        softmax_aggregate(*change(graph, *_inputs(graph)[:2], None))
