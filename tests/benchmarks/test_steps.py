import contextlib
import math
import types

import pandas as pd
import pytest
import torch
import torch_geometric.nn

from benchmarks import graph_free, report, rows, steps
from benchmarks.train_e2e import MODELS, build_model


def test_eager_and_compiled_steps_on_cora(tmp_path, monkeypatch):
    """Every case of a CPU run is a row; both implementations start from the same weights, so
    their eager losses agree; the plot and the table are drawn from the file."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the reference executor on a CPU
    steps.main(
        ["--datasets", "cora", "--models", "gcn", "sage", "--modes", "eager", "--batching", "full", "minibatch"]
        + ["--steps", "1", "--repeats", "2", "--parts", "4", "--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "steps.csv")
    assert tuple(results.columns) == rows.STEP_COLUMNS
    assert (results["status"] == "ok").all(), results["note"].tolist()
    # eager steps: PyG's, ours and the floor without graph operators
    assert set(zip(results["model"], results["impl"], results["batching"])) == {
        (m, i, b) for m in ("gcn", "sage") for i in ("pyg", "ours", "no-graph") for b in ("full", "minibatch")
    }
    assert all(math.isfinite(v) and v > 0 for v in results["step_ms"])
    assert (results["steps"] == 2).all() and (results["num_edges"] == 10556).all()
    assert results["recordings"].isna().all()  # no recording on a CPU
    assert (results["python_calls"] > 0).all() and results["kernels"].isna().all()  # no kernels counted on a CPU
    for (_, _), case in results.groupby(["model", "batching"]):
        losses = case.set_index("impl")["final_loss"]
        assert losses["ours"] == pytest.approx(losses["pyg"], rel=1e-4)
    table = report.steps_table(results)
    assert {"pyg eager", "ours eager", "no-graph eager"} <= set(table.columns) and len(table) == 4
    assert (tmp_path / "steps.png").stat().st_size > 0


def test_the_floor_is_timed_in_eager_and_recorded_steps():
    assert steps.implementations("eager") == ["pyg", "ours", "no-graph"]
    assert steps.implementations("recorded") == ["pyg", "ours", "no-graph"]
    assert steps.implementations("compiled") == ["pyg", "ours"]
    assert steps.implementations("reduce-overhead") == ["pyg", "ours"]


def test_minibatches_cover_every_node_once():
    problem = steps.make_problem("cora", features=8, seed=0)
    batches = steps.minibatches(problem, parts=4, seed=0)
    assert len(batches) == 4
    assert sum(b.num_nodes for b in batches) == problem.data.num_nodes
    for batch in batches:
        assert batch.x.shape == (batch.num_nodes, 8)
        assert int(batch.edge_index.max()) < batch.num_nodes
        train = batch.weight > 0
        if train.any():
            assert float(batch.weight.sum()) == pytest.approx(1.0)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        steps.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        steps.parse_args(["--models", "nope"])


def test_wall_clock_counts_every_call():
    calls = []
    times = steps.wall_ms(lambda: calls.append(1), steps=3, repeats=4, device=torch.device("cpu"))
    assert len(times) == 4 and len(calls) == 12 and all(t >= 0 for t in times)
    assert steps.count_syncs(lambda: None, torch.device("cpu")) is None


def test_python_calls_are_counted_per_step():
    def nested() -> None:
        pass

    def step() -> None:
        for _ in range(5):
            nested()

    # step() and its five nested() calls, each step
    assert steps.count_python_calls(step, steps=4) == pytest.approx(6.0)
    assert steps.count_kernels(step, torch.device("cpu")) is None


class _Fake:
    """A case whose steps log its name."""

    def __init__(self, name, log):
        self.name, self.log = name, log
        self.mode, self.device, self.step = "eager", torch.device("cpu"), None

    def own_rng(self):
        return contextlib.nullcontext()

    def run(self):
        self.log.append(self.name)
        return torch.tensor(1.0)


def _args(**kwargs):
    return types.SimpleNamespace(steps=2, repeats=3, count_kernels=False, **kwargs)


def test_implementations_are_timed_in_alternating_rounds():
    log = []
    rows = {"pyg": {}, "ours": {}}
    steps.run_pair(lambda impl: _Fake(impl, log), rows, _args())
    warmup = 2 * steps.WARMUP_STEPS
    timed = log[warmup : warmup + 12]
    # one run of 2 steps each per round, the order reversed every round
    assert timed == ["pyg"] * 2 + ["ours"] * 4 + ["pyg"] * 4 + ["ours"] * 2
    for row in rows.values():
        assert row["status"] == "ok" and row["steps"] == 6 and row["python_calls"] > 0


def test_a_failing_implementation_leaves_the_other_timed():
    log = []
    rows = {"pyg": {}, "ours": {}}

    def build(impl):
        if impl == "pyg":
            raise ValueError("cannot build")
        return _Fake(impl, log)

    steps.run_pair(build, rows, _args())
    assert rows["pyg"]["status"] != "ok" and "cannot build" in rows["pyg"]["note"]
    assert rows["ours"]["status"] == "ok" and rows["ours"]["steps"] == 6


def test_compiled_model_with_eager_layers(tmp_path, monkeypatch):
    """``compiled-layers-eager`` compiles the model with every message-passing layer left out of the
    compiled graph; its step trains as the eager one does."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the reference executor on a CPU
    args = steps.parse_args(["--device", "cpu", "--features", "8", "--hidden", "8", "--out", str(tmp_path)])
    problem = steps.make_problem("cora", features=8, seed=0)
    eager = steps.Case(problem, "gcn", "ours", "eager", "full", args)
    compiled = steps.Case(problem, "gcn", "ours", "compiled-layers-eager", "full", args)
    layers = [m for m in compiled.model.modules() if isinstance(m, torch_geometric.nn.MessagePassing)]
    assert len(layers) == 2 and all(getattr(m.forward, "_torchdynamo_disable", False) for m in layers)
    with eager.own_rng():
        expected = [float(eager.run()) for _ in range(2)]
    # Inductor draws eager's dropout masks; its config is patched as a context: monkeypatch's undo
    # would delete the entry from the config module.
    with compiled.own_rng(), torch._inductor.config.patch(fallback_random=True):
        got = [float(compiled.run()) for _ in range(2)]
    assert got == pytest.approx(expected, rel=1e-5)
    assert "compiled-layers-eager" not in steps.parse_args([]).modes  # opt-in


