import contextlib
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from autotune import features as ft
from autotune import selection
from autotune.cost_model import CostModel
from autotune.heuristic import heuristic
from pyg_ugrapher.datasets import neighbor_sample, power_law_graph, uniform_graph
from pyg_ugrapher.graph import GraphTensor, derived_cache
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import mark_reused
from triton_kernels.row_offsets import build_user_order_pair
from triton_kernels.space import neighbours, space

GPU = ft.GpuInfo("test-gpu", 132, 90)
CUDA = torch.cuda.is_available()
#: The conversion of a model to a GPU forest, before any test replaces it.
CONVERT = selection._forest


SMALL_GRAPH_EDGES = selection.SMALL_GRAPH_EDGES
#: The rule itself: the suite's conftest replaces the module's function in every test.
READS_USER_ORDER = selection.reads_user_order


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """An empty decision cache; the test graphs are small, so the small-graph rule is off unless a
    test turns it back on. Without a GPU, the tests that pretend to have one score on the host
    (XGBoost), as a model that does not convert to a GPU forest is."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 0)
    if not CUDA:
        monkeypatch.setattr(selection, "_forest", lambda booster: None)
    selection.clear_cache()
    yield
    selection.clear_cache()


@pytest.fixture(scope="module")
def graphs():
    return [
        GraphTensor.from_edge_index(uniform_graph(200, 2000, seed=1), 200),
        GraphTensor.from_edge_index(power_law_graph(200, 2000, seed=2), 200),
    ]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, graphs):
    """A model trained on a known cost: the best schedule has block_e = 16 and the fewest warps."""
    frames = []
    for graph in graphs:
        for name, F in (("copy_u_sum", 64), ("u_add_v", 64), ("copy_u_max", 128)):
            op = OpInfo.from_name(name)
            infos, _ = ft.case_features(graph.stats(), op, F, 1, torch.float32, GPU)
            columns = ft.case_columns(graph.stats(), op, F, 1, torch.float32, GPU)
            frame = pd.DataFrame(ft.knob_columns(list(infos))).assign(**columns)
            frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    cost = (np.log2(table["block_e"]) - 4) ** 2 + 0.1 * np.log2(table["num_warps"])
    model = CostModel(n_estimators=60, num_leaves=31, min_child_samples=2).fit(
        ft.frame_features(table), cost, feature_name=list(ft.FEATURES)
    )
    return model.save_model(tmp_path_factory.mktemp("model") / "model.json")


def test_cpu_uses_the_heuristic_and_caches(graphs):
    op = OpInfo.from_name("copy_u_sum")
    graph = graphs[1]
    choice = selection.select(graph, op, 64)
    assert isinstance(choice, ParallelInfo)
    assert choice == heuristic(selection.bucket(graph.stats()), op, 64, on_gpu=False)
    assert selection.select(graph, op, 64) is choice
    assert selection.select(graph.csr(), op, 64, device="cpu") is choice  # same statistics, same key
    assert len(selection._CACHE) == 1


def test_no_model_falls_back_to_gpu_heuristic(graphs, monkeypatch, tmp_path):
    monkeypatch.setenv(selection.MODEL_ENV, str(tmp_path / "absent.json"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    op = OpInfo.from_name("copy_u_sum")
    stats = graphs[1].stats()
    assert selection.select(stats, op, 64) == heuristic(stats, op, 64, on_gpu=True)


def test_missing_xgboost_falls_back_to_gpu_heuristic(graphs, model_file, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def without_xgboost(name, *args, **kwargs):
        if name.split(".")[0] == "xgboost":
            raise ImportError("No module named 'xgboost'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(builtins, "__import__", without_xgboost)
    op = OpInfo.from_name("copy_u_sum")
    stats = graphs[1].stats()
    with pytest.warns(RuntimeWarning, match="heuristic"):
        assert selection.select(stats, op, 64) == heuristic(stats, op, 64, on_gpu=True)


def test_model_picks_the_predicted_best(graphs, model_file, monkeypatch):
    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(selection, "gpu_info", lambda device: GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, F in (("copy_u_sum", 64), ("u_add_v", 32), ("copy_u_mean", 256)):
        op = OpInfo.from_name(name)
        choice = selection.select(graphs[0].stats(), op, F, device="cuda")
        assert choice in space(op, F)
        assert choice.block_e == 16 and choice.num_warps == min(i.num_warps for i in space(op, F) if i.block_e == 16)
        assert selection.select(graphs[0].stats(), op, F, device="cuda") is choice


def test_the_model_decides_on_large_graphs(graphs, model_file, monkeypatch):
    """No size limit on the model: statistics of a graph of 1.6e7 edges are scored like any other."""
    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(selection, "gpu_info", lambda device: GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(selection, "heuristic", lambda *args: pytest.fail("the heuristic decided with a model"))
    stats = dataclasses.replace(graphs[1].stats(), num_rows=10**6, num_cols=10**6, num_edges=16 * 10**6)
    op = OpInfo.from_name("copy_u_sum")
    booster = selection.load_booster()
    expected = selection.predict_best(booster, selection.bucket(stats), op, 128, 1, torch.float32, GPU)
    assert selection.select(stats, op, 128, device="cuda") == expected
    assert expected.block_e == 16


def test_predict_best_matches_the_model(graphs, model_file):
    booster = selection.load_booster(model_file)
    assert selection.load_booster(model_file) is booster
    op = OpInfo.from_name("copy_u_max")
    stats = graphs[1].stats()
    infos, matrix = ft.case_features(stats, op, 128, 1, torch.float32, GPU)
    predicted = CostModel.load(model_file).predict(matrix)
    assert selection.predict_best(booster, stats, op, 128, 1, torch.float32, GPU) == infos[int(np.argmin(predicted))]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a machine without CUDA")
def test_cuda_statistics_without_cuda_use_the_gpu_heuristic(graphs):
    """The shipped model is there, but no GPU to describe: the GPU rules decide."""
    op = OpInfo.from_name("copy_u_max")
    stats = graphs[0].stats()
    assert selection.select(stats, op, 128) == heuristic(stats, op, 128, on_gpu=True)


@pytest.mark.cuda
def test_shipped_model_on_the_gpu(graphs):
    assert selection.model_path().exists()
    op = OpInfo.from_name("copy_u_sum")
    choice = selection.select(graphs[1].stats(), op, 128, device="cuda")
    assert choice in space(op, 128)


@pytest.mark.parametrize("name", ["copy_u_sum", "u_mul_e_max", "u_dot_v", "u_add_v", "copy_e_mean"])
@pytest.mark.parametrize("F", [1, 16, 100, 512])
def test_small_gpu_graphs_need_no_statistics(name, F, monkeypatch):
    """A sampler's mini-batch on a GPU: one schedule per (op, width), decided without the graph's
    statistics (no device sync) and without the model; edge-parallel, so no chunk table either."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", SMALL_GRAPH_EDGES)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(selection, "predict_best", lambda *args: pytest.fail("the model scored a small graph"))
    graph = GraphTensor.from_edge_index(power_law_graph(300, 4000, seed=F), 300)
    op = OpInfo.from_name(name)
    choice = selection.select(graph.csr(), op, F, device="cuda")
    assert choice in space(op, F) and choice.strategy == "edge"
    assert "stats" not in derived_cache(graph.csr().rowptr)
    # The CPU keeps its interpreter rules, and a graph over the limit is decided by its statistics.
    assert selection.select(graph.csr(), op, F, device="cpu") == heuristic(
        selection.bucket(graph.stats()), op, F, False
    )
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", graph.num_edges - 1)
    monkeypatch.setattr(selection, "load_booster", lambda: None)
    assert selection.select(graph.csr(), op, F, device="cuda") == heuristic(
        selection.bucket(graph.stats()), op, F, True
    )


