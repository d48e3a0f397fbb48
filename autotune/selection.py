"""Runtime selection: the schedule for one (graph, operator, width, dtype, device).

On a CUDA device with a trained model (the file named by the environment variable
``PYG_UGRAPHER_MODEL``, else ``autotune/models/<gpu>.json`` of the device's GPU or of the nearest
architecture shipped: :func:`model_path`), every schedule of the design space is scored by the cost
model and the lowest score wins (a predicted time, or the shipped ranking model's score, which grows
with time): one feature matrix (:func:`autotune.features.case_features`) and one walk of the model's
trees on the GPU itself (:mod:`autotune.forest`, several times faster than XGBoost's
``inplace_predict`` on the host), so an uncached selection takes well under a millisecond. XGBoost
scores on the host where the forest cannot run: a model that does not convert, or a CUDA graph being
captured. A GPU without a model of its own uses the nearest architecture's as it is (its SM count
and compute capability are features). Graphs of up to :data:`SMALL_GRAPH_EDGES` edges on a GPU get
one schedule per operator and width (:func:`autotune.heuristic.small_graph_schedule`), except those
a whole step is recorded on (:func:`_small_rule`); larger ones are scored by the model whatever
their size. From :data:`MEASURE_EDGES` edges on, where one kernel takes about a millisecond, the
model's shortlist is timed once on the call's own operands, the winner refined through its
neighbours (:func:`~triton_kernels.space.neighbours`), and the fastest wins
(:func:`select_measured`; off with ``PYG_UGRAPHER_MEASURE=0``). Elsewhere (a CPU, where kernels run
through Triton's interpreter, whose costs are nothing like a GPU's; no model file; CUDA statistics
asked for on a machine without CUDA) the documented rules of :func:`autotune.heuristic.heuristic`
decide.

Decisions are made for, and cached by, the graph's statistics rounded to a grid
(:func:`bucket`), the op, width, reduce size, dtype and device. The statistics are cached on the
graph's structure, so a repeated call costs one dictionary lookup; a new graph of similar shape (the
next mini-batch of a neighbour sampler) lands in a bucket already decided, so it costs its
statistics and a lookup, not a scoring of the design space, and runs kernels already compiled.

A partial schedule (``ParallelInfo("vertex")``, ``ParallelInfo("edge", block_f=32)``) is completed
by :func:`resolve`: the same scoring (or rules, without a model) over the schedules of the design
space that keep its strategy and the knobs it sets, cached the same way.

Threads share these caches: a scored decision is a pure function of its key (two threads that miss
at once store equal schedules), while loading a model, converting it and timing a measured
decision run under one lock (:data:`_LOCK`); see ``docs/caches.md``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import statistics
import threading
import warnings
import weakref
from pathlib import Path
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import CSR, DegreeStats, GraphStats, HasStats, csr_stats, marked_reused
from triton_kernels.space import MAX_TILE, neighbours, space

from .cost_model import CostModel
from .features import GpuInfo, case_features, gpu_info
from .forest import Forest
from .gpus import CAPABILITY, gpu_slug
from .heuristic import heuristic, small_graph_schedule
from .timing import median_ms

log = logging.getLogger(__name__)

#: The shipped models, one ``<gpu>.json`` per GPU they were trained on
#: (:func:`autotune.gpus.gpu_slug` of its name).
MODELS = Path(__file__).resolve().parent / "models"
#: Names the model file that every device uses, in place of the shipped ones.
MODEL_ENV = "PYG_UGRAPHER_MODEL"

#: On a GPU, graphs of up to this many edges get :func:`~autotune.heuristic.small_graph_schedule`:
#: their kernels take tens of microseconds, less than their statistics and a model scoring cost a
#: new graph (a sampler's mini-batch every step), and their steps are bound by host time anyway.
SMALL_GRAPH_EDGES = 1 << 18

#: On a GPU, graphs of at least this many edges have the model's few best schedules timed once per
#: (statistics bucket, op, width, dtype) (:func:`select_measured`): a kernel there takes a
#: millisecond, and the model's pick can be far off for an op unlike its training data (GAT's
#: fused backward pass, whose kernels the data does not hold).
MEASURE_EDGES = 1 << 21
#: How many program shapes :func:`select_measured` times the model's best schedule of (see
#: :func:`shortlist`).
SHORTLIST = 6
#: How many of the model's best schedules :func:`select_measured` times whatever their shape
#: (:func:`shortlist`): where the model's best shape is right, its next few schedules differ from
#: its first in tiles and warps, which it ranks less surely than shapes.
SHORTLIST_TOP = 4
#: Rounds of steps from the shortlist's winner that :func:`select_measured` times (up to 16
#: schedules a round: :func:`~triton_kernels.space.neighbours`). The shortlist's schedule of each
#: shape is the model's, and its tiles and warps can be far off for such ops.
REFINE_ROUNDS = 2
#: Only a shortlist winner that takes at least this many milliseconds is refined: each schedule
#: timed costs its compilation (a fraction of a second), and a kernel of less has little
#: left to win per call.
REFINE_MS = 0.2
#: After the search, the (at most) :data:`CONTENDERS` schedules within this fraction of the best
#: time are timed :data:`SETTLE_ROUNDS` more times each, in alternating order, and the lowest median
#: wins: one timing of each, taken while the search moves through the space, ranks schedules within a
#: few percent of each other by chance.
CONTEND_MARGIN = 0.15
CONTENDERS = 4
SETTLE_ROUNDS = 2
#: Set to ``0`` to keep the model's picks unmeasured (reproducible schedules, no timing runs).
MEASURE_ENV = "PYG_UGRAPHER_MEASURE"
#: XGBoost threads scoring a design space on the host (where the GPU forest does not run): a few
#: threads cut a scoring's time to about a third; more add little for a few hundred rows.
PREDICT_THREADS = min(4, os.cpu_count() or 1)

_CACHE: Dict[Tuple, ParallelInfo] = {}
_RESOLVED: Dict[Tuple, ParallelInfo] = {}
_MEASURED: Dict[Tuple, ParallelInfo] = {}
_BOOSTERS: Dict[Path, object] = {}
#: The shipped model of each device (by CUDA index; -1: no GPU to describe), chosen once.
_DEVICE_MODELS: Dict[int, Optional[Path]] = {}
_FORESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: Bumped by :func:`clear_cache`: callers that keep decisions of their own compare it.
generation = 0
#: Held while a model is loaded or converted, while a measured decision is timed and while the
#: caches are cleared: timings from two threads at once would include each other's kernels, and a
#: thread that asks for a decision being measured waits for it instead of timing it again.
_LOCK = threading.RLock()
_MISSING = object()


def shipped_models() -> List[str]:
    """The GPUs with a model in :data:`MODELS` (the file names' stems)."""
    return sorted(path.stem for path in MODELS.glob("*.json"))


def _newness(slug: str) -> Tuple[bool, Tuple[int, int], int, str]:
    """Orders model slugs from the oldest GPU to the newest: by compute capability, then by
    :data:`~autotune.gpus.CAPABILITY`'s order; slugs it does not know before all others."""
    known = slug in CAPABILITY
    return known, CAPABILITY.get(slug, (0, 0)), list(CAPABILITY).index(slug) if known else -1, slug


def model_for(name: str, capability: Optional[Tuple[int, int]], available: Iterable[str]) -> Optional[str]:
    """The model, of the GPU slugs ``available``, for a GPU named ``name`` (as
    ``torch.cuda.get_device_name`` gives it) of compute capability ``capability`` (``(major,
    minor)``; ``None``: unknown): its own (:func:`~autotune.gpus.gpu_slug` of ``name``); else the
    nearest architecture: a GPU of the same compute capability, then of the same major version
    (the nearest minor one first); else the newest GPU. Among equals the newest wins. ``None`` if
    nothing is available.

    A model ranks the schedules of its training GPU, and GPUs of one architecture share what
    orders schedules (warp schedulers, shared memory, atomics), whatever their memory or SM count.
    """
    available = sorted(set(available))
    if not available:
        return None
    own = gpu_slug(name)
    if own in available:
        return own
    if capability is not None:
        major, minor = capability
        known = [slug for slug in available if slug in CAPABILITY]
        same = [slug for slug in known if CAPABILITY[slug] == (major, minor)]
        if same:
            return max(same, key=_newness)
        family = [slug for slug in known if CAPABILITY[slug][0] == major]
        if family:
            return max(family, key=lambda slug: (-abs(CAPABILITY[slug][1] - minor), _newness(slug)))
    return max(available, key=_newness)


def _newest_model() -> Optional[Path]:
    slug = model_for("", None, shipped_models())
    return None if slug is None else MODELS / f"{slug}.json"


#: The newest shipped model (``None`` if none is): the model of a machine without a GPU to
#: describe, and of a GPU whose architecture no shipped model shares.
DEFAULT_MODEL = _newest_model()


def _device_index(device: Optional[Union[str, torch.device]]) -> int:
    """The CUDA index of ``device`` (default and ``cuda`` without an index: the current device);
    -1 for a CPU or on a machine without CUDA."""
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return -1
    return torch.cuda.current_device() if device.index is None else device.index


def _choose_model(index: int) -> Optional[Path]:
    """The shipped model of the GPU of CUDA index ``index`` (:func:`model_for`), logged."""
    if index < 0:
        return _newest_model()
    name, capability = torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))
    slug = model_for(name, capability, shipped_models())
    if slug is None:
        log.info("no cost model in %s: schedules on %s come from the heuristic", MODELS, name)
        return None
    path = MODELS / f"{slug}.json"
    if slug == gpu_slug(name):
        log.info("cost model for %s: %s", name, path)
    else:
        log.info(
            "cost model for %s (compute capability %d.%d): %s, the nearest shipped (none for %s)",
            name,
            *capability,
            path,
            gpu_slug(name),
        )
    return path


