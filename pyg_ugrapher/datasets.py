r"""Real graphs and synthetic graph generators for tests, benchmarks and cost-model sweeps.

Real graphs come in two places:

* **Cora** ships inside the package (``pyg_ugrapher/data/Cora/raw``) and always loads.
* Every other graph is read from the *shared datasets folder*: the environment variable
  ``PYG_UGRAPHER_DATASETS`` if set, otherwise the first existing of
  ``<repo root>/../shared/datasets`` and ``./shared/datasets``. Its layout is described in that
  folder's ``SOURCES.md``.

Nothing here ever touches the network. Every loader returns a :class:`torch_geometric.data.Data`
with an ``int64`` ``edge_index`` of shape ``[2, E]`` in PyG's convention: undirected graphs hold
both directions of every edge, coalesced (sorted, no duplicates). ``num_nodes`` is always set;
``x`` and ``y`` are set where the source has them.

The synthetic generators (:func:`uniform_graph`, :func:`power_law_graph`, :func:`rmat_graph`)
return a bare ``edge_index``. They are seeded, vectorised and generate directly on the requested
device, so they scale to :math:`10^8` edges on a GPU. The same seed on the same device type gives
the same graph; CPU and CUDA random streams differ.

.. code-block:: python

    from pyg_ugrapher.datasets import load_dataset, power_law_graph

    data = load_dataset("cora")
    edge_index = power_law_graph(1_000_000, 100_000_000, device="cuda")
"""

from __future__ import annotations

import io
import math
import numbers
import os
import shutil
import zipfile
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.datasets import Planetoid
from torch_geometric.io.planetoid import edge_index_from_dict, read_file
from torch_geometric.utils import index_to_mask, remove_self_loops, to_undirected

from .paths import cache_dir
from .structure import IdentityMap, build_csr, note_checked, version

Device = Union[str, torch.device]

__all__ = [
    "datasets_dir",
    "load_cora",
    "load_planetoid",
    "load_blogcatalog",
    "load_amazon",
    "load_coauthor",
    "load_tolokers",
    "load_musae",
    "load_proteins",
    "load_tu_gin",
    "load_dataset",
    "available_datasets",
    "uniform_graph",
    "power_law_graph",
    "rmat_graph",
    "synthetic_graph",
    "neighbor_sample",
]

#: Environment variable naming the shared datasets folder.
DATASETS_ENV = "PYG_UGRAPHER_DATASETS"

_PACKAGE_DIR = Path(__file__).resolve().parent
_BUNDLED_CORA_RAW = _PACKAGE_DIR / "data" / "Cora" / "raw"
_PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

#: Width and seed of PubMed's stand-in features (the shared copy lacks ``ind.pubmed.allx``).
PUBMED_NUM_FEATURES = 500
PUBMED_FEATURE_SEED = 0

#: Edges generated per step by the synthetic generators: bounds their temporary memory (a few
#: hundred MB at most) whatever the number of edges asked for.
_CHUNK = 1 << 24


# Locations ###################################################################################


def datasets_dir() -> Path:
    r"""The shared datasets folder, as an absolute path.

    ``$PYG_UGRAPHER_DATASETS`` if set, else the first existing of ``<repo root>/../shared/datasets``
    and ``./shared/datasets``.

    Raises:
        FileNotFoundError: if the folder does not exist.
    """
    env = os.environ.get(DATASETS_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"{DATASETS_ENV}={env!r} is not a folder; set {DATASETS_ENV} to the folder that "
                f"holds the shared datasets (the one with SOURCES.md)"
            )
        return path.resolve()
    candidates = [_PACKAGE_DIR.parent.parent / "shared" / "datasets", Path("shared") / "datasets"]
    for path in candidates:
        if path.is_dir():
            # Absolute, so that a later change of the working folder does not break it.
            return path.resolve()
    raise FileNotFoundError(
        f"No shared datasets folder found (looked in {', '.join(map(str, candidates))}); set "
        f"{DATASETS_ENV} to the folder that holds the shared datasets"
    )


def _dataset_file(*parts: str) -> Path:
    path = datasets_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"Dataset file {str(path)!r} does not exist; set {DATASETS_ENV} to a shared datasets "
            f"folder that holds '{'/'.join(parts)}'"
        )
    return path


def _pick(name: str, choices: Sequence[str]) -> str:
    # Names are matched case-insensitively, as PyG's dataset classes match theirs.
    for choice in choices:
        if isinstance(name, str) and name.lower() == choice.lower():
            return choice
    raise ValueError(f"Argument 'name' must be one of {', '.join(map(repr, choices))} (got {name!r})")