def test_small_gpu_graphs_read_the_user_order(monkeypatch):
    """The graphs whose structures skip the sort are those of the small-graph rule, whose every
    automatic schedule is edge-parallel (test_small_gpu_graphs_need_no_statistics): on a GPU only,
    up to the rule's limit, which follows the module's value."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", SMALL_GRAPH_EDGES)
    for num_edges in (0, 1, 4000, SMALL_GRAPH_EDGES):
        assert READS_USER_ORDER(num_edges, "cuda") and READS_USER_ORDER(num_edges, torch.device("cuda", 0))
        assert not READS_USER_ORDER(num_edges, "cpu")
    assert not READS_USER_ORDER(SMALL_GRAPH_EDGES + 1, "cuda")
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 100)
    assert READS_USER_ORDER(100, "cuda") and not READS_USER_ORDER(101, "cuda")


def test_small_gpu_graphs_of_recorded_steps_are_scored(monkeypatch):
    """The sorted structure of a small GPU graph that a whole step is recorded on
    (:func:`~pyg_ugrapher.structure.mark_reused`) is decided from its statistics, as a large graph
    is, and its decisions are its own; not while a CUDA graph is being captured (the statistics
    would wait for the GPU), and not a structure in the user's order, which only the small-graph
    rule's edge-parallel schedules read."""
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", SMALL_GRAPH_EDGES)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(selection, "load_booster", lambda: None)
    graph = GraphTensor.from_edge_index(power_law_graph(300, 4000, seed=3), 300)
    op = OpInfo.from_name("copy_u_sum")
    csr = graph.csr()
    small_rule = selection.select(csr, op, 64, device="cuda")
    assert small_rule.strategy == "edge" and "stats" not in derived_cache(csr.rowptr)
    mark_reused(csr.rowptr)
    selection.clear_cache()
    assert selection.select(csr, op, 64, device="cuda") == heuristic(selection.bucket(graph.stats()), op, 64, True)
    assert selection.chooser(csr, "cuda") == "heuristic" and not selection.graph_independent(csr, "cuda")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert selection.select(csr, op, 64, device="cuda") == small_rule
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    user_order = build_user_order_pair(*graph.coo(), graph.num_src, graph.num_dst, graph.index_dtype).csr
    mark_reused(user_order.rowptr)
    assert selection.select(user_order, op, 64, device="cuda") == small_rule