def model_path(device: Optional[Union[str, torch.device]] = None) -> Optional[Path]:
    """The model file :func:`select` uses on ``device`` (default: the current CUDA device):
    ``$PYG_UGRAPHER_MODEL``, else the shipped model of the device's GPU or of the nearest one
    (:func:`model_for`), chosen and logged once per device; on a CPU or a machine without CUDA,
    the newest shipped model. ``None`` when no model is shipped."""
    override = os.environ.get(MODEL_ENV)
    if override:
        return _path(override)
    index = _device_index(device)
    path = _DEVICE_MODELS.get(index, _MISSING)
    if path is _MISSING:
        with _LOCK:
            if index not in _DEVICE_MODELS:
                _DEVICE_MODELS[index] = _choose_model(index)
            path = _DEVICE_MODELS[index]
    return path


@functools.lru_cache(maxsize=64)
def _path(text: str) -> Path:
    # Every uncached selection looks its model up: parsing the path each time is not free.
    return Path(text)


def load_booster(path: Optional[Path] = None):
    """The XGBoost booster of ``path`` (default: :func:`model_path` of the current device), loaded
    once and set to :data:`PREDICT_THREADS` threads; ``None`` if there is no such file or xgboost
    is not installed (with a warning)."""
    path = model_path() if path is None else Path(path)
    if path is None:
        return None
    booster = _BOOSTERS.get(path, _MISSING)
    if booster is not _MISSING:
        return booster
    with _LOCK:
        if path in _BOOSTERS:
            return _BOOSTERS[path]
        if not path.exists():
            return None
        try:
            booster = CostModel.load(path).booster_
        except ImportError as error:
            # A GPU machine without xgboost still runs, on the heuristic's schedules.
            warnings.warn(
                f"cannot load the cost model {path} ({error}); schedules come from the heuristic",
                RuntimeWarning,
                stacklevel=2,
            )
            booster = None
        else:
            booster.set_param({"nthread": PREDICT_THREADS})
        _BOOSTERS[path] = booster
        return booster