# Planetoid ###################################################################################


def _planetoid_from_raw(name: str, raw_src: Path) -> Data:
    prefix = name.lower()
    sources = [raw_src / f"ind.{prefix}.{suffix}" for suffix in _PLANETOID_FILES]
    missing = [str(path) for path in sources if not path.is_file()]
    if missing:
        # Planetoid would fall back to downloading them: fail here instead.
        raise FileNotFoundError(
            f"Missing {name} raw files: {', '.join(missing)}; set {DATASETS_ENV} to a shared "
            f"datasets folder that holds planetoid/{name}/raw"
        )

    # Planetoid writes `processed/` next to `raw/`, and neither the package folder nor the shared
    # folder may be writable: work on a copy in the cache.
    root = cache_dir("datasets")
    raw_dir = cache_dir("datasets", name, "raw")
    for src in sources:
        dst = raw_dir / src.name
        if not dst.exists():
            # Copy-then-rename, so that a concurrent loader never sees a half-written file.
            tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
    return Planetoid(str(root), name)[0]


def load_cora() -> Data:
    r"""The Cora citation graph bundled with the package, read by PyG's
    :class:`~torch_geometric.datasets.Planetoid`.

    2,708 nodes, 10,556 directed edges (5,278 undirected), 1,433 binary features, 7 classes and
    the public split masks (``train_mask``, ``val_mask``, ``test_mask``). The raw files are copied
    once into ``$PYG_UGRAPHER_CACHE/datasets/Cora/raw`` (default cache:
    ``~/.cache/pyg_ugrapher``), where Planetoid also keeps its processed file.
    """
    return _planetoid_from_raw("Cora", _BUNDLED_CORA_RAW)


def load_planetoid(name: str) -> Data:
    r"""A Planetoid citation graph: ``"Cora"``, ``"CiteSeer"`` or ``"PubMed"`` (any case).

    Cora comes from the package (:func:`load_cora`); CiteSeer is read from the shared folder by
    PyG's :class:`~torch_geometric.datasets.Planetoid` (through the cache, as Cora).

    PubMed cannot go through Planetoid: the shared copy has no ``ind.pubmed.allx`` (the features
    of the unlabelled nodes). Its graph is built from ``ind.pubmed.graph`` with PyG's own
    Planetoid helpers (self loops removed, coalesced: 19,717 nodes, 88,648 directed edges), its
    labels and public split masks exactly as PyG builds them, and **its features are random**:
    ``torch.rand(19717, 500)`` from a generator seeded with :data:`PUBMED_FEATURE_SEED`, the width
    of the real TF-IDF features. Use them for shapes and timing, not for accuracy.
    """
    name = _pick(name, ["Cora", "CiteSeer", "PubMed"])
    if name == "Cora":
        return load_cora()
    if name == "CiteSeer":
        return _planetoid_from_raw(name, _dataset_file("planetoid", name, "raw"))
    return _load_pubmed()


def _load_pubmed() -> Data:
    suffixes = ("y", "ty", "ally", "graph", "test.index")
    for suffix in suffixes:  # a clear error for a missing file, before PyG's reader opens any
        _dataset_file("planetoid", "PubMed", "raw", f"ind.pubmed.{suffix}")
    folder = str(datasets_dir() / "planetoid" / "PubMed" / "raw")
    y, ty, ally, graph, test_index = (read_file(folder, "pubmed", s) for s in suffixes)

    # The same label assembly and public split as `torch_geometric.io.read_planetoid_data`.
    label = torch.cat([ally, ty], dim=0).argmax(dim=1)
    sorted_test_index = test_index.sort()[0]
    label[test_index] = label[sorted_test_index]
    num_nodes = label.numel()

    generator = torch.Generator().manual_seed(PUBMED_FEATURE_SEED)
    x = torch.rand(num_nodes, PUBMED_NUM_FEATURES, generator=generator)

    data = Data(x=x, edge_index=edge_index_from_dict(graph, num_nodes=num_nodes), y=label)
    data.train_mask = index_to_mask(torch.arange(y.size(0)), size=num_nodes)
    data.val_mask = index_to_mask(torch.arange(y.size(0), y.size(0) + 500), size=num_nodes)
    data.test_mask = index_to_mask(test_index, size=num_nodes)
    return data


# Other node-level graphs #####################################################################


def _undirected(row: np.ndarray, col: np.ndarray, num_nodes: int) -> Tensor:
    edge_index = torch.stack([torch.from_numpy(row), torch.from_numpy(col)]).to(torch.long)
    return to_undirected(edge_index, num_nodes=num_nodes)