def test_bad_width():
    stats = GraphTensor.from_edge_index(uniform_graph(10, 20), 10).stats()
    with pytest.raises(ValueError, match="F:"):
        selection.select(stats, OpInfo.from_name("copy_u_sum"), 0)


def _fields(stats):
    return {
        "num_rows": stats.num_rows,
        "num_cols": stats.num_cols,
        "num_edges": stats.num_edges,
        **{f"rows.{k}": v for k, v in dataclasses.asdict(stats.rows).items()},
        **{f"cols.{k}": v for k, v in dataclasses.asdict(stats.cols).items()},
    }


def test_bucket_rounds_every_statistic_to_its_grid(graphs):
    for graph in graphs:
        exact = _fields(graph.stats())
        rounded = selection.bucket(graph.stats())
        assert selection.bucket(rounded) == rounded  # a bucket is its own representative
        for name, value in _fields(rounded).items():
            if name.endswith("fraction"):
                assert abs(value - exact[name]) <= 0.05 + 1e-12 and round(value * 10) == value * 10
            elif name.endswith("skew"):
                ratio = (1 + abs(value)) / (1 + abs(exact[name]))
                assert 2**-0.5 <= ratio <= 2**0.5 and math.copysign(1, value) == math.copysign(1, exact[name])
            elif exact[name] == 0:
                assert value == 0
            else:
                assert 2**-0.5 - 1e-4 <= value / exact[name] <= 2**0.5 + 1e-4, name
                assert abs(math.log2(value) - round(math.log2(value))) < 1e-4, name


