"""A gather kernel that also writes one value per edge (``run_with_edge_output``): what a backward
pass uses to compute a vertex gradient and an edge gradient in one walk over the edges.

Both outputs are compared with the reference executor (float64 oracle) on every test graph, under
the vertex and group strategies, in each way a feature tile can map onto the edge output's sums
(:func:`triton_kernels.codegen.edge_mode`); outputs are poisoned first.
"""

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher import reference
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.ops import graph_arrays
from triton_kernels import dispatch, run_with_edge_output
from triton_kernels.codegen import edge_mode

pytestmark = pytest.mark.usefixtures("poison")

GRAPHS = ("empty", "isolated", "self_loops", "duplicates", "hub", "bipartite", "mixed")
#: (gather, message, (H, C), edge weight per head): GAT's and u_mul_e_sum's backward (a dot per
#: head), a full edge operand, and an elementwise edge output.
PAIRS = [
    ("u_mul_e_sum", "v_dot_u", (2, 4), True),
    ("u_mul_e_sum", "v_dot_u", (1, 8), True),
    ("u_mul_e_sum", "v_dot_u", (1, 5), False),
    ("u_mul_e_sum", "v_dot_u", (2, 3), True),
    ("copy_u_sum", "v_mul_u", (2, 3), False),
    ("u_mul_e_mean", "u_sub_v", (1, 6), False),
]
BLOCK_F = (1, 2, 4, 8)
SCHEDULES = {
    "vertex": dict(block_v=2, block_e=4, num_warps=4),
    "group": dict(group_size=4, block_v=2, block_e=2, num_warps=4),
}