def _csr_rows(indptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))


def _zip_member(zf: zipfile.ZipFile, suffix: str) -> str:
    # Archives carry macOS junk (`__MACOSX/`, `.DS_Store`) and odd prefixes (`PROTEINS_full//`).
    names = [n for n in zf.namelist() if n.endswith(suffix) and not n.startswith("__MACOSX")]
    if len(names) != 1:
        raise FileNotFoundError(
            f"Expected one member ending in {suffix!r} in {zf.filename!r}, found {names}; set "
            f"{DATASETS_ENV} to an unmodified shared datasets folder"
        )
    return names[0]


def _read_npz_zip(path: Path) -> Data:
    # The shchur/gnn-benchmark layout, read as `torch_geometric.io.read_npz` reads it: binary
    # dense features, self loops removed, symmetrised. Built without scipy, and with one
    # allocation of the dense features (the Coauthor Physics ones take 1.2 GB).
    with zipfile.ZipFile(path) as zf:
        raw = zf.read(_zip_member(zf, ".npz"))
    # Only numeric arrays are read: the object arrays in the file never need unpickling.
    with np.load(io.BytesIO(raw), allow_pickle=False) as f:
        num_nodes, num_features = (int(v) for v in f["attr_shape"])
        attr_row = _csr_rows(f["attr_indptr"])
        attr_col = f["attr_indices"].astype(np.int64)
        present = f["attr_data"] > 0
        adj_row = _csr_rows(f["adj_indptr"])
        adj_col = f["adj_indices"].astype(np.int64)
        label = torch.from_numpy(f["labels"]).to(torch.long)

    x = torch.zeros(num_nodes, num_features)
    x[torch.from_numpy(attr_row[present]), torch.from_numpy(attr_col[present])] = 1.0
    edge_index = torch.stack([torch.from_numpy(adj_row), torch.from_numpy(adj_col)])
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = to_undirected(edge_index, num_nodes=num_nodes)
    return Data(x=x, edge_index=edge_index, y=label, num_nodes=num_nodes)


def load_amazon(name: str) -> Data:
    r"""Amazon co-purchase graph ``"Computers"`` or ``"Photo"``, as PyG's
    :class:`~torch_geometric.datasets.Amazon` builds it.

    Binary bag-of-words features (767 / 745), product categories as ``y``, self loops removed and
    symmetrised (the source adjacency is not symmetric). Computers: 13,752 nodes, 491,722 edges;
    Photo: 7,650 nodes, 238,162 edges.
    """
    name = _pick(name, ["Computers", "Photo"])
    return _read_npz_zip(_dataset_file("amazon_electronics", f"amazon-{name.lower()}.zip"))


def load_coauthor(name: str) -> Data:
    r"""Co-authorship graph ``"CS"`` or ``"Physics"``, as PyG's
    :class:`~torch_geometric.datasets.Coauthor` builds it.

    Binarised keyword features (6,805 / 8,415, dense float: Physics' take 1.2 GB), fields of study
    as ``y``. CS: 18,333 nodes, 163,788 edges; Physics: 34,493 nodes, 495,924 edges.
    """
    name = _pick(name, ["CS", "Physics"])
    return _read_npz_zip(_dataset_file("coauthor", f"coauthor-{name.lower()}.zip"))


def load_blogcatalog() -> Data:
    r"""BlogCatalog3 (DeepWalk's copy): 10,312 bloggers, 667,966 directed edges (333,983
    undirected), no features; ``y`` is the float multi-label matrix ``[10312, 39]`` of group
    memberships. Needs scipy (the ``test`` extra) to read the MATLAB file.
    """
    path = _dataset_file("blogcatalog", "blogcatalog.mat")
    try:
        from scipy.io import loadmat
    except ImportError as e:
        raise ImportError("load_blogcatalog() needs scipy: pip install scipy") from e

    mat = loadmat(str(path))
    adj = mat["network"].tocoo()
    num_nodes = adj.shape[0]
    edge_index = _undirected(adj.row, adj.col, num_nodes)
    y = torch.from_numpy(mat["group"].toarray()).to(torch.float)
    return Data(edge_index=edge_index, y=y, num_nodes=num_nodes)


