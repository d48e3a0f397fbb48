import io
import math
import zipfile

import numpy as np
import pytest
import torch
from torch_geometric.datasets import Planetoid
from torch_geometric.utils import is_undirected

from pyg_ugrapher import datasets as D
from pyg_ugrapher.datasets import (
    available_datasets,
    datasets_dir,
    load_amazon,
    load_coauthor,
    load_cora,
    load_dataset,
    load_musae,
    load_planetoid,
    load_tu_gin,
    power_law_graph,
    rmat_graph,
    synthetic_graph,
    uniform_graph,
)
from pyg_ugrapher.paths import CACHE_ENV


def _has_shared() -> bool:
    try:
        datasets_dir()
    except FileNotFoundError:
        return False
    return True


requires_shared = pytest.mark.skipif(
    not _has_shared(), reason="shared datasets folder not found (set PYG_UGRAPHER_DATASETS)"
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    # Planetoid writes into the cache: keep it out of the user's home, shared by the module's
    # tests so that Cora and CiteSeer are processed once.
    path = tmp_path_factory.getbasetemp() / "ugrapher_cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


@pytest.fixture
def no_download(monkeypatch):
    def fail(self):
        raise AssertionError("Planetoid tried to download")

    monkeypatch.setattr(Planetoid, "download", fail)


def assert_edge_index(edge_index, num_nodes, num_edges):
    assert edge_index.dtype == torch.long
    assert edge_index.shape == (2, num_edges)
    assert int(edge_index.min()) >= 0
    assert int(edge_index.max()) < num_nodes


def num_unique_edges(edge_index, num_nodes):
    return (edge_index[0] * num_nodes + edge_index[1]).unique().numel()


def num_self_loops(edge_index):
    return int((edge_index[0] == edge_index[1]).sum())


# Planetoid ###################################################################################


def test_bundled_cora_files():
    names = sorted(path.name for path in D._BUNDLED_CORA_RAW.iterdir())
    assert names == sorted(f"ind.cora.{suffix}" for suffix in D._PLANETOID_FILES)


def test_load_cora(cache_dir, no_download, monkeypatch, tmp_path):
    # The bundle needs no shared folder.
    monkeypatch.setenv(D.DATASETS_ENV, str(tmp_path / "missing"))
    data = load_cora()

    assert data.num_nodes == 2708
    assert_edge_index(data.edge_index, 2708, 10556)
    assert is_undirected(data.edge_index, num_nodes=2708)
    assert num_unique_edges(data.edge_index, 2708) == 10556
    assert num_self_loops(data.edge_index) == 0
    assert data.x.shape == (2708, 1433)
    assert set(data.x.unique().tolist()) == {0.0, 1.0}
    assert data.y.dtype == torch.long
    assert torch.bincount(data.y).tolist() == [351, 217, 418, 818, 426, 298, 180]
    assert int(data.train_mask.sum()) == 140
    assert int(data.val_mask.sum()) == 500
    assert int(data.test_mask.sum()) == 1000
    assert not (data.train_mask & data.test_mask).any()

    assert (cache_dir / "datasets" / "Cora" / "processed" / "data.pt").is_file()
    assert len(list((cache_dir / "datasets" / "Cora" / "raw").iterdir())) == 8
    again = load_dataset("Cora")
    assert torch.equal(again.edge_index, data.edge_index)
    assert torch.equal(again.x, data.x)


@requires_shared
def test_load_citeseer(no_download):
    data = load_planetoid("citeseer")
    assert data.num_nodes == 3327
    assert_edge_index(data.edge_index, 3327, 9104)
    assert is_undirected(data.edge_index, num_nodes=3327)
    assert data.x.shape == (3327, 3703)
    assert int(data.y.max()) + 1 == 6
    assert int(data.train_mask.sum()) == 120
    assert int(data.test_mask.sum()) == 1000


@requires_shared
def test_load_pubmed():
    data = load_planetoid("PubMed")
    assert data.num_nodes == 19717
    assert_edge_index(data.edge_index, 19717, 88648)
    assert is_undirected(data.edge_index, num_nodes=19717)
    assert num_unique_edges(data.edge_index, 19717) == 88648
    assert num_self_loops(data.edge_index) == 0  # the raw graph has some: PyG drops them
    # PyG's published class sizes, so the labels are assembled and reordered as PyG does.
    assert torch.bincount(data.y).tolist() == [4103, 7739, 7875]
    assert int(data.train_mask.sum()) == 60
    assert int(data.val_mask.sum()) == 500
    assert int(data.test_mask.sum()) == 1000
    assert int(data.test_mask[:18717].sum()) == 0

    assert data.x.shape == (19717, D.PUBMED_NUM_FEATURES) == (19717, 500)
    assert data.x.dtype == torch.float
    assert 0.0 <= float(data.x.min()) and float(data.x.max()) < 1.0
    assert torch.equal(load_dataset("pubmed").x, data.x)  # seeded


# Other real graphs ###########################################################################

# name: nodes, directed edges, self loops, x shape[1] (None: no x), classes, graphs
EXPECTED = {
    "blogcatalog": (10312, 667966, 0, None, None, None),
    "amazon-computers": (13752, 491722, 0, 767, 10, None),
    "amazon-photo": (7650, 238162, 0, 745, 8, None),
    "coauthor-cs": (18333, 163788, 0, 6805, 15, None),
    "coauthor-physics": (34493, 495924, 0, 8415, 5, None),
    "tolokers": (11758, 1038000, 0, 10, 2, None),
    "github": (37700, 578006, 0, None, 2, None),
    "facebook": (22470, 341825, 179, None, 4, None),
    "proteins": (43471, 162088, 0, 29, 2, 1113),
    "dd": (334925, 1686092, 0, None, 2, 1178),
    "collab": (372474, 24574995, 2837, None, 3, 5000),
}


@requires_shared
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] if name == "collab" else []) for name in EXPECTED]
)
def test_load_dataset(name):
    num_nodes, num_edges, self_loops, num_features, num_classes, num_graphs = EXPECTED[name]
    data = load_dataset(name)

    assert data.num_nodes == num_nodes
    assert_edge_index(data.edge_index, num_nodes, num_edges)
    assert is_undirected(data.edge_index, num_nodes=num_nodes)
    assert num_unique_edges(data.edge_index, num_nodes) == num_edges
    assert num_self_loops(data.edge_index) == self_loops

    if num_features is None:
        assert data.x is None
    else:
        assert data.x.shape == (num_nodes, num_features)
        assert data.x.dtype == torch.float

    if num_classes is not None:
        assert data.y.dtype == torch.long
        assert data.y.shape == (num_graphs or num_nodes,)
        assert data.y.unique().tolist() == list(range(num_classes))

    if num_graphs is None:
        assert "batch" not in data
    else:
        assert data.batch.shape == (num_nodes,)
        assert int(data.batch.max()) + 1 == num_graphs
        assert bool((data.batch[1:] >= data.batch[:-1]).all())
        # Block-diagonal: no edge crosses graphs.
        assert torch.equal(data.batch[data.edge_index[0]], data.batch[data.edge_index[1]])


