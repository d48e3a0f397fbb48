"""The one-pass softmax aggregation kernels (``triton_kernels.vertex_softmax``, and
``triton_kernels.group_softmax`` with ``softmax_combine`` for rows split into neighbour groups)
against PyG's softmax and an ``index_add`` in float64 and against the three forward operators on
the reference executor, on every graph case, for tiles of whole heads, tiles inside one head and a
single head, with and without a dropout scale, outputs and partial results poisoned first (the
``poison`` fixture)."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax

import pyg_ugrapher as ug
import triton_kernels
from pyg_ugrapher import reference
from pyg_ugrapher.attention import EPSILON, attention_ops
from pyg_ugrapher.ir import Expr, OpInfo
from pyg_ugrapher.ops import graph_arrays, layout_of, serialized
from triton_kernels import vertex_softmax

SLOPE = 0.2
#: GAT's score with an edge term: a leaky ReLU of a source, a destination and an edge logit.
SCORE = OpInfo(
    Expr.apply("leaky_relu", Expr.input(0) + Expr.input(1) + Expr.input(2), SLOPE),
    None,
    operands=("src_v", "dst_v", "edge"),
)
#: (heads, channels, block_f): tiles of two whole heads, inside one head, one head wider than the
#: tile, one head narrower than it, one channel per head.
TILINGS = [(4, 8, 16), (2, 16, 8), (1, 12, 8), (1, 12, 16), (3, 1, 2)]


class Case:
    """Random operands of the one pass on ``graph``, and what the kernel must compute from them."""

    def __init__(self, graph, heads, channels, dropout, dtype, device, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.graph, self.dtype = graph, dtype
        self.scores = [
            torch.randn(rows, heads, generator=gen).to(device, dtype)
            for rows in (graph.num_src, graph.num_dst, graph.num_edges)
        ]
        self.x = torch.randn(graph.num_src, heads, channels, generator=gen).to(device, dtype)
        self.keep = None
        if dropout:
            self.keep = ((torch.rand(graph.num_edges, heads, generator=gen) > 0.4).double() / 0.6).to(device, dtype)
        self.ops = attention_ops(SCORE.serialize(), dropout)
        self.operands = (
            [self.x] + [t.unsqueeze(-1) for t in self.scores] + ([] if self.keep is None else [self.keep.unsqueeze(-1)])
        )
        self.layout = layout_of(serialized(self.ops.one_pass), self.operands)
        self.arrays = graph_arrays(graph.structure(device))

    def run(self, info):
        return triton_kernels.run_softmax(
            self.ops.value,
            self.ops.logit,
            self.ops.one_pass.inputs,
            self.layout,
            self.arrays,
            self.operands,
            info,
            (self.dtype, self.dtype),
        )

    def expected(self):
        """``(out, log-normaliser)`` in float64: PyG's softmax, and ``max + log(sum exp + 1e-16)``
        per destination (the maximum taken as 0 where there is no edge)."""
        src, dst = (t.cpu() for t in self.graph.edge_index)
        a_src, a_dst, a_edge = (t.cpu().double() for t in self.scores)
        logits = F.leaky_relu(a_src[src] + a_dst[dst] + a_edge, SLOPE)
        rows = self.graph.num_dst
        alpha = softmax(logits, dst, num_nodes=rows)
        if self.keep is not None:
            alpha = alpha * self.keep.cpu().double()
        x = self.x.cpu().double()
        out = x.new_zeros((rows,) + tuple(x.shape[1:])).index_add(0, dst, alpha.unsqueeze(-1) * x[src])
        shift = torch.zeros(rows, logits.shape[1], dtype=torch.float64).scatter_reduce(
            0, dst[:, None].expand_as(logits), logits, "amax", include_self=False
        )
        total = torch.zeros_like(shift).index_add(0, dst, (logits - shift[dst]).exp())
        return out, (shift + (total + 1e-16).log()).unsqueeze(-1)

    def by_reference_executor(self):
        """``(out, log-normaliser)`` of the three forward operators, each run by the reference
        executor on the CPU (``graph_factory``'s graphs keep their edges there)."""
        graph = self.graph
        columns = [t.cpu().unsqueeze(-1) for t in self.scores]
        extra = [] if self.keep is None else [self.keep.cpu().unsqueeze(-1)]
        shift = reference.execute(graph, self.ops.shift, columns)
        total = reference.execute(graph, self.ops.denominator, columns + [shift])
        normaliser = shift + (total + EPSILON).log()
        return reference.execute(graph, self.ops.output, [self.x.cpu()] + columns + [normaliser] + extra), normaliser


#: Neighbour groups of 2 edges split the hubs and most rows of the small graph cases: both the
#: rows final in one chunk and the combined ones are tested on each case.
GROUP_SIZE = 2
STRATEGIES = ["vertex", "group"]


def _schedule(block_f, block_v=4, block_e=4, strategy="vertex", group_size=GROUP_SIZE):
    if strategy == "group":
        return ug.ParallelInfo(
            "group",
            group_size=group_size,
            block_f=block_f,
            block_v=block_v,
            block_e=min(block_e, group_size),
            num_warps=1,
        )
    return ug.ParallelInfo("vertex", block_f=block_f, block_v=block_v, block_e=block_e, num_warps=1)


@pytest.mark.parametrize("heads,channels,block_f", TILINGS, ids=[f"H{h}C{c}F{f}" for h, c, f in TILINGS])
@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_matches_pyg(
    graph_case, graph_factory, device, poison, check_close, heads, channels, block_f, dropout, strategy
):
    case = Case(graph_factory(graph_case), heads, channels, dropout, torch.float32, device)
    out, normaliser = case.run(_schedule(block_f, strategy=strategy))
    want_out, want_normaliser = case.expected()
    check_close(out.cpu(), want_out.float(), context="out")
    assert normaliser.shape == want_normaliser.shape and normaliser.dtype == torch.float32
    # Absolute: a log-normaliser is a logit, of order one whatever the row's size.
    assert (normaliser.cpu().double() - want_normaliser).abs().max().item() <= 1e-5


@pytest.mark.parametrize("heads,channels,block_f", TILINGS, ids=[f"H{h}C{c}F{f}" for h, c, f in TILINGS])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_matches_reference_executor(
    graph_case, graph_factory, edge_order, device, poison, check_close, heads, channels, block_f, strategy
):
    """Against the three forward operators on the reference executor, with random inputs of a new
    seed; on sorted structures and on structures in the user's order (grouped by row first)."""
    case = Case(graph_factory(graph_case, seed=5), heads, channels, True, torch.float32, device, seed=7)
    out, normaliser = case.run(_schedule(block_f, strategy=strategy))
    want_out, want_normaliser = case.by_reference_executor()
    check_close(out.cpu(), want_out, context="out")
    assert (normaliser.cpu() - want_normaliser).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dtypes(graph_factory, device, poison, check_close, dtype, strategy):
    case = Case(graph_factory("mixed"), 4, 8, True, dtype, device)
    out, normaliser = case.run(_schedule(16, strategy=strategy))
    want_out, want_normaliser = case.expected()
    assert out.dtype == dtype and normaliser.dtype == dtype
    check_close(out.cpu(), want_out.to(dtype), context="out")
    tolerance = 1e-10 if dtype == torch.float64 else 0.1  # half types round a logit of ~3 to 2^-8 or coarser
    assert (normaliser.cpu().double() - want_normaliser).abs().max().item() <= tolerance


def test_rows_blocked_side_by_side_and_long_rows(graph_factory, device, poison, check_close):
    """Many rows (or chunks) per program, one edge per step: both loops run over many steps of a
    hub's row, or of its chunks; a group larger than any row splits none."""
    case = Case(graph_factory("hub"), 2, 16, True, torch.float32, device, seed=3)
    want_out, want_normaliser = case.expected()
    schedules = [_schedule(32, block_v, block_e) for block_v, block_e in ((8, 1), (1, 2), (16, 8))] + [
        _schedule(32, block_v, block_e, "group", group_size)
        for block_v, block_e, group_size in ((8, 1, 1), (1, 2, 8), (16, 8, 8), (2, 4, 64))
    ]
    for info in schedules:
        out, normaliser = case.run(info)
        check_close(out.cpu(), want_out.float(), context=info.serialize())
        assert (normaliser.cpu().double() - want_normaliser).abs().max().item() <= 1e-5


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_large_logits_do_not_overflow(graph_factory, device, poison, check_close, strategy):
    """Logits far beyond exp's range: every exponent is taken against the running maximum (a
    chunk's, then the row's when chunks combine)."""
    case = Case(graph_factory("mixed"), 4, 8, False, torch.float32, device)
    case.scores[0].mul_(300.0)
    out, normaliser = case.run(_schedule(8, block_e=2, strategy=strategy))
    want_out, want_normaliser = case.expected()
    assert torch.isfinite(out).all() and torch.isfinite(normaliser).all()
    check_close(out.cpu(), want_out.float(), context="out")
    check_close(normaliser.cpu(), want_normaliser.float(), context="log-normaliser")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plan_matches_run(graph_factory, device, poison, strategy):
    case = Case(graph_factory("mixed"), 4, 8, True, torch.float32, device)
    info = _schedule(16, strategy=strategy)
    plan = triton_kernels.prepare_softmax(
        case.ops.value,
        case.ops.logit,
        case.ops.one_pass.inputs,
        case.layout,
        case.operands,
        info,
        (torch.float32, torch.float32),
    )
    for got, want in zip(plan(case.arrays, case.operands), case.run(info)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tilings_it_cannot_run(graph_factory, device, strategy):
    """Edge-parallel schedules, and tiles that straddle heads, are the three operators' work."""
    case = Case(graph_factory("mixed"), 3, 5, False, torch.float32, device)
    assert vertex_softmax.tiling(case.layout, _schedule(8, strategy=strategy)) is None
    assert case.run(_schedule(8, strategy=strategy)) is None
    assert not triton_kernels.runs_softmax(case.layout, _schedule(8, strategy=strategy))
    assert (
        triton_kernels.softmax_source(
            case.ops.value, case.ops.logit, case.ops.one_pass.inputs, case.layout, _schedule(8, strategy=strategy)
        )
        is None
    )
    whole_heads = Case(graph_factory("mixed"), 4, 8, False, torch.float32, device)
    edge = ug.ParallelInfo("edge", block_e=64, block_f=16, num_warps=4)
    assert vertex_softmax.tiling(whole_heads.layout, edge) is True
    assert not triton_kernels.runs_softmax(whole_heads.layout, edge) and whole_heads.run(edge) is None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_source_is_named_and_readable(graph_factory, device, strategy):
    case = Case(graph_factory("mixed"), 4, 8, True, torch.float32, device)
    source = triton_kernels.softmax_source(
        case.ops.value, case.ops.logit, case.ops.one_pass.inputs, case.layout, _schedule(16, strategy=strategy)
    )
    name = {"vertex": "vertex_softmax", "group": "group_softmax"}[strategy]
    assert f"def {name}_sum_mul_u_e_softmax_leaky_relu_add_add_u_v_e" in source
    assert "weighted by the softmax of" in source


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hub_of_100k_edges(device, hub_graph, check_close, dtype):
    """One program walks the hub's row of 100k edges, twice; or its chunks are combined (782 of
    128 edges, 25 of 4096)."""
    case = Case(hub_graph, 4, 32, True, dtype, device)
    want_out, want_normaliser = case.expected()
    schedules = [
        _schedule(128, 2, 4),
        _schedule(16, 1, 16),
        _schedule(128, 4, 2, "group", 128),
        _schedule(32, 16, 4, "group", 4096),
    ]
    for info in schedules:
        out, normaliser = case.run(info)
        check_close(out.cpu(), want_out.to(dtype), context=info.serialize())
        error = (normaliser.cpu().double() - want_normaliser).abs().max().item()
        assert error <= (1e-5 if dtype == torch.float32 else 0.1), f"log-normaliser: {error:.2e}"
