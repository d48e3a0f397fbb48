"""``benchmarks.distributed --quick``: two CPU processes (gloo) on a tiny power-law graph append
one row per case and draw the plot."""

import gc
import math
import os

import pandas as pd
import pytest

from benchmarks import distributed, report, rows


def test_quick_run_appends_a_row_per_case(tmp_path):
    distributed.main(["--quick", "--out", str(tmp_path)])
    frame = rows.read(tmp_path / "distributed.csv")
    assert list(frame.columns) == list(rows.DISTRIBUTED_COLUMNS)
    assert (frame.status == "ok").all(), frame.note.tolist()
    # DDP: one rank alone, timed in the same launch, then both ranks; partitioned: both ranks.
    expected = [("ddp", model, ranks) for model in distributed.DEFAULT_MODELS for ranks in (1, 2)]
    expected += [("partitioned", model, 2) for model in distributed.DEFAULT_MODELS]
    assert sorted(zip(frame["mode"], frame.model, frame.world_size)) == sorted(expected)
    assert (frame.launch_ranks == 2).all() and (frame.num_edges == 20000).all()
    # The machine: no GPU in the CPU processes, this host's cores.
    assert (frame.host_gpus == 0).all() and (frame.host_cpus == os.cpu_count()).all()
    assert (frame.gc_frozen == 1).all()  # the default: each case with the heap frozen
    assert all(math.isfinite(v) and v > 0 for v in frame.edges_per_s)
    partitioned = frame[frame["mode"] == "partitioned"]
    assert (partitioned.halo_rows > 0).all() and (partitioned.halo_mib_per_layer > 0).all()
    assert (partitioned.comm_ms > 0).all() and (partitioned.comm_ms < partitioned.epoch_ms).all()
    assert (partitioned.cut_fraction > 0).all() and (partitioned.partition == "contiguous").all()
    ddp = frame[frame["mode"] == "ddp"]
    assert (ddp.steps == 3).all() and ddp.comm_ms.isna().all()
    for model in distributed.DEFAULT_MODELS:
        alone, both = (ddp[(ddp.model == model) & (ddp.world_size == ranks)].iloc[0] for ranks in (1, 2))
        assert both.scaling == pytest.approx(both.edges_per_s / alone.edges_per_s) and math.isnan(alone.scaling)
        # Alone, rank 0 trains on the whole training set: as many steps, each a batch of the same size.
        assert alone.steps == both.steps and math.isfinite(alone.final_loss)
    assert (tmp_path / "distributed.png").stat().st_size > 0
    text = report.write_report(tmp_path)
    assert "### Training on several ranks" in text and "| partitioned | power_law-20000 | gcn | eager | 2 |" in text


def test_a_case_runs_with_the_objects_made_before_it_frozen():
    before = gc.get_freeze_count()
    with distributed.frozen_heap():
        frozen = gc.get_freeze_count()
        made = [[i] for i in range(1000)]  # allocated inside: the collector still sees them
        assert gc.get_freeze_count() == frozen and made[-1] == [999]
    assert frozen > before
    # Released at the end, unless objects were frozen when it began (by this process, here).
    after = gc.get_freeze_count()
    assert after == 0 if before == 0 else after > before
    with distributed.frozen_heap(enabled=False):
        assert gc.get_freeze_count() == after
    assert distributed.parse_args([]).gc_freeze and not distributed.parse_args(["--no-gc-freeze"]).gc_freeze


def _frozen(obj: object) -> bool:
    """Whether ``obj`` is out of the collector's generations (``gc.freeze`` moved it out)."""
    return gc.is_tracked(obj) and not any(tracked is obj for tracked in gc.get_objects())


def test_objects_frozen_before_a_case_stay_frozen():
    """``gc.unfreeze`` releases every frozen object: a case leaves frozen what someone else froze."""
    frozen_at_start = gc.get_freeze_count()
    theirs = [object()]
    gc.freeze()
    try:
        with distributed.frozen_heap():
            made = [[i] for i in range(100)]
        assert _frozen(theirs) and not _frozen(made)
    finally:
        if not frozen_at_start:
            gc.unfreeze()
    assert frozen_at_start or not _frozen(theirs)


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


def test_plotted_runs_are_the_newest_commit_of_each_case_median_of_its_launches():
    def row(commit, world_size, edges_per_s, model="gcn", status="ok"):
        return dict(
            mode="ddp",
            graph="collab",
            model=model,
            compile_mode="eager",
            world_size=world_size,
            commit=commit,
            edges_per_s=edges_per_s,
            epoch_ms=1.0,
            compute_ms=math.nan,
            comm_ms=math.nan,
            status=status,
        )

    frame = pd.DataFrame(
        [
            row("old", 4, 9e9),  # an older commit of the case: not plotted beside the newer one
            row("old", 1, 5.0),
            row("new", 1, 1.0),
            row("new", 1, 3.0),
            row("new", 1, 2.0),
            row("new", 2, 4.0),
            row("new", 2, 1e12, status="error"),
            row("old", 1, 7.0, model="sage"),  # a case whose newest commit is the old one
        ]
    )
    runs = report.distributed_runs(frame)
    got = {(r.model, r.world_size, r.commit): (r.edges_per_s, r.launches) for r in runs.itertuples(index=False)}
    assert got == {("gcn", 1, "new"): (2.0, 3), ("gcn", 2, "new"): (4.0, 1), ("sage", 1, "old"): (7.0, 1)}