@requires_shared
def test_blogcatalog_labels():
    y = load_dataset("blogcatalog").y
    assert y.shape == (10312, 39)
    assert float(y.sum()) == 14476  # multi-label memberships
    assert float(y.sum(dim=1).min()) >= 1


@requires_shared
def test_tolokers_splits():
    data = load_dataset("tolokers")
    for key, size in (("train_mask", 5879), ("val_mask", 2939), ("test_mask", 2940)):
        assert data[key].shape == (11758, 10)
        assert data[key].sum(dim=0).tolist() == [size] * 10
    assert not (data.train_mask & data.test_mask).any()


@requires_shared
def test_github_is_power_law():
    data = load_musae("GitHub")
    degree = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    assert int(degree.max()) == 9458


@requires_shared
@pytest.mark.parametrize("name", ["Photo", "Computers"])
def test_amazon_matches_pyg_reader(name):
    pytest.importorskip("scipy")
    from torch_geometric.io import parse_npz

    data = load_amazon(name)
    path = datasets_dir() / "amazon_electronics" / f"amazon-{name.lower()}.zip"
    with zipfile.ZipFile(path) as zf:
        raw = zf.read(zf.namelist()[0])
    with np.load(io.BytesIO(raw)) as f:
        expected = parse_npz(f)
    assert torch.equal(data.edge_index, expected.edge_index)
    assert torch.equal(data.x, expected.x)
    assert torch.equal(data.y, expected.y)


