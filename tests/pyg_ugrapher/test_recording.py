"""Recorded training steps (:class:`pyg_ugrapher.RecordedStep`) and padding to size buckets
(:func:`pyg_ugrapher.pad_to_bucket`)."""

import copy

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn

import pyg_ugrapher as ug
from autotune.selection import SMALL_GRAPH_EDGES
from pyg_ugrapher.graph_argument import GraphBounds, graph_bounds_noted, rebuilt_by_recordings
from pyg_ugrapher.recording import _clamp_indices, bucket
from tests.conftest import relative_error as rel_err

MODELS = ("gcn", "gat", "sage", "gin")


def two_layers(name: str, layers, in_channels: int = 12, hidden: int = 16, classes: int = 5) -> nn.Module:
    """Two layers with their default arguments (GCN normalises at every call, GAT adds self loops),
    no dropout: a deterministic step."""
    if name == "gcn":
        convs = [layers.GCNConv(in_channels, hidden), layers.GCNConv(hidden, classes)]
    elif name == "gat":
        convs = [layers.GATConv(in_channels, hidden // 4, heads=4), layers.GATConv(hidden, classes)]
    elif name == "sage":
        convs = [layers.SAGEConv(in_channels, hidden), layers.SAGEConv(hidden, classes)]
    else:
        convs = [
            layers.GINConv(nn.Sequential(nn.Linear(in_channels, hidden), nn.ReLU(), nn.Linear(hidden, hidden))),
            layers.GINConv(nn.Sequential(nn.Linear(hidden, classes))),
        ]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(convs)

        def forward(self, x, edge_index):
            return self.convs[1](self.convs[0](x, edge_index).relu(), edge_index)

    return Net()


def random_batch(num_nodes: int, num_edges: int, seed: int, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, 12, generator=generator)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=generator)
    y = torch.randint(0, 5, (num_nodes,), generator=generator)
    weight = (torch.rand(num_nodes, generator=generator) < 0.5).float()
    weight = weight / weight.sum().clamp_min(1)
    return [t.to(device) for t in (x, edge_index, y, weight)]


def cuda_steps(model_name: str, layers, device="cuda"):
    """A model on the GPU, a recorded step of it and an eager step of an equal copy (both with
    capturable Adam), from the same seed."""
    torch.manual_seed(0)
    model = two_layers(model_name, layers).to(device)
    reference = copy.deepcopy(model)
    step = ug.RecordedStep(make_step(model, torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)))
    eager = make_step(reference, torch.optim.Adam(reference.parameters(), lr=0.01, capturable=True))
    return model, reference, step, eager


def make_step(model, optimizer):
    def step(x, edge_index, y, weight):
        optimizer.zero_grad(set_to_none=True)
        loss = (F.cross_entropy(model(x, edge_index), y, reduction="none") * weight).sum()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


# -- buckets -------------------------------------------------------------------------------------
def test_bucket_series():
    assert bucket(0) == 64 and bucket(64) == 64
    assert bucket(65) == 80 and bucket(80) == 80 and bucket(81) == 100
    assert bucket(10, growth=2.0, minimum=3) == 12
    sizes = [bucket(n) for n in range(1, 5000)]
    assert all(b >= n for n, b in zip(range(1, 5000), sizes))
    assert all(b <= max(64, 1.25 * n) + 1 for n, b in zip(range(1, 5000), sizes))
    assert len(set(sizes)) <= 21  # 64 * 1.25**k for k = 0..20: a few recordings cover sizes up to 5000


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(size=-1), "size"),
        (dict(size=3.0), "size"),
        (dict(size=3, growth=1.0), "growth"),
        (dict(size=3, growth=float("nan")), "growth"),
        (dict(size=3, minimum=0), "minimum"),
    ],
)
def test_bucket_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        bucket(**kwargs)


def test_pad_to_bucket_follows_pyg_pad():
    x, edge_index, y, weight = random_batch(70, 300, seed=0)
    px, pedges, py, pweight = ug.pad_to_bucket(x, edge_index, y, weight)
    assert px.shape == (bucket(71), 12) and pedges.shape == (2, bucket(300))
    assert torch.equal(px[:70], x) and not px[70:].any()
    assert torch.equal(pedges[:, :300], edge_index) and bool((pedges[:, 300:] == 70).all())
    assert torch.equal(py[:70], y) and not py[70:].any() and not pweight[70:].any()


