import math

import pandas as pd
import pytest
import torch

from benchmarks import rows, train_e2e


def test_cora_two_epochs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the reference executor on a CPU
    train_e2e.main(["--datasets", "cora", "--epochs", "2", "--device", "cpu", "--hidden", "16", "--out", str(tmp_path)])
    results = pd.read_csv(tmp_path / "train_e2e.csv")
    assert tuple(results.columns) == rows.TRAIN_COLUMNS
    assert len(results) == len(train_e2e.MODELS) * 2
    assert set(zip(results["model"], results["impl"])) == {(m, i) for m in train_e2e.MODELS for i in ("ours", "pyg")}
    assert (results["status"] == "ok").all(), results["status"].tolist()
    for column in ("test_acc", "val_acc"):
        assert results[column].between(0.0, 1.0).all()
    assert all(math.isfinite(v) and v > 0 for v in results["epoch_ms"])
    assert (results["num_edges"] == 10556).all() and (results["epochs"] == 2).all()
    ours = results[results["impl"] == "ours"]
    assert (ours["speedup_vs_pyg"] > 0).all() and results["batch_graphs"].isna().all()
    assert (tmp_path / "train_e2e.png").stat().st_size > 0


def test_cora_mini_batches(tmp_path, monkeypatch):
    """Sampled mini-batches: a new graph every step, the same batches for both implementations."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    train_e2e.main(
        [
            "--datasets",
            "cora",
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--hidden",
            "16",
            "--models",
            "gcn",
            "sage",
            "--batch-size",
            "64",
            "--num-neighbors",
            "5",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    results = pd.read_csv(tmp_path / "train_e2e.csv")
    assert (results["status"] == "ok").all(), results["status"].tolist()
    assert len(results) == 4 and (results["batch_size"] == 64).all()
    assert (results["steps"] == math.ceil(140 / 64)).all()  # Cora's 140 training nodes
    assert all(math.isfinite(v) and v > 0 for v in results["step_ms"])
    assert (results["epoch_ms"] - results["step_ms"] * results["steps"]).abs().max() < 1e-6
    assert results["test_acc"].between(0.0, 1.0).all()
    assert (results["batch_graphs"] == "new").all()


def test_same_graph_every_step(tmp_path, monkeypatch):
    """``--same-graph``: every step trains on the first batch's graph, one tensor for all steps."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    task = train_e2e.make_task("cora", torch.device("cpu"), seed=0)
    epochs = train_e2e._fresh(train_e2e.sample_epochs(task, 2, 64, [5, 3], seed=0, same_graph=True))
    assert len(epochs) == 2 and len(epochs[0]) == math.ceil(140 / 64)
    assert len({id(b.edge_index) for batches in epochs for b in batches}) == 1
    train_e2e.main(
        [
            "--datasets",
            "cora",
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--hidden",
            "16",
            "--models",
            "sage",
            "--batch-size",
            "64",
            "--num-neighbors",
            "5",
            "3",
            "--same-graph",
            "--out",
            str(tmp_path),
        ]
    )
    results = pd.read_csv(tmp_path / "train_e2e.csv")
    assert (results["status"] == "ok").all() and (results["batch_graphs"] == "same").all()


def test_mini_batches_are_sampled_around_the_training_seeds():
    task = train_e2e.make_task("cora", torch.device("cpu"), seed=0)
    epochs = train_e2e.sample_epochs(task, 2, 50, [4, 2], seed=0)
    train_nodes = set(task.train_mask.nonzero().flatten().tolist())
    for batches in epochs:
        assert [b.num_seeds for b in batches] == [50, 50, 40]
        seeds = [n for b in batches for n in b.node_ids[: b.num_seeds].tolist()]
        assert sorted(seeds) == sorted(train_nodes)
        for b in batches:
            assert b.edge_index.max() < b.node_ids.numel()
            assert torch.bincount(b.edge_index[1], minlength=b.node_ids.numel())[: b.num_seeds].max() <= 4
    assert not torch.equal(epochs[0][0].node_ids, epochs[1][0].node_ids)


def test_bad_arguments():
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--datasets", "nope"])
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--models", "gcn,mlp"])
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--batch-size", "-1"])
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--batch-size", "8", "--num-neighbors", "5", "0"])
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--same-graph"])
    assert train_e2e.parse_args(["--datasets", "cora,citeseer", "--device", "cpu"]).datasets == ["cora", "citeseer"]