@requires_shared
def test_coauthor_features_are_binarised():
    x = load_coauthor("cs").x
    # The raw counts go up to 5; PyG's reader keeps only presence, one 1 per stored entry.
    assert bool(((x == 0) | (x == 1)).all())
    assert int(x.sum()) == 1092079


def test_gin_text_block_diagonal():
    text = "2\n2 1\n0 1 1\n0 1 0\n3 0\n5 1 1\n5 2 0 2\n5 1 1\n"
    data = D._read_gin_txt(text)
    assert data.num_nodes == 5
    assert data.edge_index.tolist() == [[0, 1, 2, 3, 3, 4], [1, 0, 3, 2, 4, 3]]
    assert data.batch.tolist() == [0, 0, 1, 1, 1]
    assert data.y.tolist() == [1, 0]
    assert data.x is None


@pytest.mark.parametrize(
    "text",
    [
        "1\n2 0\n0 1 2\n0 1 0\n",  # neighbour 2 in a graph of 2 nodes
        "1\n2 0\n0 1 1\n0 1 0\n7\n",  # trailing numbers
    ],
)
def test_gin_text_malformed(text):
    with pytest.raises(ValueError, match="Malformed GIN"):
        D._read_gin_txt(text)


# Registry and locations ######################################################################


def test_available_datasets():
    assert available_datasets() == [
        "cora",
        "citeseer",
        "pubmed",
        "blogcatalog",
        "amazon-computers",
        "amazon-photo",
        "coauthor-cs",
        "coauthor-physics",
        "tolokers",
        "github",
        "facebook",
        "proteins",
        "dd",
        "collab",
    ]


@pytest.mark.parametrize(
    "loader, name",
    [
        (load_dataset, "reddit"),
        (load_dataset, 3),
        (load_planetoid, "NELL"),
        (load_amazon, "Books"),
        (load_coauthor, "Math"),
        (load_musae, "Twitter"),
        (load_tu_gin, "MUTAG"),
    ],
)
def test_unknown_name(loader, name):
    with pytest.raises(ValueError, match="'name'") as info:
        loader(name)
    if loader is load_dataset:
        assert "'cora'" in str(info.value) and "'collab'" in str(info.value)


def test_datasets_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(D.DATASETS_ENV, str(tmp_path))
    assert datasets_dir() == tmp_path.resolve()
    monkeypatch.setenv(D.DATASETS_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=D.DATASETS_ENV):
        datasets_dir()