def load_tolokers() -> Data:
    r"""Tolokers (heterophilous benchmark), as PyG's
    :class:`~torch_geometric.datasets.HeterophilousGraphDataset` builds it: 11,758 nodes,
    1,038,000 directed edges (519,000 undirected), 10 features, binary ``y``, and the 10 splits as
    ``[11758, 10]`` boolean ``train_mask`` / ``val_mask`` / ``test_mask``.
    """
    with np.load(_dataset_file("tolokers", "tolokers.npz")) as f:
        x = torch.from_numpy(f["node_features"])
        y = torch.from_numpy(f["node_labels"]).to(torch.long)
        edges = f["edges"]
        masks = {k: torch.from_numpy(f[f"{k}s"]).t().contiguous() for k in ("train_mask", "val_mask", "test_mask")}
    num_nodes = x.size(0)
    edge_index = _undirected(edges[:, 0], edges[:, 1], num_nodes)
    return Data(x=x, edge_index=edge_index, y=y, num_nodes=num_nodes, **masks)


def load_musae(name: str) -> Data:
    r"""A MUSAE social graph, ``"GitHub"`` (developers) or ``"Facebook"`` (page-page).

    Only the edge list and the targets are in the shared folder, so ``x`` is ``None`` and ``y``
    the class per node. GitHub: 37,700 nodes, 578,006 directed edges, strongly power-law (one hub
    of degree ~9.5k). Facebook: 22,470 nodes, 341,825 directed edges including its 179 self loops
    (kept, once each).
    """
    name = _pick(name, ["GitHub", "Facebook"])
    key = name.lower()
    edges = np.loadtxt(_dataset_file("musae", f"{key}_edges.csv"), delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    target = np.loadtxt(_dataset_file("musae", f"{key}_target.csv"), delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    num_nodes = target.shape[0]
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"MUSAE {name} edges reference nodes outside 0..{num_nodes - 1}")
    y = torch.empty(num_nodes, dtype=torch.long)
    y[torch.from_numpy(target[:, 0])] = torch.from_numpy(target[:, 1])
    edge_index = _undirected(edges[:, 0], edges[:, 1], num_nodes)
    return Data(edge_index=edge_index, y=y, num_nodes=num_nodes)


# Graph-classification collections, as one block-diagonal graph ###############################


def _graph_labels(label: np.ndarray) -> Tensor:
    # Raw class ids are arbitrary (1/2, 0/1, ...): map to 0..C-1 as PyG's TUDataset does.
    return torch.from_numpy(np.unique(label, return_inverse=True)[1].reshape(-1)).to(torch.long)


def load_proteins() -> Data:
    r"""PROTEINS_full (TU Dortmund) as one block-diagonal graph of its 1,113 proteins.

    43,471 nodes, 162,088 directed edges, ``x`` the 29 continuous node attributes, ``y`` the
    graph label per protein (``[1113]``, 0/1) and ``batch`` the protein of each node. The
    categorical node labels are not included.
    """
    with zipfile.ZipFile(_dataset_file("tu", "PROTEINS_full.zip")) as zf:

        def table(suffix: str, dtype: type) -> np.ndarray:
            with zf.open(_zip_member(zf, suffix)) as f:
                return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)

        adj = table("_A.txt", np.int64) - 1  # 1-based ids
        batch = table("_graph_indicator.txt", np.int64)[:, 0] - 1
        label = table("_graph_labels.txt", np.int64)[:, 0]
        x = torch.from_numpy(table("_node_attributes.txt", np.float32))

    num_nodes = batch.size
    edge_index = _undirected(adj[:, 0], adj[:, 1], num_nodes)
    return Data(x=x, edge_index=edge_index, y=_graph_labels(label), batch=torch.from_numpy(batch), num_nodes=num_nodes)


def _read_gin_txt(text: str) -> Data:
    tokens = np.fromstring(text, dtype=np.int64, sep=" ")  # whitespace and newlines alike
    num_graphs = int(tokens[0])
    sizes = np.empty(num_graphs, dtype=np.int64)
    label = np.empty(num_graphs, dtype=np.int64)
    starts: List[int] = []  # token position of each node's neighbour list
    degrees: List[int] = []
    # The format is only decodable sequentially, but the walk reads two tokens per node and
    # skips over the neighbour lists, which are gathered in one vectorised step afterwards.
    pos = 1
    for g in range(num_graphs):
        sizes[g], label[g] = tokens[pos], tokens[pos + 1]
        pos += 2
        for _ in range(sizes[g]):
            degree = int(tokens[pos + 1])
            starts.append(pos + 2)
            degrees.append(degree)
            pos += 2 + degree
    if pos != tokens.size:
        raise ValueError(f"Malformed GIN text file: parsed {pos} of {tokens.size} numbers")

    deg = np.asarray(degrees, dtype=np.int64)
    num_nodes = deg.size
    batch = np.repeat(np.arange(num_graphs, dtype=np.int64), sizes)
    row = np.repeat(np.arange(num_nodes, dtype=np.int64), deg)
    # Token position of every neighbour: its node's list start, plus 0..deg-1.
    offset_in_list = np.arange(row.size, dtype=np.int64) - np.repeat(np.cumsum(deg) - deg, deg)
    local = tokens[np.repeat(np.asarray(starts, dtype=np.int64), deg) + offset_in_list]
    graph_of_edge = batch[row]
    if ((local < 0) | (local >= sizes[graph_of_edge])).any():
        raise ValueError("Malformed GIN text file: a neighbour index is outside its graph")
    col = local + (np.cumsum(sizes) - sizes)[graph_of_edge]  # local id -> block-diagonal id
    return Data(
        edge_index=_undirected(row, col, num_nodes),
        y=_graph_labels(label),
        batch=torch.from_numpy(batch),
        num_nodes=num_nodes,
    )


