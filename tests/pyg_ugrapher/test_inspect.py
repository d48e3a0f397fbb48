"""``ug.plan``: one entry per operator a forward pass runs and per propagation that fell back to PyG."""

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher.inspect import Plan, PlanEntry


@pytest.fixture(autouse=True)
def reference_executor(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


class WeightedConv(ug.MessagePassing):
    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_j, edge_weight):
        return x_j * edge_weight.view(-1, 1)


class InPlaceConv(ug.MessagePassing):
    """Changes its messages in place, which neither a capture nor a staged run follows."""

    def __init__(self):
        super().__init__(aggr="max")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return torch.cat([x_i, x_j.sub_(x_i)], dim=-1)


class Attention(ug.MessagePassing):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return (x_i * x_j).sum(dim=-1, keepdim=True)


class DirectCompute(torch.nn.Module):
    """A layer calling ``ug.compute`` itself, with an explicit schedule."""

    schedule = ug.ParallelInfo("edge", block_e=32, block_f=8)

    def forward(self, x, edge_index):
        return ug.compute(edge_index, "copy_u_mean", x, num_nodes=x.size(0), parallel_info=self.schedule)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = WeightedConv()
        self.block = torch.nn.ModuleDict({"conv2": InPlaceConv()})
        self.direct = DirectCompute()

    def forward(self, x, edge_index, edge_weight):
        h = self.conv1(x, edge_index, edge_weight).relu()
        h = self.block["conv2"](h, edge_index)
        return self.direct(h, edge_index)


@pytest.fixture
def graph():
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.tensor([[0, 1, 2, 3, 3, 0, 2], [1, 2, 0, 0, 1, 1, 2]])
    return torch.randn(5, 4, generator=generator, requires_grad=True), edge_index, torch.rand(7, generator=generator)


def test_two_layers_and_a_direct_call(graph):
    x, edge_index, weight = graph
    model = Model()
    plan = ug.plan(model, x, edge_index, weight)
    assert isinstance(plan, Plan) and len(plan) == 3 and all(isinstance(e, PlanEntry) for e in plan)
    captured, fallback, direct = plan
    assert (captured.module, captured.module_type) == ("conv1", "WeightedConv")
    assert captured.op == ug.OpInfo.from_name("u_mul_e_sum") and captured.fallback_reason is None
    assert isinstance(captured.parallel_info, ug.ParallelInfo) and captured.parallel_info.is_complete
    assert captured.chosen_by == (("strategy", "heuristic"),) + tuple(
        (knob, "heuristic") for knob in captured.parallel_info.knobs
    )  # the CPU's rules chose it all
    assert "@triton.jit" in captured.source and "def vertex_parallel_sum_mul_u_e(" in captured.source
    assert captured.shapes == ((5, 4), (7, 1)) and captured.dtype == torch.float32
    assert (fallback.module, fallback.op, fallback.source) == ("block.conv2", None, None)
    assert "in place" in fallback.fallback_reason
    assert direct.module == "direct" and direct.op.name == "copy_u_mean"
    # The explicit knobs are honoured, the one left unset chosen for this call.
    assert DirectCompute.schedule.admits(direct.parallel_info) and direct.parallel_info.is_complete
    assert direct.chosen_by == (
        ("strategy", "user"),
        ("block_e", "user"),
        ("block_f", "user"),
        ("num_warps", "heuristic"),
    )
    assert direct.source


def test_plan_prints_readably(graph):
    plan = ug.plan(Model(), *graph)
    text = str(plan)
    assert text.startswith("Plan: 2 operator(s), 1 PyG fallback(s)")
    for expected in (
        "[0] conv1 (WeightedConv): u_mul_e_sum",
        "for each edge (u, e, v)",
        "schedule: ParallelInfo(",
        "chosen by: strategy=heuristic, ",
        "chosen by: strategy=user, block_e=user, block_f=user, num_warps=heuristic",
        "source (first",
        "| @triton.jit",
        "[1] block.conv2 (InPlaceConv): PyG fallback",
        "reason: message() modifies a tensor in place",
        "[2] direct (DirectCompute): copy_u_mean",
    ):
        assert expected in text, expected
    assert repr(plan) == text and repr(plan[0]) == str(plan[0])
    assert str(Plan()) == "Plan: no graph operator ran"


def test_dot_product_message_runs_two_operators(graph):
    x, edge_index, _ = graph
    plan = ug.plan(Attention(), x, edge_index)
    assert [entry.op.name for entry in plan] == ["v_dot_u", "copy_e_sum"]
    assert [entry.module for entry in plan] == ["", ""] and "<model> (Attention)" in str(plan[0])


def test_plan_runs_without_gradients_and_leaves_no_hooks(graph):
    hooks = dict(torch.nn.modules.module._global_forward_hooks)
    pre_hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    model = Model()
    ug.plan(model, *graph)
    assert dict(torch.nn.modules.module._global_forward_hooks) == hooks
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == pre_hooks
    assert model.conv1.fallback_reason is None  # the global hooks did not make the layers fall back
    assert all(p.grad is None for p in model.parameters()) and graph[0].grad is None


class WideSchedule(torch.nn.Module):
    """``ug.compute`` with a feature tile wider than its 4 features, and a strategy alone."""

    def forward(self, x, edge_index):
        h = ug.compute(
            edge_index,
            "copy_u_sum",
            x,
            num_nodes=x.size(0),
            parallel_info=ug.ParallelInfo("vertex", block_f=64, num_warps=2),
        )
        return ug.compute(edge_index, "copy_u_max", h, num_nodes=x.size(0), parallel_info=ug.ParallelInfo("group"))


def test_plan_shows_narrowed_and_chosen_knobs(graph):
    x, edge_index, _ = graph
    with pytest.warns(UserWarning, match="^parallel_info: narrowed block_f=64 to 4: copy_u_sum has 4 features"):
        plan = ug.plan(WideSchedule(), x, edge_index)
    narrowed, group = plan
    assert narrowed.parallel_info.block_f == 4 and narrowed.parallel_info.num_warps == 2
    assert dict(narrowed.chosen_by) == {
        "strategy": "user",
        "block_v": "heuristic",
        "block_e": "heuristic",
        "block_f": "narrowed from 64",
        "num_warps": "user",
        "num_stages": "fixed",
    }
    assert group.parallel_info.strategy == "group" and group.parallel_info.is_complete
    assert dict(group.chosen_by)["strategy"] == "user" and dict(group.chosen_by)["group_size"] == "heuristic"
    assert "block_f=narrowed from 64" in str(plan)


def test_plan_names_a_staged_propagation(graph):
    class StagedConv(ug.MessagePassing):
        def __init__(self):
            super().__init__(aggr="max")
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))

    x, edge_index, _ = graph
    plan = ug.plan(StagedConv(), x, edge_index)
    # The first Linear is split into node-row products: relu(A[dst] + B[src]) per edge in one
    # operator; the second Linear in PyTorch; the aggregation in a second operator.
    assert str(plan).startswith("Plan: 2 operator(s), 0 PyG fallback(s), 1 staged propagation(s)")
    assert plan[0].op.gather_op is None and plan[0].op.inputs == ("dst_v", "src_v")
    assert plan[1].op.name == "copy_e_max"
    staged = [entry for entry in plan if entry.staged is not None]
    assert len(staged) == 1 and staged[0].op is None and staged[0].fallback_reason is None
    assert "split by linearity" in staged[0].staged and "MLP" in staged[0].staged
    assert "<model> (StagedConv): staged" in str(plan)
