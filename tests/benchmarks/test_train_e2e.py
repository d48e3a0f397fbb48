import math

import pandas as pd
import pytest

from benchmarks import train_e2e


def test_cora_two_epochs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the reference executor on a CPU
    train_e2e.main(["--datasets", "cora", "--epochs", "2", "--device", "cpu", "--hidden", "16",
                    "--out", str(tmp_path)])
    results = pd.read_csv(tmp_path / "train_e2e.csv")
    assert list(results.columns) == train_e2e.COLUMNS
    assert len(results) == len(train_e2e.MODELS) * 2
    assert set(zip(results["model"], results["impl"])) == {(m, i) for m in train_e2e.MODELS for i in ("ours", "pyg")}
    assert (results["status"] == "ok").all(), results["status"].tolist()
    for column in ("test_acc", "val_acc"):
        assert results[column].between(0.0, 1.0).all()
    assert all(math.isfinite(v) and v > 0 for v in results["epoch_ms"])
    assert (results["num_edges"] == 10556).all() and (results["epochs"] == 2).all()
    assert (tmp_path / "train_e2e.png").stat().st_size > 0


def test_bad_arguments():
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--datasets", "nope"])
    with pytest.raises(SystemExit):
        train_e2e.parse_args(["--models", "gcn,mlp"])
    assert train_e2e.parse_args(["--datasets", "cora,citeseer", "--device", "cpu"]).datasets == ["cora", "citeseer"]