def load_tu_gin(name: str) -> Data:
    r"""``"DD"`` or ``"COLLAB"`` from the GIN ("powerful-gnns") text files, as one block-diagonal
    graph of all their graphs.

    No node features (``x`` is ``None``); ``y`` is the graph label per graph, ``batch`` the graph
    of each node. DD: 1,178 graphs, 334,925 nodes, 1,686,092 directed edges. COLLAB: 5,000
    graphs, 372,474 nodes, 24,574,995 directed edges, 2,837 of them self loops (kept, as in the
    file); COLLAB takes seconds and ~2 GB of memory to load.
    """
    name = _pick(name, ["DD", "COLLAB"])
    with zipfile.ZipFile(_dataset_file("tu_gin", f"{name}.zip")) as zf:
        text = zf.read(_zip_member(zf, f"{name}/{name}.txt")).decode("ascii")
    return _read_gin_txt(text)


# Registry ####################################################################################

_LOADERS: Dict[str, Callable[[], Data]] = {
    "cora": load_cora,
    "citeseer": partial(load_planetoid, "CiteSeer"),
    "pubmed": partial(load_planetoid, "PubMed"),
    "blogcatalog": load_blogcatalog,
    "amazon-computers": partial(load_amazon, "Computers"),
    "amazon-photo": partial(load_amazon, "Photo"),
    "coauthor-cs": partial(load_coauthor, "CS"),
    "coauthor-physics": partial(load_coauthor, "Physics"),
    "tolokers": load_tolokers,
    "github": partial(load_musae, "GitHub"),
    "facebook": partial(load_musae, "Facebook"),
    "proteins": load_proteins,
    "dd": partial(load_tu_gin, "DD"),
    "collab": partial(load_tu_gin, "COLLAB"),
}


def available_datasets() -> List[str]:
    r"""The names :func:`load_dataset` accepts: the Planetoid graphs first, the graph
    collections last."""
    return list(_LOADERS)


def load_dataset(name: str) -> Data:
    r"""Loads a real graph by name (case-insensitive), see :func:`available_datasets`.

    Raises:
        ValueError: if :obj:`name` is unknown.
        FileNotFoundError: if the shared datasets folder or a file in it is missing (every
            dataset but ``"cora"`` needs it; set ``PYG_UGRAPHER_DATASETS``).
    """
    return _LOADERS[_pick(name, available_datasets())]()


# Synthetic graphs ############################################################################


def _check_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Argument '{name}' must be an int (got {type(value).__name__})")
    if value < 1:
        raise ValueError(f"Argument '{name}' must be positive (got {value})")
    return int(value)


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Argument '{name}' must be a float (got {type(value).__name__})")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Argument '{name}' must lie in [0, 1] (got {value})")
    return float(value)


def _generator(seed: int, device: torch.device) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"Argument 'seed' must be an int (got {type(seed).__name__})")
    return torch.Generator(device=device).manual_seed(int(seed))


def uniform_graph(
    num_nodes: int,
    num_edges: int,
    *,
    seed: int = 0,
    device: Device = "cpu",
    num_dst_nodes: Optional[int] = None,
) -> Tensor:
    r"""An Erdős–Rényi-style graph: both endpoints of every edge drawn uniformly.

    Args:
        num_nodes (int): Number of (source) nodes.
        num_edges (int): Number of directed edges.
        seed (int, optional): Seed of the generator. (default: :obj:`0`)
        device (str or torch.device, optional): Where the edges are generated.
            (default: :obj:`"cpu"`)
        num_dst_nodes (int, optional): If given, the graph is bipartite: sources lie in
            ``[0, num_nodes)`` and destinations in ``[0, num_dst_nodes)``. (default: :obj:`None`)

    Returns:
        ``edge_index``, an ``int64`` tensor of shape ``[2, num_edges]``, unsorted. Duplicate edges
        and self loops occur with their natural probability and are not removed.
    """
    num_nodes = _check_size("num_nodes", num_nodes)
    num_edges = _check_size("num_edges", num_edges)
    num_dst = num_nodes if num_dst_nodes is None else _check_size("num_dst_nodes", num_dst_nodes)
    device = torch.device(device)
    generator = _generator(seed, device)

    # `random_` fills in place: no temporaries, so no chunking needed even at 10^8 edges.
    edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
    edge_index[0].random_(0, num_nodes, generator=generator)
    edge_index[1].random_(0, num_dst, generator=generator)
    return edge_index