def test_datasets_dir_defaults(monkeypatch, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pyg_ugrapher").mkdir(parents=True)
    monkeypatch.delenv(D.DATASETS_ENV, raising=False)
    monkeypatch.setattr(D, "_PACKAGE_DIR", repo / "pyg_ugrapher")
    monkeypatch.chdir(repo)
    with pytest.raises(FileNotFoundError, match=D.DATASETS_ENV):
        datasets_dir()

    (repo / "shared" / "datasets").mkdir(parents=True)  # ./shared/datasets
    assert datasets_dir() == (repo / "shared" / "datasets").resolve()

    (tmp_path / "shared" / "datasets").mkdir(parents=True)  # beside the repo: preferred
    assert datasets_dir() == (tmp_path / "shared" / "datasets").resolve()


@pytest.mark.parametrize("name", ["citeseer", "pubmed", "tolokers", "dd", "github"])
def test_missing_file(monkeypatch, tmp_path, no_download, name):
    monkeypatch.setenv(D.DATASETS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=D.DATASETS_ENV):
        load_dataset(name)


def test_partial_planetoid_raw(monkeypatch, tmp_path, no_download):
    raw = tmp_path / "planetoid" / "CiteSeer" / "raw"
    raw.mkdir(parents=True)
    (raw / "ind.citeseer.x").write_bytes(b"")
    monkeypatch.setenv(D.DATASETS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="ind.citeseer.allx"):
        load_planetoid("CiteSeer")


# Synthetic graphs ############################################################################

GENERATORS = {
    "uniform": lambda n, e, **kw: uniform_graph(n, e, **kw),
    "power_law": lambda n, e, **kw: power_law_graph(n, e, **kw),
    "rmat": lambda n, e, **kw: rmat_graph(int(math.log2(n)), e, **kw),
}


def max_over_mean_degree(edge_index, num_nodes, row=1):
    degree = torch.bincount(edge_index[row], minlength=num_nodes).float()
    return float(degree.max() / degree.mean())


@pytest.mark.parametrize("kind", GENERATORS)
def test_synthetic_shape_and_determinism(kind):
    gen = GENERATORS[kind]
    edge_index = gen(1024, 5000, seed=3)
    assert_edge_index(edge_index, 1024, 5000)
    assert edge_index.device.type == "cpu"
    assert torch.equal(gen(1024, 5000, seed=3), edge_index)
    assert not torch.equal(gen(1024, 5000, seed=4), edge_index)
    assert torch.equal(synthetic_graph(kind, 1024, 5000, seed=3), edge_index)


@pytest.mark.parametrize("kind", ["uniform", "power_law"])
def test_synthetic_bipartite(kind):
    edge_index = synthetic_graph(kind, 1000, 20000, num_dst_nodes=7, seed=1)
    assert edge_index.shape == (2, 20000)
    assert int(edge_index[1].min()) == 0 and int(edge_index[1].max()) == 6
    assert 7 < int(edge_index[0].max()) < 1000
    assert int(edge_index[0].min()) >= 0


def test_power_law_is_skewed():
    num_nodes, num_edges = 10_000, 100_000
    edge_index = power_law_graph(num_nodes, num_edges, exponent=0.8)
    assert max_over_mean_degree(edge_index, num_nodes, row=0) > 20
    assert max_over_mean_degree(edge_index, num_nodes, row=1) > 20
    # Hubs are scattered over the ids, not packed at the start.
    degree = torch.bincount(edge_index[1], minlength=num_nodes)
    assert float(degree.topk(100).indices.float().mean()) > 1000

    flat = power_law_graph(num_nodes, num_edges, exponent=0.0)
    assert max_over_mean_degree(flat, num_nodes) < 5


def test_uniform_is_not_skewed():
    edge_index = uniform_graph(10_000, 100_000)
    assert max_over_mean_degree(edge_index, 10_000, row=0) < 5
    assert max_over_mean_degree(edge_index, 10_000, row=1) < 5


def test_rmat_is_skewed():
    edge_index = rmat_graph(14, 100_000)
    assert max_over_mean_degree(edge_index, 1 << 14, row=0) > 20
    assert max_over_mean_degree(edge_index, 1 << 14, row=1) > 20
    flat = rmat_graph(14, 100_000, a=0.25, b=0.25, c=0.25)
    assert max_over_mean_degree(flat, 1 << 14) < 5


@pytest.mark.parametrize(
    "probs, src, dst",
    [
        ((1.0, 0.0, 0.0), 0, 0),
        ((0.0, 1.0, 0.0), 0, 15),
        ((0.0, 0.0, 1.0), 15, 0),
        ((0.0, 0.0, 0.0), 15, 15),  # d = 1
    ],
)
def test_rmat_quadrants(probs, src, dst):
    a, b, c = probs
    edge_index = rmat_graph(4, 10, a=a, b=b, c=c)
    assert edge_index[0].tolist() == [src] * 10
    assert edge_index[1].tolist() == [dst] * 10


def test_synthetic_chunks(monkeypatch):
    monkeypatch.setattr(D, "_CHUNK", 1000)
    # Every edge of every chunk, the last partial one too, gets written.
    assert rmat_graph(4, 2500, a=0.0, b=0.0, c=0.0).unique().tolist() == [15]
    edge_index = power_law_graph(500, 2500, seed=2)
    assert_edge_index(edge_index, 500, 2500)
    assert torch.equal(power_law_graph(500, 2500, seed=2), edge_index)
    assert max_over_mean_degree(edge_index, 500) > 5


def test_synthetic_graph_rmat_nodes():
    edge_index = synthetic_graph("rmat", 1024, 100)
    assert torch.equal(edge_index, rmat_graph(10, 100))
    with pytest.raises(ValueError, match="'num_nodes'"):
        synthetic_graph("rmat", 1000, 100)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: uniform_graph(0, 10), "'num_nodes'"),
        (lambda: uniform_graph(10, 0), "'num_edges'"),
        (lambda: uniform_graph(10, -5), "'num_edges'"),
        (lambda: uniform_graph(10, 10, num_dst_nodes=0), "'num_dst_nodes'"),
        (lambda: power_law_graph(0, 10), "'num_nodes'"),
        (lambda: power_law_graph(10, 0), "'num_edges'"),
        (lambda: power_law_graph(10, 10, num_dst_nodes=-1), "'num_dst_nodes'"),
        (lambda: power_law_graph(10, 10, exponent=-0.5), "'exponent'"),
        (lambda: power_law_graph(10, 10, exponent=float("inf")), "'exponent'"),
        (lambda: power_law_graph(10, 10, exponent=float("nan")), "'exponent'"),
        (lambda: rmat_graph(0, 10), "'scale'"),
        (lambda: rmat_graph(63, 10), "'scale'"),
        (lambda: rmat_graph(4, 0), "'num_edges'"),
        (lambda: rmat_graph(4, 10, a=-0.1), "'a'"),
        (lambda: rmat_graph(4, 10, b=1.5), "'b'"),
        (lambda: rmat_graph(4, 10, c=-1.0), "'c'"),
        (lambda: rmat_graph(4, 10, a=0.5, b=0.3, c=0.3), "sum to at most 1"),
        (lambda: synthetic_graph("kronecker", 16, 10), "'kind'"),
    ],
)
def test_synthetic_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: uniform_graph(10.5, 10), "'num_nodes'"),
        (lambda: uniform_graph(10, True), "'num_edges'"),
        (lambda: uniform_graph(10, 10, seed="0"), "'seed'"),
        (lambda: power_law_graph(10, 10, exponent="0.8"), "'exponent'"),
        (lambda: rmat_graph(4, 10, a=None), "'a'"),
    ],
)
def test_synthetic_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("kind", GENERATORS)
def test_synthetic_cuda_1e8(kind):
    num_nodes, num_edges = 1 << 20, 100_000_000
    edge_index = GENERATORS[kind](num_nodes, num_edges, seed=5, device="cuda")
    assert edge_index.device.type == "cuda"
    assert_edge_index(edge_index, num_nodes, num_edges)
    assert torch.equal(GENERATORS[kind](num_nodes, num_edges, seed=5, device="cuda"), edge_index)
    skew = max_over_mean_degree(edge_index, num_nodes)
    assert skew < 2 if kind == "uniform" else skew > 20