class Pair:
    """A gather op and a message op on one graph with random operands, as a backward pass has
    them: tensors of a kind are shared between the two ops."""

    def __init__(
        self,
        graph,
        gather: str,
        message: str,
        heads: int,
        inner: int,
        per_head: bool,
        seed: int,
        device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        rows = {"src_v": graph.num_src, "dst_v": graph.num_dst, "edge": graph.num_edges}
        tensors: dict = {}
        self.graph = graph
        self.ops = (OpInfo.from_name(gather), OpInfo.from_name(message))
        self.operands = []
        for op in self.ops:
            for kind in op.inputs:
                if kind not in tensors:
                    shape = (rows[kind], heads, 1 if kind == "edge" and per_head else inner)
                    tensors[kind] = (torch.rand(shape, generator=generator) + 0.5).to(device, dtype)
            self.operands.append([tensors[kind] for kind in op.inputs])
        self.layouts = [infer_layout(op, [t.shape for t in operands]) for op, operands in zip(self.ops, self.operands)]
        self.arrays = graph_arrays(graph.structure(device))

    def run(self, info: ug.ParallelInfo, dtype: torch.dtype = torch.float32):
        """``run_with_edge_output`` on the pair: (gather output, edge output), or None."""
        return run_with_edge_output(
            self.ops[0],
            self.layouts[0],
            self.ops[1],
            self.layouts[1],
            self.arrays,
            self.operands[0],
            self.operands[1],
            info,
            (dtype, dtype),
        )

    def expected(self, dtype: torch.dtype = torch.float32):
        """Both outputs from the reference executor in float64, as ``dtype``."""
        return [
            reference.execute(self.graph, op, [t.double() for t in operands]).to(dtype)
            for op, operands in zip(self.ops, self.operands)
        ]

    def plan(self, info: ug.ParallelInfo):
        """The launch plan of the pair under ``info`` (``prepare_with_edge_output``), or None."""
        return dispatch.prepare_with_edge_output(
            self.ops[0],
            self.layouts[0],
            self.ops[1],
            self.layouts[1],
            self.operands[0],
            self.operands[1],
            info,
            (torch.float32, torch.float32),
        )


@pytest.mark.parametrize("strategy", ["vertex", "group"])
@pytest.mark.parametrize("gather,message,shape,per_head", PAIRS, ids=[f"{g}+{m}-{s[0]}x{s[1]}" for g, m, s, _ in PAIRS])
def test_both_outputs_match_the_reference(
    gather, message, shape, per_head, strategy, device, graph_factory, check_close, isolated
):
    heads, inner = shape
    modes = set()
    for index, case in enumerate(GRAPHS):
        graph = graph_factory(case, seed=index)
        pair = Pair(graph, gather, message, heads, inner, per_head, index, device)
        expected = pair.expected()
        for block_f in BLOCK_F:
            mode = edge_mode(heads * inner, pair.layouts[1].reduce_size, block_f)
            both = pair.run(ug.ParallelInfo(strategy, block_f=block_f, **SCHEDULES[strategy]))
            if mode is None:
                assert both is None, f"block_f={block_f} straddles the sums of {message}: must not fuse"
                continue
            modes.add(mode)
            context = f"{gather}+{message} on {case}, block_f={block_f} ({mode})"
            check_close(both[0], expected[0], context=context + ", gather output")
            check_close(both[1], expected[1], context=context + ", edge output")
            rows = both[0][isolated(graph)]
            assert torch.equal(rows, torch.zeros_like(rows)), f"{context}: rows without edges not 0"
    reduce_size = infer_layout(OpInfo.from_name(message), [(1, heads, inner)] * 2).reduce_size
    assert modes == {mode for mode in (edge_mode(heads * inner, reduce_size, b) for b in BLOCK_F) if mode}


def test_every_mode_is_covered():
    """The pairs above reach each way of writing the edge output, and one tiling that cannot fuse."""
    modes = set()
    for _, message, (heads, inner), _ in PAIRS:
        reduce_size = inner if OpInfo.from_name(message).reduces else 1
        modes |= {edge_mode(heads * inner, reduce_size, b) for b in BLOCK_F}
    assert modes == {"elementwise", "whole", "groups", "partial", None}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_f", [2, 8])
def test_half_types(dtype, block_f, device, graph_factory, check_close):
    """Half operands accumulate in float32; partial edge sums (block_f=2) add up in float32 too."""
    pair = Pair(graph_factory("hub", seed=3), "u_mul_e_sum", "v_dot_u", 2, 4, True, 1, device, dtype)
    out, edge_out = pair.run(ug.ParallelInfo("vertex", block_f=block_f, block_v=2, block_e=4, num_warps=4), dtype)
    assert out.dtype == dtype and edge_out.dtype == dtype
    for ours, expected, op in zip((out, edge_out), pair.expected(dtype), pair.ops):
        check_close(ours, expected, dtype, f"{op.name} in {dtype}")


@pytest.mark.parametrize("strategy", ["vertex", "group"])
@pytest.mark.parametrize(
    "gather,message,shape,per_head",
    PAIRS[:2] + PAIRS[4:],
    ids=[f"{g}+{m}-{s[0]}x{s[1]}" for g, m, s, _ in PAIRS[:2] + PAIRS[4:]],
)
def test_plan_matches_the_reference_call_after_call(
    gather, message, shape, per_head, strategy, device, graph_factory, check_close
):
    """One pair plan serves fresh operands and other graphs (it holds nothing of either), and
    declines a graph without edges and operands that share tensors differently than its own."""
    heads, inner = shape
    info = ug.ParallelInfo(strategy, block_f=8, **SCHEDULES[strategy])
    first = Pair(graph_factory("mixed"), gather, message, heads, inner, per_head, 0, device)
    plan = first.plan(info)
    assert plan is not None
    for index, case in enumerate(("mixed", "hub", "bipartite", "self_loops")):
        pair = Pair(graph_factory(case, seed=index), gather, message, heads, inner, per_head, index + 1, device)
        both = plan(pair.arrays, *pair.operands)
        for ours, expected, op in zip(both, pair.expected(), pair.ops):
            check_close(ours, expected, context=f"{op.name} on {case}")
    empty = Pair(graph_factory("empty"), gather, message, heads, inner, per_head, 9, device)
    assert plan(empty.arrays, *empty.operands) is None
    unshared = [t.clone() for t in first.operands[1]]
    assert plan(first.arrays, first.operands[0], unshared) is None


def test_plans_only_for_schedules_that_fuse(device, graph_factory):
    pair = Pair(graph_factory("mixed"), "u_mul_e_sum", "v_dot_u", 2, 4, True, 0, device)
    assert pair.plan(ug.ParallelInfo("edge", block_e=64, block_f=4, num_warps=4)) is None
    vertex = ug.ParallelInfo("vertex", block_f=4, block_v=2, block_e=2, num_warps=4)
    assert pair.plan(vertex) is not None
    straddling = Pair(graph_factory("mixed"), "u_mul_e_sum", "v_dot_u", 2, 3, True, 0, device)
    assert straddling.plan(vertex.with_knobs(block_f=2)) is None  # a tile inside no sum of 3


def test_operator_takes_the_plan_only_for_packed_operands(monkeypatch, interpret, graph_factory, check_close):
    """``run_gather_with_edge_output`` launches through its decision's pair plan when every operand
    is packed rows, and through ``run_with_edge_output`` otherwise; both give the reference's results."""
    from pyg_ugrapher.ops import run_gather_with_edge_output, serialized

    through = []
    monkeypatch.setattr(
        dispatch.PairPlan,
        "__call__",
        lambda self, *args, _call=dispatch.PairPlan.__call__: through.append("plan") or _call(self, *args),
    )
    monkeypatch.setattr(
        dispatch,
        "_launch",
        lambda *args, _launch=dispatch._launch, **kwargs: through.append("run") or _launch(*args, **kwargs),
    )
    graph = graph_factory("hub")
    schedule = ug.ParallelInfo("vertex", block_v=2, block_e=4, block_f=8, num_warps=4).serialize()
    for transposed in (False, True):
        pair = Pair(graph, "u_mul_e_sum", "v_dot_u", 2, 4, True, 0, torch.device("cpu"))
        if transposed:  # the same values, features not packed
            pair.operands = [
                [t.transpose(1, 2).contiguous().transpose(1, 2) for t in operands] for operands in pair.operands
            ]
            shared = pair.operands[0][0]
            pair.operands[1] = [shared if k == "src_v" else t for k, t in zip(pair.ops[1].inputs, pair.operands[1])]
        both = run_gather_with_edge_output(
            graph.structure(torch.device("cpu")),
            pair.operands[0],
            serialized(pair.ops[0]),
            pair.operands[1],
            serialized(pair.ops[1]),
            schedule,
            schedule,
        )
        for ours, expected, op in zip(both, pair.expected(), pair.ops):
            check_close(ours, expected, context=f"{op.name}, transposed={transposed}")
    assert through == ["plan", "run"]


def test_edge_parallel_schedules_do_not_fuse(device, graph_factory):
    pair = Pair(graph_factory("mixed"), "u_mul_e_sum", "v_dot_u", 1, 4, True, 0, device)
    assert pair.run(ug.ParallelInfo("edge", block_e=64, block_f=4, num_warps=4)) is None


def test_kernel_is_named_after_both_functions(device, graph_factory, monkeypatch):
    names = []
    load = dispatch.load_kernel
    dispatch._kernel.cache_clear()
    monkeypatch.setattr(dispatch, "load_kernel", lambda source, kernel: names.append(kernel) or load(source, kernel))
    Pair(graph_factory("mixed"), "u_mul_e_sum", "v_dot_u", 1, 4, True, 0, device).run(
        ug.ParallelInfo("vertex", block_v=4, block_e=32, block_f=4, num_warps=4)
    )
    assert names == ["vertex_parallel_sum_mul_u_e_edge_mul_v_u"]


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["vertex", "group"])
def test_hub_of_100k_edges(strategy, device, hub_graph, check_close):
    """A source with 100k out-edges: on the reversed graph, one row of 100k edges."""
    graph = hub_graph
    for heads, inner, block_f in ((4, 32, 128), (4, 32, 16), (1, 128, 64)):
        pair = Pair(graph, "u_mul_e_sum", "v_dot_u", heads, inner, True, 1, device)
        knobs = dict(group_size=128, block_v=4, block_e=4) if strategy == "group" else dict(block_v=1, block_e=16)
        knobs["num_warps"] = 4
        both = pair.run(ug.ParallelInfo(strategy, block_f=block_f, **knobs))
        for ours, expected, op in zip(both, pair.expected(), pair.ops):
            check_close(ours, expected, context=f"{op.name} H={heads} C={inner} block_f={block_f}")