def _chung_lu_sampler(
    num_nodes: int,
    exponent: float,
    generator: torch.Generator,
    device: torch.device,
) -> Callable[[Tensor], None]:
    # float64: with 10^7+ nodes the tail weights vanish below float32's resolution of the CDF.
    weight = torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device).pow_(-exponent)
    cdf = weight.cumsum_(0)
    cdf /= cdf[-1].item()
    perm = torch.randperm(num_nodes, generator=generator, device=device)

    def fill(out: Tensor) -> None:
        for start in range(0, out.numel(), _CHUNK):
            part = out[start : start + _CHUNK]
            u = torch.rand(part.numel(), dtype=torch.float64, generator=generator, device=device)
            # Rounding may leave cdf[-1] a hair below 1; the clamp keeps ids in range.
            rank = torch.searchsorted(cdf, u, right=True).clamp_max_(num_nodes - 1)
            part.copy_(perm[rank])

    return fill


def power_law_graph(
    num_nodes: int,
    num_edges: int,
    *,
    exponent: float = 0.8,
    seed: int = 0,
    device: Device = "cpu",
    num_dst_nodes: Optional[int] = None,
) -> Tensor:
    r"""A Chung-Lu graph with power-law expected degrees.

    The node of rank :math:`r` (0-based) has weight :math:`(r + 1)^{-\alpha}`, :math:`\alpha` =
    :obj:`exponent`; both endpoints of every edge are drawn independently with probability
    proportional to the weights (inverse-CDF sampling). Node ids are then permuted at random, so
    hubs are spread over the id range rather than packed at its start. :obj:`exponent` ``0`` gives
    a uniform graph; ``0.8`` with :math:`10^5` edges on :math:`10^4` nodes has a maximum degree
    some 50x the mean.

    Duplicate edges and self loops occur (often, around hubs) and are deliberately kept: real
    inputs contain them and the kernels must handle them.

    Args:
        num_nodes (int): Number of (source) nodes.
        num_edges (int): Number of directed edges.
        exponent (float, optional): The power-law exponent :math:`\alpha \geq 0`.
            (default: :obj:`0.8`)
        seed (int, optional): Seed of the generator. (default: :obj:`0`)
        device (str or torch.device, optional): Where the edges are generated, in chunks of
            :math:`2^{24}` edges. (default: :obj:`"cpu"`)
        num_dst_nodes (int, optional): If given, the graph is bipartite: sources lie in
            ``[0, num_nodes)`` and destinations, drawn from their own power law, in
            ``[0, num_dst_nodes)``. (default: :obj:`None`)

    Returns:
        ``edge_index``, an ``int64`` tensor of shape ``[2, num_edges]``, unsorted.
    """
    num_nodes = _check_size("num_nodes", num_nodes)
    num_edges = _check_size("num_edges", num_edges)
    if num_dst_nodes is not None:
        num_dst_nodes = _check_size("num_dst_nodes", num_dst_nodes)
    if isinstance(exponent, bool) or not isinstance(exponent, numbers.Real):
        raise TypeError(f"Argument 'exponent' must be a float (got {type(exponent).__name__})")
    if not (math.isfinite(exponent) and exponent >= 0):
        raise ValueError(f"Argument 'exponent' must be finite and >= 0 (got {exponent})")
    device = torch.device(device)
    generator = _generator(seed, device)

    fill_src = _chung_lu_sampler(num_nodes, float(exponent), generator, device)
    fill_dst = (
        fill_src if num_dst_nodes is None else _chung_lu_sampler(num_dst_nodes, float(exponent), generator, device)
    )
    edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
    fill_src(edge_index[0])
    fill_dst(edge_index[1])
    return edge_index