# neighbor_sample #################################################################################


def _global_edges(batch: torch.Tensor, node_ids: torch.Tensor) -> torch.Tensor:
    return node_ids[batch]


def test_neighbor_sample_keeps_at_most_fanout_real_in_edges():
    full = D.power_law_graph(500, 6000, seed=4)
    seeds = torch.tensor([3, 17, 250, 499])
    batch, node_ids = D.neighbor_sample(full, 500, seeds, [4, 2], seed=1)
    assert torch.equal(node_ids[:4], seeds) and node_ids.unique().numel() == node_ids.numel()
    assert batch.min() >= 0 and batch.max() < node_ids.numel()
    edges = _global_edges(batch, node_ids)
    # Every kept edge is an edge of the graph, taken as often as it occurs there at most.
    pairs = {}
    for u, v in full.t().tolist():
        pairs[(u, v)] = pairs.get((u, v), 0) + 1
    for pair, count in zip(*torch.unique(edges.t(), dim=0, return_counts=True)):
        assert count <= pairs.get(tuple(pair.tolist()), 0)
    in_degree = torch.bincount(full[1], minlength=500)
    kept = torch.bincount(edges[1], minlength=500)
    # Seeds keep min(degree, 4) edges; second-hop nodes at most 2; nothing else is a destination.
    assert torch.equal(kept[seeds], torch.clamp(in_degree[seeds], max=4))
    others = torch.ones(500, dtype=torch.bool)
    others[seeds] = False
    assert kept[others].max() <= 2
    assert set(edges[1].tolist()) <= set(node_ids.tolist())


