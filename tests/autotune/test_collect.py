import gzip

import pandas as pd
import pytest
import torch

from autotune import collect
from autotune.features import CASE_COLUMNS, KNOB_COLUMNS
from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from triton_kernels.space import space


def test_op_cases_add_each_backward_step_once():
    cases = {c.name: c for c in collect.op_cases(["copy_u_sum", "copy_u_mean", "copy_u_max", "u_mul_e_sum"], 32)}
    # copy_u_mean's gradient is copy_u_sum on the reversed graph, already there as copy_u_sum's.
    assert "copy_u_sum:grad0" in cases and "copy_u_mean:grad0" not in cases
    assert cases["copy_u_sum:grad0"].reverse and cases["copy_u_sum:grad0"].op == OpInfo.from_name("copy_u_sum")
    assert "copy_u_max:count" in cases and "copy_u_max:grad0" in cases
    # The gradient of a scalar edge weight is a dot product per edge.
    weight = cases["u_mul_e_sum:grad1"]
    assert weight.op.gather_op is None and weight.op.reduces and weight.layout().reduce_size == 32
    assert all(c.layout().message_width == 32 for c in cases.values())


def test_sample_configs_are_shared_and_valid():
    sum_op, max_op = OpInfo.from_name("copy_u_sum"), OpInfo.from_name("u_mul_e_max")
    first = collect.sample_configs(sum_op, 64, 10, seed=1)
    assert first == collect.sample_configs(sum_op, 64, 10, seed=1)
    assert first[:10] == collect.sample_configs(max_op, 64, 10, seed=1)[:10]
    assert first[:10] != collect.sample_configs(sum_op, 64, 10, seed=2)[:10]
    assert set(first[:10]) <= set(space(sum_op, 64))
    assert set(collect.anchors(sum_op, 64)) <= set(first)
    for info in first:
        info.validate_for(64)
    message_op = OpInfo.from_name("u_add_v")
    message = collect.sample_configs(message_op, 16, 10)
    assert set(message[:10]) <= set(space(message_op, 16))


def test_kernel_jobs_compile_each_kernel_once():
    info = ParallelInfo("vertex", block_v=4, block_e=8, block_f=16, num_warps=1)
    jobs = [(case, "float32", info) for F in (16, 32) for case in collect.op_cases(["copy_u_sum", "u_dot_v"], F)]
    encoded = collect.kernel_jobs(jobs)
    ops = [collect._decode_case(text).op.name for text, _, _ in encoded]
    # copy_u_sum and its gradient (copy_u_sum reversed) share a kernel at every F; u_dot_v's
    # tile split depends on F; its gradients are e_mul_u_sum reversed and not.
    assert sorted(ops) == ["copy_u_sum", "e_mul_u_sum", "u_dot_v", "u_dot_v"]
    for text, dtype, config in encoded:
        case = collect._decode_case(text)
        assert any(case == c for c, _, _ in jobs)  # decodes to the case it came from
        assert dtype == "float32" and config == info.serialize()


def test_corpus_is_ordered_and_unique():
    specs = collect.corpus()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    assert [s.num_edges for s in specs] == sorted(s.num_edges for s in specs)
    assert {s.kind for s in specs} == {"uniform", "power_law", "rmat", "hubs", "batch", "real"}
    assert any(s.num_dst for s in specs)  # bipartite shapes


def test_unknown_graph_is_an_error():
    with pytest.raises(ValueError, match="graphs: unknown"):
        collect.select_graphs(["no-such-graph"], 1e9)


def test_cpu_timer_counts_calls():
    calls = []
    timer = collect.Timer(torch.device("cpu"), reps=4, target_ms=1e6)
    ms, reps = timer(lambda: calls.append(1))
    assert reps == 4 and len(calls) == 5  # one warm-up call, untimed
    assert ms >= 0


def test_smoke_collect_writes_rows_and_resumes(collected, collect_cli):
    files = sorted(collected.glob("*.csv.gz"))
    assert [f.name.split("__")[0] for f in files] == ["pl0.8-n1e2-e1e3", "uni-n1e2-e1e3"]
    with gzip.open(files[0]) as handle:  # really gzip
        handle.read(10)
    table = collect.read_table([collected])
    for column in CASE_COLUMNS + KNOB_COLUMNS + ("graph", "family", "op", "config", "time_ms", "status", "heuristic"):
        assert column in table.columns
    assert (table["status"] == "ok").all() and (table["time_ms"] > 0).all()
    assert set(table["family"]) == {"uniform", "power_law"}
    op = OpInfo.from_name("copy_u_sum")
    for graph, rows in table.groupby("graph"):
        expected = collect.sample_configs(op, 16, 2)
        configs = [ParallelInfo.deserialize(c) for c in rows["config"]]
        assert set(expected) <= set(configs)
        assert rows["heuristic"].sum() == 1
        assert rows["num_edges"].iloc[0] == 1000 and rows["F"].iloc[0] == 16
    before = {f.name: f.read_bytes() for f in files}
    result = collect_cli(collected)
    assert "2/2" in result.stderr  # both cases counted as done
    assert {f.name: f.read_bytes() for f in sorted(collected.glob("*.csv.gz"))} == before


def test_read_table_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data"):
        collect.read_table([tmp_path / "missing.csv.gz"])
    with pytest.raises(ValueError, match="data: no"):
        collect.read_table([tmp_path])
    pd.DataFrame({"a": [1]}).to_csv(tmp_path / "x.csv.gz", index=False)
    assert len(collect.read_table([tmp_path])) == 1