def rmat_graph(
    scale: int,
    num_edges: int,
    *,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    seed: int = 0,
    device: Device = "cpu",
) -> Tensor:
    r"""An R-MAT (recursive matrix) graph on :math:`2^{\text{scale}}` nodes.

    Every edge descends :obj:`scale` levels of the adjacency matrix, picking at each level the
    top-left, top-right, bottom-left or bottom-right quadrant with probability :obj:`a`,
    :obj:`b`, :obj:`c` and :math:`d = 1 - a - b - c`. One random draw per level serves all edges
    of a chunk at once. The defaults are Graph500's. Node ids are not scrambled: node 0 is the
    largest hub and low ids are denser, the classic R-MAT layout. Duplicate edges and self loops
    are kept (see :func:`power_law_graph`).

    Args:
        scale (int): :math:`\log_2` of the number of nodes, in ``[1, 62]``.
        num_edges (int): Number of directed edges.
        a (float, optional): Top-left probability. (default: :obj:`0.57`)
        b (float, optional): Top-right probability. (default: :obj:`0.19`)
        c (float, optional): Bottom-left probability. (default: :obj:`0.19`)
        seed (int, optional): Seed of the generator. (default: :obj:`0`)
        device (str or torch.device, optional): Where the edges are generated, in chunks of
            :math:`2^{24}` edges. (default: :obj:`"cpu"`)

    Returns:
        ``edge_index``, an ``int64`` tensor of shape ``[2, num_edges]``, unsorted.
    """
    scale = _check_size("scale", scale)
    if scale > 62:
        raise ValueError(f"Argument 'scale' must be at most 62 for int64 node ids (got {scale})")
    num_edges = _check_size("num_edges", num_edges)
    a = _check_probability("a", a)
    b = _check_probability("b", b)
    c = _check_probability("c", c)
    if a + b + c > 1.0 + 1e-9:
        raise ValueError(f"Arguments 'a', 'b', 'c' must sum to at most 1 (got {a + b + c})")
    device = torch.device(device)
    generator = _generator(seed, device)

    edge_index = torch.zeros(2, num_edges, dtype=torch.long, device=device)
    for start in range(0, num_edges, _CHUNK):
        src = edge_index[0, start : start + _CHUNK]
        dst = edge_index[1, start : start + _CHUNK]
        for _ in range(scale):
            u = torch.rand(src.numel(), generator=generator, device=device)
            # Quadrants in [0, 1): a = [0, a), b = [a, a+b), c = [a+b, a+b+c), d = the rest.
            src.mul_(2).add_(u >= a + b)
            dst.mul_(2).add_(((u >= a) & (u < a + b)) | (u >= a + b + c))
    return edge_index


def synthetic_graph(kind: str, num_nodes: int, num_edges: int, **kwargs) -> Tensor:
    r"""Dispatches to :func:`uniform_graph` (``"uniform"``), :func:`power_law_graph`
    (``"power_law"``) or :func:`rmat_graph` (``"rmat"``, where :obj:`num_nodes` must be a power of
    two). Keyword arguments are passed through.
    """
    if kind == "uniform":
        return uniform_graph(num_nodes, num_edges, **kwargs)
    if kind == "power_law":
        return power_law_graph(num_nodes, num_edges, **kwargs)
    if kind == "rmat":
        num_nodes = _check_size("num_nodes", num_nodes)
        if num_nodes & (num_nodes - 1):
            raise ValueError(f"Argument 'num_nodes' must be a power of two for kind 'rmat' (got {num_nodes})")
        return rmat_graph(num_nodes.bit_length() - 1, num_edges, **kwargs)
    raise ValueError(f"Argument 'kind' must be one of 'uniform', 'power_law', 'rmat' (got {kind!r})")


# Mini-batches ################################################################################


class _Incoming(NamedTuple):
    """A graph's edges grouped by destination, for the sampler: ``by_dst`` orders the edge ids by
    destination (stably), ``rowptr`` gives each destination's range in it."""

    version: Hashable
    num_nodes: int
    by_dst: Tensor
    rowptr: Tensor


# The sampler's grouping of each edge index (weakly, by the index object): a loader samples many
# batches of one graph, and grouping sorts all of its edges.
_INCOMING = IdentityMap()


def _incoming(edge_index: Tensor, src: Tensor, dst: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor]:
    """``(by_dst, rowptr)`` of ``edge_index`` (its rows ``src`` and ``dst``): the edge ids and row
    offsets of its CSR by destination (:func:`~pyg_ugrapher.structure.build_csr`), kept with the
    index until it dies or changes in place (an inference tensor, whose changes are not counted,
    is grouped anew every call)."""
    cached = _INCOMING.get(edge_index)
    if cached is not None and cached.version == version(edge_index) and cached.num_nodes == num_nodes:
        return cached.by_dst, cached.rowptr
    csr = build_csr(dst, src, num_nodes, num_nodes, torch.int64)
    by_dst, rowptr = csr.eid, csr.rowptr
    if version(edge_index) is not None:
        _INCOMING[edge_index] = _Incoming(version(edge_index), num_nodes, by_dst, rowptr)
    return by_dst, rowptr