def test_pad_to_bucket_rejects_bad_arguments():
    x, edge_index, y, _ = random_batch(10, 20, seed=0)
    with pytest.raises(ValueError, match="edge_index"):
        ug.pad_to_bucket(x, edge_index[0])
    with pytest.raises(TypeError, match="edge_index"):
        ug.pad_to_bucket(x, edge_index.float())
    with pytest.raises(ValueError, match=r"node_tensors\[0\]"):
        ug.pad_to_bucket(x, edge_index, y[:5])
    with pytest.raises(TypeError, match="x"):
        ug.pad_to_bucket([1, 2], edge_index)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("impl", ["ours", "pyg"])
def test_padded_batch_gives_the_unpadded_outputs_and_gradients(model_name, impl):
    """The real nodes' outputs and every parameter's gradient are those of the unpadded batch."""
    torch.manual_seed(0)
    model = two_layers(model_name, ug.nn if impl == "ours" else pyg_nn)
    x, edge_index, y, weight = random_batch(70, 300, seed=1)
    padded = ug.pad_to_bucket(x, edge_index, y, weight)
    results = []
    for tensors in ((x, edge_index, y, weight), padded):
        model.zero_grad()
        out = model(tensors[0], tensors[1])
        (F.cross_entropy(out, tensors[2], reduction="none") * tensors[3]).sum().backward()
        results.append([out[:70].detach()] + [p.grad.clone() for p in model.parameters()])
    for index, (want, got) in enumerate(zip(*results)):
        assert rel_err(got, want) < 1e-5, index


@pytest.mark.parametrize("model_name", MODELS)
def test_layers_note_the_bounds_of_their_edge_index(model_name):
    """What RecordedStep checks a replayed graph against: each layer's node counts on the index."""
    model = two_layers(model_name, ug.nn)
    x, edge_index, *_ = random_batch(40, 160, seed=2)
    with graph_bounds_noted() as noted:
        model(x, edge_index)
    assert noted and {bounds for _, bounds in noted} == {GraphBounds(src_row=0, num_src=40, num_dst=40)}
    assert all(read is edge_index for read, _ in noted)
    assert not rebuilt_by_recordings(edge_index)  # a CPU index: never built inside a recording


def test_clamp_indices_clamps_in_place_and_flags_any_out_of_range(device):
    """Through the public RecordedStep helper: the Triton kernel (GPU, interpreter) or torch."""
    fine = torch.tensor([[0, 3, 9], [1, 2, 2]], device=device)
    flag = torch.zeros((), dtype=torch.int32, device=device)
    _clamp_indices(fine, [GraphBounds(0, 10, 3)], flag)
    assert int(flag) == 0 and torch.equal(fine.cpu(), torch.tensor([[0, 3, 9], [1, 2, 2]]))
    # Flow target_to_source: row 1 holds the sources; a strided [2, E] view is clamped in place too.
    index = torch.tensor([[1, 0], [1, 3], [0, 9], [0, -2]], device=device).t()
    _clamp_indices(index, [GraphBounds(1, 5, 2)], flag)
    assert int(flag) == 1
    assert torch.equal(index.cpu(), torch.tensor([[1, 1, 0, 0], [0, 3, 4, 0]]))
    many = torch.randint(-3, 3000, (2, 5000), device=device)
    flag.zero_()
    _clamp_indices(many, [GraphBounds(0, 2000, 2500)], flag)
    assert int(flag) == 1 and int(many[0].max()) == 1999 and int(many[1].max()) == 2499 and int(many.min()) == 0
    # An empty graph reads nothing and is in range; edges without nodes are not.
    empty = torch.zeros(2, 0, dtype=torch.long, device=device)
    flag.zero_()
    _clamp_indices(empty, [GraphBounds(0, 3, 3)], flag)
    assert int(flag) == 0 and empty.shape == (2, 0)
    _clamp_indices(torch.zeros(2, 4, dtype=torch.long, device=device), [GraphBounds(0, 0, 3)], flag)
    assert int(flag) == 1


# -- RecordedStep ----------------------------------------------------------------------------------
def test_recorded_step_runs_eagerly_on_the_cpu():
    torch.manual_seed(0)
    model = two_layers("sage", ug.nn)
    reference = copy.deepcopy(model)
    step = ug.RecordedStep(make_step(model, torch.optim.Adam(model.parameters(), lr=0.01)))
    eager = make_step(reference, torch.optim.Adam(reference.parameters(), lr=0.01))
    batch = random_batch(40, 160, seed=2)
    for _ in range(3):
        assert rel_err(step(*batch), eager(*batch)) < 1e-5
    assert step.num_recordings == 0
    for a, b in zip(model.parameters(), reference.parameters()):
        assert rel_err(a, b) < 1e-5


