"""The corpus of ``python -m autotune collect``: which graphs, how ``--graphs`` picks among them,
the synthetic families with hubs and block-diagonal batches, and the dtypes a run can time."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from autotune import __main__ as cli
from autotune import collect
from pyg_ugrapher import datasets
from pyg_ugrapher.structure import csr_stats

from .conftest import SMOKE_GRAPHS

CPU = torch.device("cpu")


def test_every_loadable_dataset_is_a_real_graph_of_the_corpus():
    specs = {spec.name: spec for spec in collect.corpus()}
    assert collect.real_graphs() == datasets.available_datasets()
    for name in ("cora", "citeseer", "pubmed", "blogcatalog", "amazon-computers", "amazon-photo", "coauthor-cs"):
        assert specs[name].kind == "real" and specs[name].groups == ("real",)
    for name in ("coauthor-physics", "tolokers", "github", "facebook", "proteins", "dd", "collab"):
        assert specs[name].kind == "real" and specs[name].num_edges > 0
    assert {name for name, spec in specs.items() if spec.kind == "real"} == set(datasets.available_datasets())


def test_the_synthetic_families():
    specs = collect.corpus()
    groups = {group for spec in specs for group in spec.groups}
    assert groups == set(collect.GROUPS)
    for spec in specs:
        if spec.kind != "real":
            assert spec.groups[:2] == ("synthetic", spec.kind)
    # Every family has a graph that a short run (--max-edges 1e6) reaches.
    small = collect.select_graphs(None, 1e6)
    assert {"uniform", "power_law", "rmat", "hubs", "batch", "bipartite", "real"} <= {
        group for spec in small for group in spec.groups
    }


def test_graphs_are_picked_by_name_prefix_or_group():
    real = collect.select_graphs(["real"])
    assert [spec.name for spec in real] == [s.name for s in collect.corpus() if s.kind == "real"]
    hubs = collect.select_graphs(["hubs"])
    assert hubs and all(spec.kind == "hubs" and spec.name.startswith("hub") for spec in hubs)
    assert collect.select_graphs(["power-law"]) == collect.select_graphs(["power_law"])
    assert all(spec.kind == "power_law" for spec in collect.select_graphs(["power_law"]))
    assert all(spec.num_dst for spec in collect.select_graphs(["bipartite"]))
    picked = collect.select_graphs(["cora", "pl0.8", "batch"], max_edges=1e5)
    names = [spec.name for spec in picked]
    assert "cora" in names and "citeseer" not in names
    assert {"pl0.8-n1e2-e1e3", "pl0.8-n1e3-e1e4", "pl0.8-n1e4-e1e5", "batch-n2.5e3-e1e4"} <= set(names)
    assert all(spec.num_edges <= 1e5 for spec in picked)
    assert [spec.num_edges for spec in picked] == sorted(spec.num_edges for spec in picked)
    assert collect.select_graphs() == collect.corpus()
    with pytest.raises(ValueError, match="graphs: unknown"):
        collect.select_graphs(["hub", "no-such-family"])


def test_list_graphs_shows_the_selection(capsys):
    assert cli.main(["collect", "--device", "cpu", "--list-graphs", "--graphs", "hubs,cora", "--max-edges", "1e6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["cora", "hub1-n1e5-e3e5", "hub2-n2e5-e1e6"]
    assert lines[0].split()[1:] == ["real", "10556"]
    assert lines[1].split()[1:] == ["synthetic,hubs", "300000"]


def test_hub_graphs_have_hubs_both_ways(monkeypatch):
    monkeypatch.setattr(collect, "HUB_DEGREE", 500)
    edge_index = collect.hub_graph(2000, 8000, 3, seed=1, device=CPU)
    assert edge_index.shape == (2, 8000) and edge_index.dtype == torch.long
    assert torch.equal(edge_index, collect.hub_graph(2000, 8000, 3, seed=1, device=CPU))
    assert 0 <= int(edge_index.min()) and int(edge_index.max()) < 2000
    in_degree = torch.bincount(edge_index[1], minlength=2000)
    out_degree = torch.bincount(edge_index[0], minlength=2000)
    hubs = torch.topk(in_degree, 3).indices
    assert (in_degree[hubs] >= 500).all() and (out_degree[hubs] >= 500).all()
    others = torch.ones(2000, dtype=torch.bool)
    others[hubs] = False
    assert int(in_degree[others].max()) < 50  # the rest: 2000 uniform edges and the spokes' ends
    with pytest.raises(ValueError, match="num_edges"):
        collect.hub_graph(2000, 2999, 3, seed=1, device=CPU)


def test_the_smallest_hub_graph_of_the_corpus():
    spec = collect.select_graphs(["hub1"])[0]
    graph = spec.load(CPU)
    stats = csr_stats(graph.csr)
    assert graph.num_edges == spec.num_edges and graph.num_dst == spec.num_nodes
    assert stats.rows.max >= collect.HUB_DEGREE and stats.cols.max >= collect.HUB_DEGREE
    assert collect.family(spec, graph) == "power_law"


@pytest.mark.parametrize("num_nodes, num_edges", [(2500, 10_000), (997, 3001)])
def test_batch_graphs_are_block_diagonal(num_nodes, num_edges):
    edge_index = collect.batch_graph(num_nodes, num_edges, seed=0, device=CPU)
    pairs = (num_edges + 1) // 2
    assert edge_index.shape == (2, 2 * pairs)
    assert torch.equal(edge_index[:, pairs:], edge_index.flip(0)[:, :pairs])  # both directions
    assert 0 <= int(edge_index.min()) and int(edge_index.max()) < num_nodes
    src, dst = edge_index.numpy()
    adjacency = sp.coo_matrix((np.ones(src.size), (src, dst)), shape=(num_nodes, num_nodes))
    count, label = sp.csgraph.connected_components(adjacency, directed=False)
    sizes = np.bincount(label)
    low, high = collect.BATCH_NODES
    assert sizes.max() <= high and count >= num_nodes // high
    # The nodes of each component are consecutive: the graphs sit on the diagonal.
    for component in range(count):
        nodes = np.flatnonzero(label == component)
        assert nodes[-1] - nodes[0] + 1 <= high
    spec = collect.select_graphs(["batch"])[0]
    assert collect.family(spec, spec.load(CPU)) == "uniform"


def test_collect_rejects_an_unknown_dtype(tmp_path, interpret):
    with pytest.raises(ValueError, match="dtypes: unknown 'float64'"):
        collect.collect(collect.Settings(out=tmp_path, dtypes=["float64"], device="cpu"))
    args = cli.parser().parse_args(["collect", "--dtypes", "float32,float16,bfloat16"])
    assert args.dtypes == ["float32", "float16", "bfloat16"]


@pytest.mark.slow
def test_half_dtypes_are_collected(collect_cli, tmp_path):
    out = tmp_path / "raw"
    collect_cli(out, "--graphs", SMOKE_GRAPHS.split(",")[0], "--dtypes", "float16,bfloat16", "--configs", "1")
    table = collect.read_table([out])
    assert set(table["dtype"]) == {"float16", "bfloat16"}
    assert (table["status"] == "ok").all() and (table["itemsize"] == 2).all() and (table["time_ms"] > 0).all()
    schedules = table.groupby("dtype")["config"].apply(frozenset)
    assert schedules["float16"] == schedules["bfloat16"]  # the same schedules per dtype
