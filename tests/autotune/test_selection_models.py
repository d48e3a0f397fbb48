"""Which model file a device uses: its GPU's own, else the nearest architecture's, else the newest."""

import logging

import numpy as np
import pytest
import torch

from autotune import gpus, selection
from autotune.cost_model import CostModel
from autotune.features import FEATURES
from autotune.heuristic import heuristic
from benchmarks import rows
from pyg_ugrapher.datasets import power_law_graph
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.ir import OpInfo

#: Fake GPUs by CUDA index: name and compute capability.
DEVICES = {
    0: ("NVIDIA H200", (9, 0)),
    1: ("NVIDIA A100-SXM4-80GB", (8, 0)),
    2: ("NVIDIA L40S", (8, 9)),
    3: ("NVIDIA B200", (10, 0)),
}


@pytest.fixture(autouse=True)
def fake_gpus(monkeypatch):
    """A machine with the GPUs of :data:`DEVICES` (current: 0), no model override, empty caches."""
    monkeypatch.delenv(selection.MODEL_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: DEVICES[index][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: DEVICES[index][1])
    monkeypatch.setattr(selection, "_forest", lambda booster: None)
    selection.clear_cache()
    yield
    selection.clear_cache()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A small model file (its predictions are not used)."""
    rng = np.random.default_rng(0)
    X = rng.random((64, len(FEATURES)))
    model = CostModel(n_estimators=3, num_leaves=4, min_child_samples=2).fit(X, X[:, 0], feature_name=list(FEATURES))
    return model.save_model(tmp_path_factory.mktemp("model") / "model.json")


def models_folder(path, slugs, model_file, monkeypatch):
    """A models folder holding a copy of ``model_file`` per GPU slug, used as the shipped one."""
    path.mkdir(exist_ok=True)
    for slug in slugs:
        (path / f"{slug}.json").write_bytes(model_file.read_bytes())
    monkeypatch.setattr(selection, "MODELS", path)
    return path


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("cpu (x86_64)", "cpu"),
        ("", "cpu"),
    ],
)
def test_gpu_slug(name, slug):
    assert gpus.gpu_slug(name) == slug


def test_benchmarks_name_their_folders_with_the_same_slug():
    assert rows.gpu_slug is gpus.gpu_slug


def test_model_for_prefers_the_gpus_own_model():
    assert selection.model_for("NVIDIA H100 80GB HBM3", (9, 0), ["a100", "h100", "h200"]) == "h100"
    assert selection.model_for("NVIDIA H200", (9, 0), ["h100", "h200"]) == "h200"
    # A slug it does not know of is still the GPU's own model.
    assert selection.model_for("NVIDIA Z9", (9, 0), ["h100", "z9"]) == "z9"


def test_model_for_takes_the_nearest_architecture():
    # Same compute capability: an H200 takes the H100's model, not the newer B200's.
    assert selection.model_for("NVIDIA H200", (9, 0), ["a100", "h100", "b200"]) == "h100"
    # Several of the same capability: the newest.
    assert selection.model_for("NVIDIA H20", (9, 0), ["h100", "h200", "a100"]) == "h200"
    # Same major version: the nearest minor one (8.6 is nearer 8.9 than 8.0), then the newest.
    assert selection.model_for("NVIDIA A40", (8, 6), ["a100", "l4", "h100"]) == "l4"
    assert selection.model_for("NVIDIA L40S", (8, 9), ["a100", "h100"]) == "a100"
    assert selection.model_for("NVIDIA L40S", (8, 9), ["l4", "rtx4090", "h100"]) == "l4"
    # No GPU of its architecture: the newest shipped; slugs of unknown GPUs rank below the known.
    assert selection.model_for("NVIDIA B200", (10, 0), ["a100", "h100", "v100"]) == "h100"
    assert selection.model_for("Tesla V100-SXM2-16GB", (7, 0), ["a100", "h100", "mygpu"]) == "h100"
    assert selection.model_for("NVIDIA B200", (10, 0), ["mygpu"]) == "mygpu"
    assert selection.model_for("", None, ["a100", "h200", "h100"]) == "h200"
    assert selection.model_for("NVIDIA H200", (9, 0), []) is None


def test_each_device_gets_its_model_once(tmp_path, tiny_model, monkeypatch, caplog):
    folder = models_folder(tmp_path / "models", ["a100", "h100", "h200"], tiny_model, monkeypatch)
    caplog.set_level(logging.INFO, logger="autotune.selection")
    assert selection.model_path() == folder / "h200.json"  # the current device, an H200: its own
    assert selection.model_path("cuda:0") == folder / "h200.json"
    assert selection.model_path(torch.device("cuda", 1)) == folder / "a100.json"
    assert selection.model_path("cuda:2") == folder / "a100.json"  # an L40S (8.9): same major version
    assert selection.model_path("cuda:3") == folder / "h200.json"  # a B200: the newest
    # Chosen and logged once per device: adding the L40S's own model changes nothing until the
    # caches are cleared.
    for index in range(4):
        selection.model_path(f"cuda:{index}")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 4
    assert any("NVIDIA L40S" in m and "a100.json" in m and "nearest" in m for m in messages)
    (folder / "l40s.json").write_bytes(tiny_model.read_bytes())
    assert selection.model_path("cuda:2") == folder / "a100.json"
    selection.clear_cache()
    assert selection.model_path("cuda:2") == folder / "l40s.json"
    # A machine without a GPU to describe reports the newest model; so does a CPU device.
    assert selection.model_path("cpu") == folder / "h200.json"


def test_the_booster_follows_the_device(tmp_path, tiny_model, monkeypatch):
    folder = models_folder(tmp_path / "models", ["a100", "h200"], tiny_model, monkeypatch)
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 0)
    h200 = selection._gpu_booster(torch.device("cuda"))
    a100 = selection._gpu_booster(torch.device("cuda", 1))
    assert h200 is selection.load_booster(folder / "h200.json") is selection._gpu_booster(torch.device("cuda", 0))
    assert a100 is selection.load_booster(folder / "a100.json") and a100 is not h200
    assert selection._gpu_booster(torch.device("cpu")) is None
    assert selection.chooser(GraphTensor.from_edge_index(power_law_graph(300, 4000), 300), "cuda:1") == "cost model"


def test_the_environment_variable_overrides_every_device(tmp_path, tiny_model, monkeypatch):
    models_folder(tmp_path / "models", ["a100", "h200"], tiny_model, monkeypatch)
    monkeypatch.setenv(selection.MODEL_ENV, str(tiny_model))
    for device in (None, "cuda:0", "cuda:1", "cpu"):
        assert selection.model_path(device) == tiny_model
    assert selection._gpu_booster(torch.device("cuda", 1)) is selection.load_booster(tiny_model)


def test_without_models_the_heuristic_decides(tmp_path, monkeypatch):
    models_folder(tmp_path / "empty", [], None, monkeypatch)
    monkeypatch.setattr(selection, "SMALL_GRAPH_EDGES", 0)
    monkeypatch.setattr(selection, "predict_best", lambda *args: pytest.fail("a model scored without a model file"))
    graph = GraphTensor.from_edge_index(power_law_graph(300, 4000, seed=3), 300)
    op = OpInfo.from_name("copy_u_sum")
    for device in ("cuda", "cuda:1"):
        assert selection.model_path(device) is None
        assert selection.load_booster() is None
        assert selection.chooser(graph.csr(), device) == "heuristic"
        expected = heuristic(selection.bucket(graph.stats()), op, 64, True)
        assert selection.select(graph.stats(), op, 64, device=device) == expected