def test_recorded_step_rejects_bad_arguments():
    with pytest.raises(TypeError, match="step"):
        ug.RecordedStep(42)
    with pytest.raises(ValueError, match="warmup"):
        ug.RecordedStep(lambda: None, warmup=0)
    with pytest.raises(ValueError, match="max_recordings"):
        ug.RecordedStep(lambda: None, max_recordings=0)
    with pytest.raises(TypeError, match=r"tensors\[1\]"):
        ug.RecordedStep(lambda *t: None)(torch.zeros(1), 3)


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", MODELS)
def test_eager_step_on_a_seen_graph_never_synchronises(model_name):
    """Our layers with their default arguments, on a graph they have seen: no host sync."""
    *_, eager = cuda_steps(model_name, ug.nn)
    batch = random_batch(500, 4000, seed=3, device="cuda")
    eager(*batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager(*batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", MODELS)
def test_recorded_full_batch_steps_equal_eager_steps(model_name):
    device = torch.device("cuda")
    model, reference, step, eager = cuda_steps(model_name, ug.nn)
    batch = random_batch(500, 4000, seed=4, device=device)
    losses = [step(*batch).clone() for _ in range(3)]  # warm-up steps, recording, replays
    assert step.num_recordings == 1
    want = [eager(*batch) for _ in range(3 + 3)]
    assert rel_err(losses[-1], want[-1]) < 1e-4
    for a, b in zip(model.parameters(), reference.parameters()):
        assert rel_err(a, b) < 1e-4
    # New features and labels of the same graph are copied in before a replay.
    other = random_batch(500, 4000, seed=5, device=device)
    other[1] = batch[1]
    assert rel_err(step(*other), eager(*other)) < 1e-4


@pytest.mark.cuda
@pytest.mark.two_gpus
@pytest.mark.parametrize("model_name", MODELS)
def test_recorded_steps_on_a_gpu_that_is_not_current_equal_eager_steps(model_name):
    """A model and its inputs on the second GPU while the first is current: the steps are recorded
    and replayed on theirs, with the eager steps' losses and parameters."""
    second = torch.device("cuda", 1)
    with torch.cuda.device(0):
        model, reference, step, eager = cuda_steps(model_name, ug.nn, second)
        batch = random_batch(500, 4000, seed=4, device=second)
        losses = [step(*batch).clone() for _ in range(3)]
        want = [eager(*batch) for _ in range(3 + 3)]
        assert torch.cuda.current_device() == 0
    assert step.num_recordings == 1 and losses[-1].device == second
    assert rel_err(losses[-1], want[-1]) < 1e-4
    for a, b in zip(model.parameters(), reference.parameters()):
        assert rel_err(a, b) < 1e-4


@pytest.mark.cuda
def test_recorded_steps_run_captures_of_several_operators(monkeypatch):
    """Below ``staged_min_edges`` edges a routed TransformerConv (its softmax: several graph operators)
    runs PyG's propagation eagerly, and its capture while a step is recorded: the same losses and
    parameters (SGD: Adam's normalised steps turn rounding in gradients near 0 into whole steps)."""
    monkeypatch.setattr(ug.MessagePassing, "staged_min_edges", 1 << 20)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList([pyg_nn.TransformerConv(12, 4, heads=4), pyg_nn.TransformerConv(16, 5)])

        def forward(self, x, edge_index):
            return self.convs[1](self.convs[0](x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    model = ug.accelerate(Net().to("cuda"))
    reference = copy.deepcopy(model)
    step = ug.RecordedStep(make_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    eager = make_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1))
    batch = random_batch(500, 4000, seed=4, device=torch.device("cuda"))
    losses = [step(*batch).clone() for _ in range(3)]
    want = [eager(*batch) for _ in range(3 + 3)]
    assert rel_err(losses[-1], want[-1]) < 1e-4
    for a, b in zip(model.parameters(), reference.parameters()):
        assert rel_err(a, b) < 1e-4
    assert model.convs[0].fallback_reason is None and len(model.convs[0].capture.ops) == 5
    assert "the capture runs 5 graph operators" in reference.convs[0].fallback_reason


@pytest.mark.cuda
def test_recorded_step_refuses_a_changed_large_graph():
    """The structures of a graph above SMALL_GRAPH_EDGES are built before the recording, which then
    serves that graph alone."""
    device = torch.device("cuda")
    model = two_layers("sage", ug.nn).to(device)
    step = ug.RecordedStep(make_step(model, torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)))
    num_edges = SMALL_GRAPH_EDGES + 1000
    batch = random_batch(5000, num_edges, seed=6, device=device)
    step(*batch)
    same = [t.clone() for t in batch]
    step(*same)  # equal values in another tensor: fine
    changed = random_batch(5000, num_edges, seed=7, device=device)
    with pytest.raises(ValueError, match=r"tensors\[1\]"):
        step(*changed)


@pytest.mark.cuda
@pytest.mark.parametrize("impl,model_name", [("ours", name) for name in MODELS] + [("pyg", "sage"), ("pyg", "gin")])
def test_padded_minibatches_replay_per_bucket(impl, model_name):
    """One recording per bucket serves every batch of that bucket, with eager's losses and weights:
    PyG's layers rebuild everything from ``edge_index`` at every call, ours build a small graph's
    structures inside the recording (PyG's GCN and GAT synchronise and cannot be recorded)."""
    device = torch.device("cuda")
    model, reference, step, eager = cuda_steps(model_name, ug.nn if impl == "ours" else pyg_nn)
    for seed in range(8):
        batch = ug.pad_to_bucket(*random_batch(100 + 7 * seed, 600 + 11 * seed, seed=seed, device=device))
        recorded_before = step.num_recordings
        got = step(*batch).clone()
        if step.num_recordings > recorded_before:  # a new bucket's first call also ran the warm-up steps
            for _ in range(step.warmup):
                eager(*batch)
        assert rel_err(got, eager(*batch)) < 1e-4, seed
    assert 1 <= step.num_recordings <= 3
    for a, b in zip(model.parameters(), reference.parameters()):
        assert rel_err(a, b) < 1e-3


@pytest.mark.cuda
def test_recorded_step_clamps_and_reports_indices_out_of_range():
    device = torch.device("cuda")
    model, _, step, _ = cuda_steps("gcn", ug.nn)
    batch = ug.pad_to_bucket(*random_batch(100, 600, seed=1, device=device))
    step(*batch)
    bad = [t.clone() for t in batch]
    bad[1][0, 5] = bad[0].size(0) + 1000
    step(*bad)  # clamped in the recording: no access outside the tensors
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="out of range"):
        step(*batch)
    assert all(bool(p.isfinite().all()) for p in model.parameters())


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", MODELS)
def test_a_users_own_capture_of_a_whole_step_serves_new_graphs(model_name):
    """A step captured with torch.cuda.graph (PyTorch's whole-network example): new graphs of the
    recorded sizes copied into its inputs give eager's losses."""
    device = torch.device("cuda")
    model, reference, _, eager = cuda_steps(model_name, ug.nn)
    step = make_step(model, torch.optim.Adam(model.parameters(), lr=0.01, capturable=True))
    static = random_batch(300, 2000, seed=0, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*static)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        eager(*static)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            loss = step(*static)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for seed in range(1, 4):
        batch = random_batch(300, 2000, seed=seed, device=device)
        for mine, theirs in zip(static, batch):
            mine.copy_(theirs)
        graph.replay()
        assert rel_err(loss, eager(*batch)) < 1e-4, seed


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", MODELS)
def test_graphed_callables_serve_new_graphs(model_name):
    """torch.cuda.make_graphed_callables of a model of our layers: forward and backward recorded,
    each call on a new graph of the recorded sizes equal to the eager model's."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = two_layers(model_name, ug.nn).to(device)
    reference = copy.deepcopy(model)
    x, edge_index, *_ = random_batch(300, 2000, seed=0, device=device)
    graphed = torch.cuda.make_graphed_callables(model, (x.requires_grad_(), edge_index))
    for seed in range(1, 4):
        x, edge_index, *_ = random_batch(300, 2000, seed=seed, device=device)
        x.requires_grad_()
        got = graphed(x, edge_index)
        got.square().sum().backward()
        want_x = x.detach().clone().requires_grad_()
        want = reference(want_x, edge_index)
        want.square().sum().backward()
        assert rel_err(got, want) < 1e-4, seed
        assert rel_err(x.grad, want_x.grad) < 1e-4, seed


@pytest.mark.cuda
def test_recorded_step_refuses_a_step_that_synchronises():
    device = torch.device("cuda")
    x = torch.randn(10, device=device)
    step = ug.RecordedStep(lambda t: t * float(t.sum()))
    with pytest.raises(ValueError, match="waits for the GPU"):
        step(x)
    assert step.num_recordings == 0