def test_only_eager_steps_have_the_floor_without_graph_operators(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the reference executor on a CPU
    steps.main(
        ["--datasets", "cora", "--models", "sage", "--modes", "compiled", "--batching", "full"]
        + ["--steps", "1", "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)]
    )
    results = pd.read_csv(tmp_path / "steps.csv")
    assert sorted(results["impl"]) == ["ours", "pyg"] and (results["status"] == "ok").all()


@pytest.mark.parametrize("model", MODELS)
def test_graph_free_models_ignore_the_graph(model):
    """Each stand-in takes its namesake's arguments, gives its output width and never reads the
    graph: any edge index, even none, gives the same output, and every used parameter trains."""
    torch.manual_seed(0)
    net = build_model(model, graph_free, 12, 16, 5, False).eval()
    reference = build_model(model, torch_geometric.nn, 12, 16, 5, False).eval()
    x = torch.randn(7, 12)
    ring = torch.stack([torch.arange(7), torch.arange(1, 8) % 7])
    out = net(x, ring)
    assert out.shape == reference(x, ring).shape == (7, 5)
    assert torch.equal(out, net(x, torch.empty(2, 0, dtype=torch.long)))
    assert torch.equal(out, net(x, None))
    out.square().sum().backward()
    trained = [name for name, p in net.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert trained and all("lin" in name or "nn" in name or "bias" in name or "eps" in name for name in trained)


def test_graph_free_layers_compute_their_dense_maps():
    x = torch.randn(4, 3)
    gcn = graph_free.GCNConv(3, 2)
    torch.nn.init.normal_(gcn.bias)
    assert torch.allclose(gcn(x, None), x @ gcn.lin.weight.T + gcn.bias)
    sage = graph_free.SAGEConv(3, 2)
    assert torch.allclose(sage(x, None), sage.lin_l(x) + x @ sage.lin_r.weight.T)
    gat = graph_free.GATConv(3, 2, heads=4, concat=False)
    assert torch.allclose(gat(x, None), (x @ gat.lin.weight.T).view(4, 4, 2).mean(1) + gat.bias)
    gin = graph_free.GINConv(torch.nn.Linear(3, 2), eps=0.5)
    assert torch.allclose(gin(x, None), gin.nn(1.5 * x))
    assert "eps" in dict(gin.named_buffers()) and "eps" in dict(
        graph_free.GINConv(torch.nn.Identity(), train_eps=True).named_parameters()
    )