def neighbor_sample(
    edge_index: Tensor,
    num_nodes: int,
    seeds: Tensor,
    num_neighbors: Sequence[int],
    *,
    seed: int = 0,
) -> Tuple[Tensor, Tensor]:
    r"""The graph of one mini-batch as PyG's ``NeighborLoader`` samples it, without pyg-lib.

    From the :obj:`seeds`, hop :math:`k` keeps up to ``num_neighbors[k]`` incoming edges of every
    node reached so far for the first time (all of them when it has fewer), drawn uniformly without
    replacement; the sources of the kept edges are the next hop's nodes. Like ``NeighborLoader``'s
    batches, nodes are numbered seeds first, then in the order hops reached them.

    Args:
        edge_index (Tensor): ``[2, E]`` edges of the whole graph (row 0 = source).
        num_nodes (int): Number of nodes of the whole graph.
        seeds (Tensor): Distinct ids of the batch's seed nodes.
        num_neighbors (Sequence[int]): Edges kept per node and hop.
        seed (int, optional): Seed of the generator. (default: :obj:`0`)

    Returns:
        ``(edge_index, node_ids)``: the batch's edges over its own numbering and the whole graph's
        id of each batch node (the first ``len(seeds)`` are the seeds). The sampler records the
        index's bounds and self loops (:func:`pyg_ugrapher.structure.note_checked`), so that our
        layers build its graph without waiting for the device to check them.

    The whole graph's edges are grouped by destination once per ``edge_index`` object (a sort of
    every edge) and kept with it, ``E + N`` integers, until it dies or changes in place: the
    later batches of one graph cost their own edges, not the graph's.
    """
    num_nodes = _check_size("num_nodes", num_nodes)
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError("Argument 'edge_index' must be a tensor of shape [2, E]")
    if not isinstance(seeds, Tensor) or seeds.dim() != 1 or seeds.numel() == 0:
        raise ValueError("Argument 'seeds' must be a non-empty 1-D tensor of node ids")
    if int(seeds.min()) < 0 or int(seeds.max()) >= num_nodes or seeds.unique().numel() != seeds.numel():
        raise ValueError(f"Argument 'seeds' must hold distinct ids in [0, {num_nodes})")
    fanouts = [_check_size("num_neighbors", k) for k in num_neighbors]
    device = edge_index.device
    generator = _generator(seed, device)
    src, dst = edge_index[0].long(), edge_index[1].long()
    by_dst, rowptr = _incoming(edge_index, src, dst, num_nodes)
    reached = torch.zeros(num_nodes, dtype=torch.bool, device=device)
    seeds = seeds.to(device=device, dtype=torch.long)
    reached[seeds] = True
    nodes, frontier, kept = [seeds], seeds.sort().values, []
    for fanout in fanouts:
        degree = rowptr[frontier + 1] - rowptr[frontier]
        first = torch.cumsum(degree, 0) - degree
        total = int(degree.sum())
        owner = torch.repeat_interleave(torch.arange(frontier.numel(), device=device), degree, output_size=total)
        rank_in_row = torch.arange(total, device=device) - first[owner]
        candidates = by_dst[rowptr[frontier][owner] + rank_in_row]
        # A random order inside each row (sort by random keys, then stably by row): the first
        # `fanout` of a row are a uniform sample without replacement.
        shuffled = torch.argsort(torch.rand(total, generator=generator, device=device))
        shuffled = shuffled[torch.argsort(owner[shuffled], stable=True)]
        chosen = candidates[shuffled][rank_in_row < fanout]
        kept.append(chosen)
        sources = src[chosen]
        fresh = sources[~reached[sources]].unique()
        reached[fresh] = True
        nodes.append(fresh)
        frontier = fresh
    node_ids = torch.cat(nodes)
    local = torch.full((num_nodes,), -1, dtype=torch.long, device=device)
    local[node_ids] = torch.arange(node_ids.numel(), device=device)
    edges = torch.cat(kept)
    batch = torch.stack([local[src[edges]], local[dst[edges]]])
    # The batch's bounds and self loops, recorded for the layers that build its graph: read here,
    # where the sampler waits for the device anyway, they need not wait in the training step.
    note_checked(batch, node_ids.numel(), int((src[edges] == dst[edges]).sum()))
    return batch, node_ids