def test_sampler_batches_are_scored_once_per_bucket(model_file, monkeypatch):
    """A new mini-batch graph every step (two hops of a neighbour sampler over a power-law graph):
    the model scores the design space once per bucket of statistics, not once per batch."""
    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(selection, "gpu_info", lambda device: GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    scored = []
    predict_best = selection.predict_best

    def counting(booster, stats, *args):
        scored.append(stats)
        return predict_best(booster, stats, *args)

    monkeypatch.setattr(selection, "predict_best", counting)
    full = power_law_graph(20_000, 400_000, seed=3)
    op = OpInfo.from_name("copy_u_sum")
    graphs = set()
    for seed in range(20):
        seeds = torch.randperm(20_000, generator=torch.Generator().manual_seed(seed))[:512]
        batch, node_ids = neighbor_sample(full, 20_000, seeds, [10, 10], seed=seed)
        graphs.add((node_ids.numel(), batch.shape[1]))
        stats = GraphTensor.from_edge_index(batch, node_ids.numel()).stats()
        assert selection.select(stats, op, 64, device="cuda") in space(op, 64)
    assert len(graphs) == 20
    assert len(scored) == len(set(scored)) <= 4


# -- measured selection on large graphs ------------------------------------------------------------
def _schedules(op: OpInfo, F: int, count: int):
    return [info for info in space(op, F) if info.strategy == "vertex"][:count]


class FakeTimer:
    """Times a call as ``cost[schedule]`` (after calling it: the runs really happen), counting calls."""

    def __init__(self, cost):
        self.cost, self.calls = cost, []

    def __call__(self, call, repeats):
        self.calls.append(call())
        return self.cost[self.calls[-1]]


def test_fastest_takes_the_least_time_and_skips_failures():
    a, b, c = _schedules(OpInfo.from_name("copy_u_sum"), 64, 3)

    def run(info):
        if info == c:
            raise RuntimeError("out of resources")
        return info

    timer = FakeTimer({a: 2.0, b: 1.0})
    assert selection.fastest([a, b, c], run, timer=timer) == b
    assert timer.calls == [a, b]
    assert selection.fastest([c, a], lambda info: run(c), timer=timer) == c  # nothing ran: the first
    alone = FakeTimer({})
    assert selection.fastest([a], run, timer=alone) == a and alone.calls == []  # nothing to compare


def test_fastest_climbs_through_neighbours_timing_each_once(monkeypatch):
    """From the best candidate the search steps to its fastest neighbour while one is faster, for at
    most ``rounds`` rounds, if the best takes at least ``refine_above``; a neighbour that fails is
    left out. (Without the settling rounds, which time the tied neighbours again.)"""
    monkeypatch.setattr(selection, "SETTLE_ROUNDS", 0)
    op, F = OpInfo.from_name("copy_u_sum"), 128
    start = ParallelInfo("vertex", block_v=4, block_e=4, block_f=128, num_warps=4)
    target = ParallelInfo("vertex", block_v=1, block_e=2, block_f=64, num_warps=1)
    broken = start.with_knobs(block_e=8)
    other = _schedules(op, F, 1)[0]

    def steps(info):  # knob steps from ``info`` to ``target``: the cost of a schedule
        return sum(
            abs(math.log2(info.knobs[k] / target.knobs[k])) for k in ("block_v", "block_e", "block_f", "num_warps")
        )

    def run(info):
        if info == broken:
            raise RuntimeError("out of resources")
        return info

    class Cost(dict):
        def __missing__(self, info):
            return steps(info)

    for rounds, above, reached in ((0, 0.0, start), (2, 0.0, None), (8, 0.0, target), (8, steps(start) + 1, start)):
        timer = FakeTimer(Cost({other: 100.0}))
        best = selection.fastest(
            [other, start],
            run,
            timer=timer,
            rounds=rounds,
            refine_above=above,
            neighbours_of=lambda info: neighbours(info, op, F),
        )
        assert len(timer.calls) == len(set(timer.calls)) and broken not in timer.calls
        if reached is None:
            assert steps(best) == steps(start) - 4  # two rounds, each a tile knob and the warps
        else:
            assert best == reached


def test_fastest_settles_close_schedules_by_their_median():
    """A schedule timed once within :data:`CONTEND_MARGIN` of the best is timed again with it, in
    alternating order, and the lower median wins; one far behind is not timed again."""
    a, b, c, d = _schedules(OpInfo.from_name("copy_u_sum"), 64, 4)
    series = {a: [1.0, 1.3, 1.3], b: [1.05, 1.05, 1.05], c: [2.0], d: [1.1, 1.0, 1.0]}
    calls = []

    def timer(call, repeats):
        schedule = call()
        calls.append(schedule)
        return series[schedule][sum(1 for s in calls if s == schedule) - 1]

    assert selection.fastest([a, b, c, d], lambda info: info, timer=timer) == d
    assert calls == [a, b, c, d] + [d, b, a] + [a, b, d]
    calls.clear()
    series[d] = [5.0]
    assert selection.fastest([a, b, c, d], lambda info: info, timer=timer) == b
    assert calls == [a, b, c, d, b, a, a, b]


def test_select_measured_times_the_shortlist_once_per_case(graphs, monkeypatch):
    graph, op, F = graphs[0], OpInfo.from_name("copy_u_sum"), 64
    candidates = _schedules(op, F, 3)
    monkeypatch.setattr(selection, "shortlist", lambda *args, **kwargs: candidates)
    monkeypatch.setattr(selection, "REFINE_ROUNDS", 0)
    timer = FakeTimer(dict(zip(candidates, (3.0, 1.0, 2.0))))
    for _ in range(2):
        assert selection.select_measured(graph, op, F, lambda info: info, device="cuda", timer=timer) == candidates[1]
    assert timer.calls == candidates  # the second call timed nothing
    # The plain selection now answers the measured choice; a call with a context measures afresh.
    assert selection.select(graph, op, F, device="cuda") == candidates[1]
    timer.cost = dict(zip(candidates, (1.0, 3.0, 2.0)))
    assert (
        selection.select_measured(graph, op, F, lambda info: info, device="cuda", context="pair", timer=timer)
        == candidates[0]
    )
    assert selection.select(graph, op, F, device="cuda") == candidates[1]


def test_select_measured_times_with_the_graphs_gpu_current(graphs, monkeypatch):
    """The timer queues its events on the current device's stream: a graph on another GPU is
    timed with that GPU current, and the current device is back after."""
    graph, op, F = graphs[0], OpInfo.from_name("copy_u_sum"), 64
    candidates = _schedules(op, F, 2)
    monkeypatch.setattr(selection, "shortlist", lambda *args, **kwargs: candidates)
    monkeypatch.setattr(selection, "REFINE_ROUNDS", 0)
    current = [0]
    seen = []

    @contextlib.contextmanager
    def device(index):
        previous, current[0] = current[0], torch.device(index).index
        try:
            yield
        finally:
            current[0] = previous

    monkeypatch.setattr(torch.cuda, "device", device)

    def timer(call, repeats):
        seen.append(current[0])
        return 1.0 if call() == candidates[0] else 2.0

    chosen = selection.select_measured(graph, op, F, lambda info: info, device="cuda:1", timer=timer)
    assert chosen == candidates[0] and seen == [1, 1] and current == [0]


def test_shortlist_is_the_models_best_then_the_heuristic(graphs, model_file, monkeypatch):
    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(selection, "gpu_info", lambda device: GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    op, F = OpInfo.from_name("copy_u_sum"), 64
    for graph in graphs:
        listed = selection.shortlist(graph, op, F, device="cuda", k=3, top=0)
        stats = selection.bucket(graph.stats())
        assert listed[0] == selection.predict_best(selection.load_booster(), stats, op, F, 1, torch.float32, GPU)
        assert len(set(listed)) == len(listed) and 3 <= len(listed) <= 4
        assert listed[-1] == heuristic(stats, op, F, True) or heuristic(stats, op, F, True) in listed[:3]
        assert len({(info.strategy, info.block_v) for info in listed[:3]}) == 3  # one per program shape
        assert all(info.block_e == 16 for info in listed[:3])  # the trained cost's optimum
        ranked = selection.predict_ranked(selection.load_booster(), stats, op, F, 1, torch.float32, GPU)
        with_top = selection.shortlist(graph, op, F, device="cuda", k=3, top=4)
        assert with_top[:4] == ranked[:4] and set(listed) <= set(with_top)


def test_shortlisted_takes_the_best_of_each_shape_and_the_best_few():
    def info(strategy, block_v, block_e):
        return ParallelInfo(strategy, block_v=block_v, block_e=block_e, block_f=16, num_warps=4)

    a1, a2, b1, a3, c1, b2, d1 = (
        info("vertex", 1, 8),
        info("vertex", 1, 16),
        info("vertex", 2, 8),
        info("vertex", 1, 32),
        info("edge", None, 64),
        info("vertex", 2, 16),
        info("vertex", 4, 8),
    )
    ranked = [a1, a2, b1, a3, c1, b2, d1]
    fallback = info("vertex", 8, 8)
    assert selection.shortlisted(ranked, fallback, k=2, top=4) == [a1, a2, b1, a3, fallback]
    assert selection.shortlisted(ranked, fallback, k=3, top=0) == [a1, b1, c1, fallback]
    assert selection.shortlisted(ranked, a2, k=4, top=1) == [a1, b1, c1, d1, a2]
    assert selection.shortlisted(ranked, b1, k=9, top=9) == ranked


def test_shortlist_without_a_model_is_the_heuristic(graphs, monkeypatch, tmp_path):
    monkeypatch.setenv(selection.MODEL_ENV, str(tmp_path / "absent.json"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    op = OpInfo.from_name("copy_u_sum")
    assert selection.shortlist(graphs[1], op, 64, device="cuda") == [
        heuristic(selection.bucket(graphs[1].stats()), op, 64, True)
    ]


def test_measures_only_large_gpu_graphs(graphs, monkeypatch):
    graph = graphs[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(selection, "MEASURE_EDGES", graph.num_edges + 1)
    assert not selection.measures(graph, "cuda")
    monkeypatch.setattr(selection, "MEASURE_EDGES", graph.num_edges)
    assert selection.measures(graph, "cuda") and not selection.measures(graph, "cpu")
    monkeypatch.setenv(selection.MEASURE_ENV, "0")
    assert not selection.measures(graph, "cuda")
    monkeypatch.delenv(selection.MEASURE_ENV)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not selection.measures(graph, "cuda")


class _RecordingForest:
    """Stands for a GPU forest: returns fixed scores and records the devices it scored on."""

    def __init__(self):
        self.devices = []

    def predict(self, X, device):
        self.devices.append(device)
        return -np.arange(len(X), dtype=np.float32)


def test_scores_run_on_the_gpu_forest_unless_capturing_or_on_a_cpu(model_file, monkeypatch):
    booster = selection.load_booster(model_file)
    forest = _RecordingForest()
    monkeypatch.setattr(selection, "_forest", lambda b: forest if b is booster else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    X = np.zeros((5, len(ft.FEATURES)), dtype=np.float32)
    host = booster.inplace_predict(X, validate_features=False)

    assert np.array_equal(selection.scores(booster, X, "cuda:0"), -np.arange(5))
    assert forest.devices == [torch.device("cuda:0")]
    capturing[0] = True
    assert np.array_equal(selection.scores(booster, X, "cuda:0"), host)
    capturing[0] = False
    assert np.array_equal(selection.scores(booster, X, "cpu"), host)
    assert np.array_equal(selection.scores(booster, X), host)
    assert forest.devices == [torch.device("cuda:0")]


class _RefusingForest:
    @staticmethod
    def from_booster(booster):
        raise ValueError("not a plain sum of trees")


def test_a_model_that_does_not_convert_is_scored_by_xgboost(model_file, monkeypatch):
    booster = selection.load_booster(model_file)
    monkeypatch.setattr(selection, "_forest", CONVERT)
    monkeypatch.setattr(selection, "Forest", _RefusingForest)
    assert selection._forest(booster) is None
    assert booster in selection._FORESTS


# -- partial schedules: a strategy and some knobs fixed, the rest chosen -----------------------------
PARTIALS = [
    ParallelInfo("vertex"),
    ParallelInfo("edge"),
    ParallelInfo("group"),
    ParallelInfo("vertex", block_f=16),
    ParallelInfo("edge", block_e=32, num_warps=8),
    ParallelInfo("group", group_size=8, block_f=1024),
    ParallelInfo("vertex", block_v=128),
    ParallelInfo("vertex", block_v=256, block_e=64),
    ParallelInfo("group", block_e=16),
    ParallelInfo("group", group_size=2),
]


@pytest.mark.parametrize("partial", PARTIALS, ids=str)
def test_resolve_completes_any_partial_schedule_at_every_width(graphs, partial, monkeypatch):
    """Without a model (the CPU's rules, and the GPU's): a complete schedule that keeps the strategy
    and every knob given, valid for the width, at every width up to 128 and around the powers of two
    to 1024 (a feature tile wider than the op narrowed)."""
    monkeypatch.setattr(selection, "load_booster", lambda: None)
    op = OpInfo.from_name("u_mul_e_max")
    stats = graphs[1].stats()
    for device in ("cpu", "cuda"):
        for F in [*range(1, 129), 200, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024]:
            choice = selection.resolve(stats, op, F, partial, device=device)
            assert choice.is_complete and choice.validate_for(F) is choice
            assert partial.narrowed_for(F)[0].admits(choice), (partial, F, choice)
    assert selection.resolve(stats, op, 64, partial, device="cpu") is selection.resolve(
        stats, op, 64, partial, device="cpu"
    )


def test_resolve_without_a_model_takes_the_rules_of_the_strategy(graphs):
    op = OpInfo.from_name("copy_u_sum")
    stats = selection.bucket(graphs[1].stats())
    for strategy in ("vertex", "edge", "group"):
        rule = heuristic(stats, op, 64, False, strategy)
        assert selection.resolve(stats, op, 64, ParallelInfo(strategy), device="cpu") == rule
    # Where the strategy's rule disagrees with a knob given, the knob is put in and the tile kept in bounds.
    choice = selection.resolve(stats, op, 64, ParallelInfo("vertex", block_e=64), device="cpu")
    assert choice.block_e == 64 and choice.block_v * choice.block_e * choice.block_f <= selection.MAX_TILE
    assert selection.resolve(stats, op, 64, ParallelInfo("vertex", block_f=8), device="cpu").block_f == 8
    assert selection.chooser(stats, "cpu", partial=True) == "heuristic"


def test_resolve_scores_only_the_schedules_that_keep_the_fixed_knobs(graphs, model_file, monkeypatch):
    """With a model, the design space's schedules that agree with the partial one are scored as
    ``select`` scores them all: the model's favourite (block_e = 16, fewest warps) among them."""
    monkeypatch.setenv(selection.MODEL_ENV, str(model_file))
    monkeypatch.setattr(selection, "gpu_info", lambda device: GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(selection, "heuristic", lambda *args: pytest.fail("the heuristic decided with a model"))
    op = OpInfo.from_name("copy_u_sum")
    stats = graphs[0].stats()
    assert selection.chooser(stats, "cuda", partial=True) == "cost model"
    for partial in (ParallelInfo("vertex"), ParallelInfo("group", block_f=32), ParallelInfo("vertex", num_warps=8)):
        admitted = [info for info in space(op, 64) if partial.admits(info)]
        choice = selection.resolve(stats, op, 64, partial, device="cuda")
        assert choice in admitted and choice.block_e == 16
        assert choice.num_warps == min(info.num_warps for info in admitted if info.block_e == 16)
        assert selection.resolve(stats, op, 64, partial, device="cuda") is choice
    # A knob off the design space's grid: the space's schedules of the strategy with it put in.
    off_grid = ParallelInfo("vertex", block_v=128)
    choice = selection.resolve(stats, op, 64, off_grid, device="cuda")
    assert choice.block_v == 128 and choice in selection.completions(off_grid, op, 64)
    assert selection.completions(ParallelInfo("vertex", block_v=256, block_e=64), op, 64) == []


def test_resolve_returns_a_complete_schedule_as_it_is(graphs):
    complete = ParallelInfo("edge", block_e=32, block_f=16, num_warps=2)
    stats = graphs[0].stats()
    assert selection.resolve(stats, OpInfo.from_name("copy_u_sum"), 16, complete) is complete
    assert selection.resolve(stats, OpInfo.from_name("copy_u_sum"), 8, complete) == complete.with_knobs(block_f=8)
    with pytest.raises(TypeError, match="^partial:"):
        selection.resolve(stats, OpInfo.from_name("copy_u_sum"), 8, "vertex")
