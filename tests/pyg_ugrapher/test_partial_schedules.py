"""Partial schedules through ``ug.compute``: the user names a strategy (and maybe some knobs), the
selection chooses the rest per graph, op and width, forward and backward; a knob too wide for the
op is narrowed with a warning."""

import pytest
import torch

import pyg_ugrapher as ug
from autotune import selection
from pyg_ugrapher import reference

WIDTHS = (1, 3, 8, 16, 32, 33, 64, 200)


@pytest.fixture
def resolved(monkeypatch):
    """Every ``(op, width, partial, complete)`` that :func:`autotune.selection.resolve` decides in
    the test; decisions made before it are stale."""
    found = []
    resolve = selection.resolve

    def recording(graph, op, F, partial, *args, **kwargs):
        complete = resolve(graph, op, F, partial, *args, **kwargs)
        found.append((op, F, partial, complete))
        return complete

    monkeypatch.setattr(selection, "generation", object())
    monkeypatch.setattr(selection, "resolve", recording)
    return found


def _forward_backward(graph, op, operands, parallel_info=None, dtype=torch.float32):
    """``op``'s output and every operand's gradient, under ``parallel_info`` (``None``: the
    reference executor, in float64)."""
    leaves = [t.detach().to(torch.float64 if parallel_info is None else dtype).requires_grad_() for t in operands]
    if parallel_info is None:
        out = reference.execute(graph, op, leaves)
    else:
        out = ug.compute(graph, op, *leaves, parallel_info=parallel_info)
    grad = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape).to(out.device, out.dtype)
    out.backward(grad)
    return [out.detach()] + [leaf.grad for leaf in leaves]


def _check(graph, op, operands, info, check_close, dtype=torch.float32, context=""):
    ours = _forward_backward(graph, op, operands, info, dtype)
    expected = _forward_backward(graph, op, [t.cpu() for t in operands])
    for name, got, want in zip(["out"] + list(op.inputs), ours, expected):
        check_close(got.cpu(), want.to(got.dtype), dtype, f"{op.name} {name} under {info} {context}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_a_strategy_alone_runs_at_every_width(strategy, width, device, graph_factory, resolved, check_close):
    """``ParallelInfo(strategy)`` works for any width, forward and backward: every op the call runs
    (the backward's on the reversed graph and its message ops too) gets a complete schedule of that
    strategy chosen for its own width."""
    graph = graph_factory("tiny")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    generator = torch.Generator().manual_seed(width)
    operands = [
        torch.randn(graph.num_src, width, generator=generator).to(device),
        torch.randn(graph.num_edges, width, generator=generator).to(device),
    ]
    _check(graph, op, operands, ug.ParallelInfo(strategy), check_close)
    assert len(resolved) >= 2, "the backward's ops (on the reversed graph) were resolved too"
    for _, F, partial, complete in resolved:
        assert partial == ug.ParallelInfo(strategy) and complete.is_complete and complete.strategy == strategy
        assert complete.validate_for(F) is complete


@pytest.mark.parametrize(
    "name,width", [("copy_u_mean", 3), ("u_sub_v_max", 8), ("e_div_u_min", 5), ("u_add_v", 33), ("u_dot_v", 3)]
)
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_a_strategy_alone_runs_every_gather_and_message_op(strategy, name, width, device, graph_factory, check_close):
    graph = graph_factory("hub")
    op = ug.OpInfo.from_name(name)
    rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
    generator = torch.Generator().manual_seed(1)
    operands = [(torch.rand(rows[kind], width, generator=generator) + 0.5).to(device) for kind in op.inputs]
    _check(graph, op, operands, ug.ParallelInfo(strategy), check_close)


@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_a_strategy_alone_runs_half_types(strategy, device, graph_factory, check_close):
    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    generator = torch.Generator().manual_seed(2)
    operands = [
        torch.randn(graph.num_src, 33, generator=generator).to(device),
        torch.randn(graph.num_edges, 1, generator=generator).to(device),
    ]
    _check(graph, op, operands, ug.ParallelInfo(strategy), check_close, torch.bfloat16)


def test_explicit_knobs_are_honoured(device, graph_factory, resolved, check_close):
    """The knobs given are the knobs run, forward and backward; the others are chosen."""
    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    generator = torch.Generator().manual_seed(3)
    operands = [
        torch.randn(graph.num_src, 8, generator=generator).to(device),
        torch.randn(graph.num_edges, 8, generator=generator).to(device),
    ]
    partial = ug.ParallelInfo("group", group_size=8, block_e=2, block_f=4)
    _check(graph, op, operands, partial, check_close)
    assert len(resolved) >= 2
    for _, _, asked, complete in resolved:
        assert asked == partial and partial.admits(complete) and complete.is_complete


def test_a_complete_schedule_is_run_as_it_is(device, graph_factory, resolved, check_close):
    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("copy_u_sum")
    x = torch.randn(graph.num_src, 8, generator=torch.Generator().manual_seed(4)).to(device)
    _check(graph, op, [x], ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=8, num_warps=2), check_close)
    assert not resolved


def test_a_feature_tile_wider_than_the_op_narrows_with_a_warning(device, graph_factory, resolved, check_close):
    """A ``block_f`` past the op's width (rounded up to a power of two) runs as that width; the
    warning says what changed and why. The backward runs under the narrowed tile too."""
    graph = graph_factory("mixed")
    op = ug.OpInfo.from_name("u_mul_e_sum")
    generator = torch.Generator().manual_seed(5)
    operands = [
        torch.randn(graph.num_src, 3, generator=generator).to(device),
        torch.randn(graph.num_edges, 3, generator=generator).to(device),
    ]
    with pytest.warns(UserWarning, match=r"^parallel_info: narrowed block_f=64 to 4: u_mul_e_sum has 3 features"):
        _check(graph, op, operands, ug.ParallelInfo("edge", block_f=64, block_e=32), check_close)
    assert resolved and all(
        asked == ug.ParallelInfo("edge", block_f=4, block_e=32) and complete.block_f == 4
        for _, _, asked, complete in resolved
    )


def test_invalid_knobs_are_rejected_naming_the_knob():
    """What no operator could run fails on construction, before any call."""
    with pytest.raises(ValueError, match="^block_e: a tile of"):
        ug.ParallelInfo("vertex", block_v=256, block_e=128)
    with pytest.raises(ValueError, match="^group_size:"):
        ug.ParallelInfo("group", group_size=4, block_e=8)
    with pytest.raises(ValueError, match="^block_v: not a knob of the 'edge' strategy"):
        ug.ParallelInfo("edge", block_v=4)