def _gpu_booster(device: torch.device):
    """The booster of ``device``'s model (:func:`model_path`) for a decision on a GPU that this
    machine has; ``None`` otherwise (the heuristic decides) or without a model."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if device.index is None:  # the current device, whose model is load_booster's default
        return load_booster()
    path = model_path(device)
    return None if path is None else load_booster(path)


def _forest(booster) -> Optional[Forest]:
    """``booster``'s trees as a :class:`~autotune.forest.Forest`, converted once; ``None`` for a
    model that does not convert (it is scored by XGBoost)."""
    forest = _FORESTS.get(booster, _MISSING)
    if forest is not _MISSING:
        return forest
    with _LOCK:
        if booster not in _FORESTS:
            try:
                _FORESTS[booster] = Forest.from_booster(booster)
            except ValueError:
                _FORESTS[booster] = None
        return _FORESTS[booster]


def scores(booster, features: np.ndarray, device: Optional[Union[str, torch.device]] = None) -> np.ndarray:
    """``booster``'s scores of the rows of ``features``: on the GPU of ``device`` (one kernel,
    :mod:`autotune.forest`) if it is a CUDA device, no CUDA graph is being captured there and the
    model converts; by XGBoost on the host otherwise."""
    device = None if device is None else torch.device(device)
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        forest = _forest(booster)
        if forest is not None and not torch.cuda.is_current_stream_capturing():
            return forest.predict(features, device)
    return booster.inplace_predict(features, validate_features=False)


def predict_best(
    booster,
    stats: GraphStats,
    op: OpInfo,
    F: int,
    reduce_size: int,
    dtype: torch.dtype,
    gpu: GpuInfo,
    device: Optional[Union[str, torch.device]] = None,
    candidates: Optional[Sequence[ParallelInfo]] = None,
) -> ParallelInfo:
    """The schedule of the design space (or of ``candidates``) with the lowest score ``booster``
    predicts (computed on ``device``, see :func:`scores`)."""
    infos, features = case_features(stats, op, F, reduce_size, dtype, gpu, candidates)
    return infos[int(np.argmin(scores(booster, features, device)))]


def predict_ranked(
    booster,
    stats: GraphStats,
    op: OpInfo,
    F: int,
    reduce_size: int,
    dtype: torch.dtype,
    gpu: GpuInfo,
    device: Optional[Union[str, torch.device]] = None,
) -> List[ParallelInfo]:
    """The schedules of the design space by the score ``booster`` predicts (computed on ``device``,
    see :func:`scores`), best first."""
    infos, features = case_features(stats, op, F, reduce_size, dtype, gpu)
    return [infos[int(i)] for i in np.argsort(scores(booster, features, device), kind="stable")]


def _octaves(value: float) -> float:
    return 0.0 if value <= 0 else 2.0 ** round(math.log2(value))


def _bucket_degrees(degrees: DegreeStats) -> DegreeStats:
    skew = math.copysign(_octaves(1 + abs(degrees.skew)) - 1, degrees.skew)
    return DegreeStats(
        _octaves(degrees.mean),
        _octaves(degrees.std),
        _octaves(degrees.max),
        skew,
        round(degrees.top1_fraction, 1),
        round(degrees.isolated_fraction, 1),
    )


@functools.lru_cache(maxsize=4096)
def bucket(stats: GraphStats) -> GraphStats:
    """``stats`` rounded to a grid: sizes and degree magnitudes to powers of two (at most 41% off),
    skewness likewise as ``1 + |skew|``, fractions to tenths.

    Mini-batches of one neighbour sampler differ by a few percent in every statistic: 40 batches of
    a two-hop sampler (512 seeds, fan-out 10) over a power-law graph fell into 2 buckets (into 7
    with half-octave steps), so they share one decision and one compiled kernel per bucket instead
    of one per batch. The price, on the model's own training data, is about one percent more time
    for the chosen schedules against those chosen with exact statistics."""
    return GraphStats(
        round(_octaves(stats.num_rows)),
        round(_octaves(stats.num_cols)),
        round(_octaves(stats.num_edges)),
        _bucket_degrees(stats.rows),
        _bucket_degrees(stats.cols),
    )


def _stats(graph: Union[CSR, GraphStats, HasStats]) -> GraphStats:
    if isinstance(graph, GraphStats):
        return graph
    if isinstance(graph, CSR):
        return csr_stats(graph)
    return graph.stats()


def select(
    graph: Union[CSR, GraphStats, HasStats],
    op: OpInfo,
    F: int,
    dtype: torch.dtype = torch.float32,
    *,
    reduce_size: int = 1,
    device: Optional[Union[str, torch.device]] = None,
) -> ParallelInfo:
    """The schedule for ``op`` with ``F`` message features (flat) on ``graph``.

    Args:
        graph: a GraphTensor, one of its CSRs, or precomputed statistics.
        op: the operator.
        F: message features per edge (for ``dot``, the summed features times the outputs).
        dtype: the operands' dtype.
        reduce_size: features summed into one output (``C`` for ``dot``, else 1).
        device: where it runs; default: the graph's device (CUDA if the statistics are given).

    On a GPU, graphs of up to :data:`SMALL_GRAPH_EDGES` edges get
    :func:`~autotune.heuristic.small_graph_schedule` (no statistics), except the sorted structures
    of graphs a whole step is recorded on (:func:`_small_rule`); other graphs whose statistics
    fall into one :func:`bucket` get the same schedule.
    """
    if isinstance(F, bool) or not isinstance(F, int) or F < 1:
        raise ValueError(f"F: must be a positive int, got {F!r}")
    if device is None:
        device = getattr(graph, "device", "cuda")
    device = torch.device(device)
    # Statistics alone default to CUDA: on a machine without one, there is no GPU to describe.
    on_gpu = device.type == "cuda"
    if _small_rule(graph, device):
        return small_graph_schedule(op, F)
    stats = bucket(_stats(graph))
    key = (stats, op, F, reduce_size, dtype, device)
    choice = _CACHE.get(key)
    if choice is None:
        booster = _gpu_booster(device)
        # The model decides at every size: on large graphs too its choices run faster than the
        # heuristic's.
        if booster is None:
            choice = heuristic(stats, op, F, on_gpu)
        else:
            choice = predict_best(booster, stats, op, F, reduce_size, dtype, gpu_info(device), device)
        _CACHE[key] = choice
    return choice


def completions(partial: ParallelInfo, op: OpInfo, F: int) -> List[ParallelInfo]:
    """The schedules of the design space for ``op`` with ``F`` message features that ``partial``
    admits (its strategy and every knob it sets; a ``block_f`` wider than ``F`` narrowed first).
    Where none does (a knob off the space's grid, such as ``block_v=128``), the space's schedules
    of its strategy with its knobs put in, those still valid; the list may then be empty."""
    partial = partial.narrowed_for(F)[0]
    own = [info for info in space(op, F) if info.strategy == partial.strategy]
    admitted = [info for info in own if partial.admits(info)]
    if admitted:
        return admitted
    found: Dict[ParallelInfo, None] = {}
    for info in own:
        try:
            found.setdefault(info.with_knobs(**partial.knobs))
        except ValueError:  # its tile with the fixed knobs over the register budget
            continue
    return list(found)


def fill(partial: ParallelInfo, base: ParallelInfo) -> ParallelInfo:
    """``partial``'s knobs, the unset ones taken from ``base`` (a complete schedule of its strategy),
    those of them that size the tile halved until it fits the design space's :data:`MAX_TILE`
    (or cannot shrink more), and a group's unset size or edge block fitted to the other: a
    complete schedule whenever ``partial`` is valid."""
    knobs = {**base.knobs, **partial.knobs}
    free = [name for name in ("block_f", "block_e", "block_v") if name in partial.unset_knobs]
    while math.prod(knobs.get(name, 1) for name in ("block_v", "block_e", "block_f")) > MAX_TILE:
        shrinkable = [name for name in free if knobs[name] > 1]
        if not shrinkable:
            break
        largest = max(shrinkable, key=knobs.get)
        knobs[largest] //= 2
    if partial.strategy == "group" and knobs["group_size"] < knobs["block_e"]:
        if partial.group_size is None:
            knobs["group_size"] = knobs["block_e"]
        else:  # block_e is unset: ParallelInfo rejects a group smaller than an edge block set with it
            knobs["block_e"] = 1 << (knobs["group_size"].bit_length() - 1)
    return ParallelInfo(partial.strategy, **knobs)


def resolve(
    graph: Union[CSR, GraphStats, HasStats],
    op: OpInfo,
    F: int,
    partial: ParallelInfo,
    dtype: torch.dtype = torch.float32,
    *,
    reduce_size: int = 1,
    device: Optional[Union[str, torch.device]] = None,
) -> ParallelInfo:
    """The complete schedule for ``op`` with ``F`` message features on ``graph`` that keeps the
    strategy and every knob ``partial`` sets: what a user's ``ParallelInfo("vertex", block_f=32)``
    runs as.

    A ``block_f`` wider than ``F`` is narrowed first (:meth:`ParallelInfo.narrowed_for`; the
    runtime warns about it). With a model (where :func:`select` would use one) the
    :func:`completions` are scored as :func:`select` scores the whole space, and the best wins;
    without one, or where there are no completions, :func:`~autotune.heuristic.heuristic`'s schedule
    of the strategy, with ``partial``'s knobs put in (:func:`fill`). A complete ``partial`` is
    returned as it is. Unlike :func:`select`, small GPU graphs are decided from their statistics
    too (the small-graph rule has one strategy). Cached per statistics bucket, op, width, reduce
    size, dtype, device and ``partial``.
    """
    if isinstance(F, bool) or not isinstance(F, int) or F < 1:
        raise ValueError(f"F: must be a positive int, got {F!r}")
    if not isinstance(partial, ParallelInfo):
        raise TypeError(f"partial: expected a ParallelInfo, got {type(partial).__name__}")
    partial = partial.narrowed_for(F)[0]
    if partial.is_complete:
        return partial
    device = torch.device(device or getattr(graph, "device", "cuda"))
    on_gpu = device.type == "cuda"
    stats = bucket(_stats(graph))
    key = (stats, op, F, reduce_size, dtype, device, partial)
    choice = _RESOLVED.get(key)
    if choice is None:
        booster = _gpu_booster(device)
        candidates = [] if booster is None else completions(partial, op, F)
        if candidates:
            choice = predict_best(booster, stats, op, F, reduce_size, dtype, gpu_info(device), device, candidates)
        else:
            rule = heuristic(stats, op, F, on_gpu, partial.strategy)
            choice = rule if partial.admits(rule) else fill(partial, rule)
        _RESOLVED[key] = choice
    return choice


def chooser(graph: Union[CSR, GraphStats, HasStats], device: Union[str, torch.device], partial: bool = False) -> str:
    """What picks a schedule of a call on ``graph`` on ``device`` (``partial``: the knobs a partial
    schedule leaves unset, :func:`resolve`; else the whole schedule, :func:`select`):
    ``"small-graph rule"``, ``"cost model"`` or ``"heuristic"``."""
    device = torch.device(device)
    if not partial and _small_rule(graph, device):
        return "small-graph rule"
    return "heuristic" if _gpu_booster(device) is None else "cost model"


def graph_independent(graph: Union[CSR, GraphStats, HasStats], device: Union[str, torch.device]) -> bool:
    """Whether the automatic schedule of an op on ``graph`` on ``device`` depends only on the op,
    its width and dtype (:func:`select`'s small GPU graphs, none of them measured), so a decision
    made on one such graph holds on all of them."""
    return _small_rule(graph, device) and not measures(graph, device)


def _small_gpu_graph(num_edges: int, device: Union[str, torch.device]) -> bool:
    """Whether :func:`select` gives a graph of ``num_edges`` edges on ``device`` the small-graph
    schedules (the one rule that :func:`graph_independent` and :func:`reads_user_order` follow): up
    to :data:`SMALL_GRAPH_EDGES` edges, or any size while a CUDA graph is being captured, where the
    statistics a schedule of a larger graph reads would wait for the GPU (a graph whose structures
    were built before the capture keeps the decisions made then)."""
    if torch.device(device).type != "cuda":
        return False
    # No capture is under way where CUDA was never initialised (nor asked, for tests that fake it).
    return num_edges <= SMALL_GRAPH_EDGES or _capturing()


def _capturing() -> bool:
    """Whether a CUDA graph is being captured (never where CUDA was not initialised, nor asked, for
    tests that fake it)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _small_rule(graph: Union[CSR, GraphStats, HasStats], device: Union[str, torch.device]) -> bool:
    """Whether :func:`select` gives ``graph`` the small-graph schedules: a small GPU graph
    (:func:`_small_gpu_graph`) unless its sorted structure is marked as one a whole step is recorded
    on (:func:`~pyg_ugrapher.structure.marked_reused`), where kernel time is what a replay costs,
    and no CUDA graph is being captured (its statistics would wait for the GPU; the decisions made
    in the recording's warm-up hold in it). Eager steps on small graphs are bound by host time,
    which the model's schedules (more launches for GAT's softmax, for one) do not lower."""
    if not _small_gpu_graph(graph.num_edges, device):
        return False
    if isinstance(graph, CSR) and not graph.user_order and marked_reused(graph.rowptr):
        return _capturing()
    return True


def reads_user_order(num_edges: int, device: Union[str, torch.device]) -> bool:
    """Whether the automatic schedules on a graph of ``num_edges`` edges on ``device`` read its
    edges in the user's order: on a GPU, a graph of :func:`select`'s small-graph schedules, which
    are edge-parallel and combine every row by atomics, so its structure skips the sort
    (:meth:`~pyg_ugrapher.GraphTensor.structure`; sorting both directions is a visible share of a
    new mini-batch graph's host time)."""
    return _small_gpu_graph(num_edges, device)


def measures(graph: Union[CSR, GraphStats, HasStats], device: Union[str, torch.device]) -> bool:
    """Whether a call on ``graph`` on ``device`` has its schedule picked by :func:`select_measured`:
    a GPU graph of at least :data:`MEASURE_EDGES` edges, unless ``$PYG_UGRAPHER_MEASURE`` is ``0``
    or a CUDA graph is being captured (nothing may be timed then)."""
    return (
        torch.device(device).type == "cuda"
        and graph.num_edges >= MEASURE_EDGES
        and os.environ.get(MEASURE_ENV, "1") != "0"
        and torch.cuda.is_available()
        and not torch.cuda.is_current_stream_capturing()
    )


def shortlisted(
    ranked: Iterable[ParallelInfo], fallback: ParallelInfo, k: int = SHORTLIST, top: int = SHORTLIST_TOP
) -> List[ParallelInfo]:
    """Of the schedules ``ranked`` (best-scored first), those worth timing, in that order: the best
    of each program shape (strategy and rows per program) for the ``k`` best shapes, and the
    ``top`` best whatever their shape; then ``fallback`` if it is not among them.

    One per shape: where the model is far off (GAT's fused backward, unlike its training data),
    its best few schedules differ only in feature tiles and warps and are off together, while the
    best sampled ones had another program shape. The ``top`` best as well: where its best shape is
    right, the best tiles and warps of that shape are often its second to fourth."""
    listed: List[ParallelInfo] = []
    shapes: Set[Tuple[str, Optional[int]]] = set()
    for rank, info in enumerate(ranked):
        if len(shapes) == k and rank >= top:
            break
        shape = (info.strategy, info.block_v)
        new_shape = shape not in shapes and len(shapes) < k
        if new_shape:
            shapes.add(shape)
        if new_shape or rank < top:
            listed.append(info)
    return list(dict.fromkeys(listed + [fallback]))


def shortlist(
    graph: Union[CSR, GraphStats, HasStats],
    op: OpInfo,
    F: int,
    dtype: torch.dtype = torch.float32,
    *,
    reduce_size: int = 1,
    device: Optional[Union[str, torch.device]] = None,
    k: int = SHORTLIST,
    top: int = SHORTLIST_TOP,
) -> List[ParallelInfo]:
    """The schedules worth timing on ``graph``: :func:`shortlisted` of the cost model's ranking of
    the design space, with :func:`select`'s heuristic fallback (without a model: that alone)."""
    device = torch.device(device or getattr(graph, "device", "cuda"))
    stats = bucket(_stats(graph))
    booster = _gpu_booster(device)
    fallback = heuristic(stats, op, F, device.type == "cuda")
    if booster is None:
        return [fallback]
    ranked = predict_ranked(booster, stats, op, F, reduce_size, dtype, gpu_info(device), device)
    return shortlisted(ranked, fallback, k, top)


def _cuda_ms(run: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``run`` on the current CUDA stream after one
    untimed call (which compiles its kernel), each behind a GPU busy-wait and with a cold L2 cache:
    :func:`autotune.timing.cuda_ms`, whose documentation says why a ranking of kernels needs both."""
    return median_ms(run, warmup=1, reps=repeats)


def fastest(
    candidates: Sequence[ParallelInfo],
    run: Callable[[ParallelInfo], object],
    repeats: int = 3,
    timer: Optional[Callable[[Callable[[], object], int], float]] = None,
    neighbours_of: Optional[Callable[[ParallelInfo], Sequence[ParallelInfo]]] = None,
    rounds: int = 0,
    refine_above: float = 0.0,
) -> ParallelInfo:
    """The candidate whose ``run(candidate)`` takes least time (``timer(call, repeats)``, default:
    CUDA events, median of ``repeats`` after a warm-up call), then, if that time is at least
    ``refine_above``, for up to ``rounds`` rounds the fastest of the winner's ``neighbours_of``
    while one of them beats it (a hill climb; each schedule is timed once); the winner and those
    timed close to it are then timed again (:func:`_settled`). A candidate whose run
    raises (a kernel over the GPU's resources) is left out; if every one does, the first is
    returned, and running it raises where the caller can see why."""
    if len(candidates) == 1 and (not rounds or neighbours_of is None):
        return candidates[0]
    timer = timer or _cuda_ms
    times: Dict[ParallelInfo, float] = {}

    def time_each(schedules: Sequence[ParallelInfo]) -> None:
        for schedule in schedules:
            if schedule in times:
                continue
            try:
                times[schedule] = timer(lambda: run(schedule), repeats)
            except Exception:  # noqa: BLE001 - a failing candidate is not a choice, not an error
                times[schedule] = math.inf

    time_each(candidates)
    best = min(times, key=times.get)
    if times[best] == math.inf:
        return candidates[0]
    if neighbours_of is None or times[best] < refine_above:
        return _settled(best, times, run, timer, repeats)
    for _ in range(rounds):
        time_each(neighbours_of(best))
        stepped = min(times, key=times.get)
        if stepped == best:
            break
        best = stepped
    return _settled(best, times, run, timer, repeats)


def _settled(
    best: ParallelInfo,
    times: Dict[ParallelInfo, float],
    run: Callable[[ParallelInfo], object],
    timer: Callable[[Callable[[], object], int], float],
    repeats: int,
) -> ParallelInfo:
    """Of ``best`` and the schedules timed close to it (:data:`CONTEND_MARGIN`), the one with the
    lowest median over its first time and :data:`SETTLE_ROUNDS` more, taken in alternating order
    so that a drift of the GPU's speed during the rounds favours none."""
    contenders = sorted((s for s in times if times[s] <= times[best] * (1 + CONTEND_MARGIN)), key=times.get)
    contenders = contenders[:CONTENDERS]
    if len(contenders) < 2:
        return best
    samples = {schedule: [times[schedule]] for schedule in contenders}
    for turn in range(SETTLE_ROUNDS):
        for schedule in contenders if turn % 2 else contenders[::-1]:
            samples[schedule].append(timer(lambda: run(schedule), repeats))
    return min(contenders, key=lambda schedule: statistics.median(samples[schedule]))


def select_measured(
    graph: Union[CSR, GraphStats, HasStats],
    op: OpInfo,
    F: int,
    run: Callable[[ParallelInfo], object],
    dtype: torch.dtype = torch.float32,
    *,
    reduce_size: int = 1,
    device: Optional[Union[str, torch.device]] = None,
    context: Hashable = None,
    adapt: Optional[Callable[[ParallelInfo], ParallelInfo]] = None,
    timer: Optional[Callable[[Callable[[], object], int], float]] = None,
) -> ParallelInfo:
    """:func:`select`, refined by measurement: the :func:`shortlist`'s schedules (each passed
    through ``adapt`` if given: the model scores ``op`` alone, ``run`` may run it with more work in
    the same kernel) are run by ``run(candidate)`` (which must have no side effects), and the
    :func:`fastest` of them and of up to :data:`REFINE_ROUNDS` rounds of their winner's
    :func:`~triton_kernels.space.neighbours` (if it takes :data:`REFINE_MS` or more) wins; once
    per statistics bucket, op, width, dtype, device and ``context`` (what else ``run``'s kernel
    does, e.g. an edge output written in the same pass; ``None``: nothing, and later
    :func:`select` calls for the same case return the measured choice too)."""
    device = torch.device(device or getattr(graph, "device", "cuda"))
    stats = bucket(_stats(graph))
    key = (stats, op, F, reduce_size, dtype, device)
    choice = _MEASURED.get(key + (context,))
    if choice is not None:
        return choice
    with _LOCK:
        choice = _MEASURED.get(key + (context,))
        if choice is None:
            candidates = shortlist(stats, op, F, dtype, reduce_size=reduce_size, device=device)
            if adapt is not None:
                candidates = list(dict.fromkeys(adapt(candidate) for candidate in candidates))
            # The timer's events and busy-wait go to the current device's stream: time the
            # candidates with the graph's own GPU current.
            on_its_gpu = device.type == "cuda" and device.index is not None
            with torch.cuda.device(device) if on_its_gpu else contextlib.nullcontext():
                choice = fastest(
                    candidates,
                    run,
                    timer=timer,
                    neighbours_of=lambda info: neighbours(info, op, F),
                    rounds=REFINE_ROUNDS,
                    refine_above=REFINE_MS,
                )
            _MEASURED[key + (context,)] = choice
            if context is None:
                _CACHE[key] = choice
    return choice


def forget_decisions() -> None:
    """Forget the cached schedules of :func:`select` and :func:`resolve` themselves (not the loaded
    models, nor measurements): their next call of each case decides again, as a first call does
    (what ``benchmarks.selection`` times). The runtime's decisions per graph and op stay; those
    :func:`clear_cache` renews."""
    with _LOCK:
        _CACHE.clear()
        _RESOLVED.clear()


def clear_cache() -> None:
    """Forget cached decisions, measurements, loaded models and each device's choice of model
    (after retraining, or changing the model files)."""
    global generation
    with _LOCK:
        forget_decisions()
        _MEASURED.clear()
        _BOOSTERS.clear()
        _DEVICE_MODELS.clear()
        _FORESTS.clear()
        generation += 1