def test_neighbor_sample_takes_whole_small_neighbourhoods_and_is_seeded():
    full = D.uniform_graph(300, 1200, seed=2)
    seeds = torch.arange(0, 300, 7)
    batch, node_ids = D.neighbor_sample(full, 300, seeds, [1000])
    edges = _global_edges(batch, node_ids)
    assert edges.shape[1] == int(torch.isin(full[1], seeds).sum())
    first = D.neighbor_sample(full, 300, seeds, [2, 2], seed=5)
    again = D.neighbor_sample(full, 300, seeds, [2, 2], seed=5)
    other = D.neighbor_sample(full, 300, seeds, [2, 2], seed=6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(_global_edges(*first), _global_edges(*other))


def test_neighbor_sample_groups_an_index_once_and_again_after_it_changes():
    """Batches of one index, whose grouping by destination is kept with it, equal those of fresh
    copies of it; changed in place (or read with another node count), the index is grouped again."""
    full = D.power_law_graph(400, 5000, seed=7)
    seeds = torch.tensor([5, 80, 399])
    for step in range(3):
        kept = D.neighbor_sample(full, 400, seeds, [3, 2], seed=step)
        fresh = D.neighbor_sample(full.clone(), 400, seeds, [3, 2], seed=step)
        assert all(torch.equal(a, b) for a, b in zip(kept, fresh))
    edges = torch.tensor([[1, 3], [0, 2]])  # 1 -> 0, 3 -> 2
    assert D.neighbor_sample(edges, 4, torch.tensor([0]), [1])[1].tolist() == [0, 1]
    edges[0, 0] = 2  # now 2 -> 0
    assert D.neighbor_sample(edges, 4, torch.tensor([0]), [1])[1].tolist() == [0, 2]
    edges[1, 1] = 0  # now 3 -> 0 too: the same index, grouped again
    assert sorted(D.neighbor_sample(edges, 4, torch.tensor([0]), [2])[1].tolist()) == [0, 2, 3]
    assert D.neighbor_sample(edges, 5, torch.tensor([4]), [2])[1].tolist() == [4]  # another node count


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(seeds=torch.tensor([1, 1])), ValueError, "seeds"),
        (dict(seeds=torch.tensor([300])), ValueError, "seeds"),
        (dict(seeds=torch.tensor([], dtype=torch.long)), ValueError, "seeds"),
        (dict(num_neighbors=[0]), ValueError, "num_neighbors"),
        (dict(num_neighbors=[1.5]), TypeError, "num_neighbors"),
        (dict(edge_index=torch.zeros(3, 4, dtype=torch.long)), ValueError, "edge_index"),
    ],
)
def test_neighbor_sample_rejects_bad_input(kwargs, error, match):
    args = dict(
        edge_index=D.uniform_graph(300, 1200, seed=2), num_nodes=300, seeds=torch.tensor([1, 2]), num_neighbors=[2]
    )
    args.update(kwargs)
    with pytest.raises(error, match=match):
        D.neighbor_sample(**args)
