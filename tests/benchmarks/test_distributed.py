"""``benchmarks.distributed --quick``: two CPU processes (gloo) on a tiny power-law graph append
one row per case and draw the plot."""

import math

import pytest

from benchmarks import distributed, report, rows


def test_quick_run_appends_a_row_per_case(tmp_path):
    distributed.main(["--quick", "--out", str(tmp_path)])
    frame = rows.read(tmp_path / "distributed.csv")
    assert list(frame.columns) == list(rows.DISTRIBUTED_COLUMNS)
    assert (frame.status == "ok").all(), frame.note.tolist()
    assert sorted(zip(frame["mode"], frame.model)) == sorted(
        (mode, model) for mode in distributed.MODES for model in distributed.MODELS
    )
    assert (frame.world_size == 2).all() and (frame.num_edges == 20000).all()
    assert all(math.isfinite(v) and v > 0 for v in frame.edges_per_s)
    partitioned = frame[frame["mode"] == "partitioned"]
    assert (partitioned.halo_rows > 0).all() and (partitioned.halo_mib_per_layer > 0).all()
    assert (partitioned.comm_ms > 0).all() and (partitioned.comm_ms < partitioned.epoch_ms).all()
    assert (partitioned.cut_fraction > 0).all() and (partitioned.partition == "contiguous").all()
    ddp = frame[frame["mode"] == "ddp"]
    assert (ddp.steps == 3).all() and ddp.comm_ms.isna().all()
    assert (tmp_path / "distributed.png").stat().st_size > 0
    text = report.write_report(tmp_path)
    assert "### Training on several ranks" in text and "| partitioned | power_law-20000 | gcn | eager | 2 |" in text


def test_edge_counts_and_bad_arguments():
    assert distributed.edge_count("power_law-2e8") == 200_000_000
    assert distributed.edge_count("power_law-20M") == 20_000_000
    assert distributed.edge_count("power_law-1500") == 1500
    for argv in (
        ["--graphs", "nope"],
        ["--graphs", "power_law-abc"],
        ["--graphs", "power_law-0.5"],
        ["--epochs", "0"],
        ["--threads", "0"],
        ["--modes", "pipeline"],
    ):
        with pytest.raises(SystemExit):
            distributed.parse_args(argv)
    args = distributed.parse_args(["--quick", "--epochs", "4"])
    assert args.epochs == 4 and args.graphs == distributed.QUICK["graphs"] and args.world_size == 2
