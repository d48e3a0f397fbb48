r"""Leave-graphs-out evaluation of the cost model: ``python -m autotune evaluate``.

Every prediction is for a graph the model never saw, in one of two ways:

* ``--folds k`` (:func:`cross_validate`): graphs are dealt into ``k`` groups (seeded); each fold
  trains on the other graphs' rows and predicts its own;
* ``--leave-one-out real`` (:func:`leave_one_out`): each real graph of the data
  (:func:`autotune.collect.real_graphs`) is predicted by a model trained on every other graph's
  rows, real and synthetic: how the model does on a real graph it has not seen, given the corpus.

For every case (graph, operator, ``F``, dtype, GPU) with measured schedules :math:`S`:

.. math::
    \text{ratio}(c) = t_c / \min_{s \in S} t_s

is reported for these choices :math:`c`, restricted to the measured schedules:

* ``model``: the schedule with the lowest predicted time (or ranking score);
* ``static``: the one schedule that is best for the training graphs, per (message creation or
  gather, ``F``): the lowest geometric mean of the ratio over the training cases, among
  schedules measured in at least 90% of them;
* ``single``: the same, one schedule per kind for every ``F`` (the issue's "single static
  config"); message creation has none, since no schedule of its samples was measured at 90% of
  the widths, so ``single`` covers the gathers;
* ``heuristic``: :func:`autotune.heuristic.heuristic`'s choice (always measured by ``collect``);
* ``measured``: what :func:`autotune.selection.select_measured` would keep, its timings read from
  the data: the model's :func:`~autotune.selection.shortlisted` schedules (the heuristic's as the
  fallback), the fastest of them, refined through its
  :func:`~triton_kernels.space.neighbours` as the runtime refines it (a schedule the data did not
  measure counts as failing); NaN where the data has no operator text (older collections). Only
  against the exhaustive oracle does every neighbour have a time;
* ``runtime``: what :func:`autotune.selection.select` runs on a GPU:
  :func:`~autotune.heuristic.small_graph_schedule` on a graph of at most
  :data:`~autotune.selection.SMALL_GRAPH_EDGES` edges (NaN where the data did not measure it), the
  model's choice on larger graphs, ``measured`` from :data:`~autotune.selection.MEASURE_EDGES`.

``--oracle DIR`` scores against the exhaustive oracle (:func:`against_oracle`): ``DIR`` holds
collections that timed the whole design space (``collect --configs`` at least the space's size)
of some real graphs; each of them is held out in turn, the model trained on every other graph's
rows of both ``--data`` and ``DIR``, and only ``DIR``'s cases are scored, so the best measured
schedule of a case is the best of the whole space.

Summaries (``summary.csv``): the geometric mean of the ratio and the fraction of cases within
10% of the best, over all cases and over the power-law and uniform halves of the corpus
(``family``); ``sizes.csv``: the same per bin of the best time (small cases are the noisiest).
``cases.csv`` holds every case; two plots show predictions against measurements and chosen
against best times. Leaving real graphs out also writes ``graphs.csv``, ``families.csv`` and
``widths.csv``: the geometric mean, the fraction within 10% and the worst ratio per held-out
graph, per family and per ``F`` (:func:`grouped`).

Where the data measured a schedule of a case more than once (two collections of the same graphs
read together), ``stability.csv`` says how far apart the two measurements are (:func:`stability`):
the best a model can do against one measurement when it ranks like the other.

``--repeat DIR`` (with ``--oracle``) reads a second exhaustive collection of some of the oracle's
graphs, timed apart from it (another machine of the same GPU): ``stability.csv`` then compares
the oracle with it, and ``repeat.csv`` scores the held-out choices against it
(:func:`against_repeat`): whether a model's distance from the oracle is the timings' noise or
the model's own.
"""

from __future__ import annotations

import functools
import logging
import os
import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from pyg_ugrapher.ir import OpInfo
from pyg_ugrapher.parallel import ParallelInfo
from triton_kernels.space import neighbours

from .collect import read_table, real_graphs
from .features import frame_features
from .gpus import gpu_slug
from .heuristic import small_graph_schedule
from .selection import MEASURE_EDGES, REFINE_MS, REFINE_ROUNDS, SMALL_GRAPH_EDGES, fastest, shortlisted
from .train import CASE, fit, target, usable

log = logging.getLogger(__name__)

METHODS = ("model", "static", "single", "heuristic", "measured", "runtime")
#: Bin edges of the best time of a case (ms) for :func:`by_size`.
SIZE_BINS = (0.0, 0.02, 0.1, 0.5, 2.0, float("inf"))
#: A static schedule must have been measured in this fraction of its training cases.
_COVERAGE = 0.9


def assign_folds(graphs: Sequence[str], folds: int, seed: int = 0) -> Dict[str, int]:
    """Deal the graphs into ``folds`` groups at random (seeded); every fold gets one at least."""
    if folds < 2:
        raise ValueError(f"folds: needs at least 2, got {folds}")
    names = sorted(set(graphs))
    if len(names) < folds:
        raise ValueError(f"folds: {folds} folds need as many graphs, the data has {len(names)}")
    random.Random(seed).shuffle(names)
    return {name: i % folds for i, name in enumerate(names)}


def _ratios(rows: pd.DataFrame) -> pd.Series:
    """Each row's time over the best time of its case."""
    return rows["time_ms"] / rows.groupby("case")["time_ms"].transform("min")


def _with_message(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``message`` column: message creation (no gather) or not."""
    return rows.assign(message=rows["gather"] == "none")


def static_choices(train: pd.DataFrame, by: Sequence[str] = ("message", "F")) -> Dict[tuple, str]:
    """Per group of ``by`` (``message``: message creation or gather, and case columns such as
    ``F``): the schedule with the best geometric-mean ratio over ``train``, among those measured
    in :data:`_COVERAGE` of the group's cases."""
    train = _with_message(train).assign(ratio=_ratios(train))
    choices = {}
    for key, group in train.groupby(list(by)):
        cases = group["case"].nunique()
        stats = group.groupby("config")["ratio"].agg(logmean=lambda r: np.log(r).mean(), count="count")
        stats = stats[stats["count"] >= _COVERAGE * cases]
        if not stats.empty:
            choices[key] = stats["logmean"].idxmin()
    return choices


def _timed_cases(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The usable rows of ``table`` with a ``case`` number and the ``target`` of ``kind``."""
    rows = usable(table)
    rows["case"] = rows.groupby(CASE, sort=False).ngroup()
    rows["target"] = target(rows, kind)
    return rows


def cross_validate(
    table: pd.DataFrame, folds: int = 5, n_estimators: Optional[int] = None, seed: int = 0, kind: str = "rank"
) -> pd.DataFrame:
    """Held-out predictions: the rows of ``table`` that were timed, with ``target`` and ``pred``
    (the model's target ``kind`` and its held-out prediction), ``static`` and ``single`` (this
    row is its fold's static choice per width, or for every width) columns."""
    rows = _timed_cases(table, kind)
    return _predict_held_out(rows, assign_folds(rows["graph"], folds, seed), n_estimators, seed, kind)


def leave_one_out(
    table: pd.DataFrame,
    graphs: Optional[Sequence[str]] = None,
    n_estimators: Optional[int] = None,
    seed: int = 0,
    kind: str = "rank",
) -> pd.DataFrame:
    """Held-out predictions of each of ``graphs`` (default: the real graphs,
    :func:`~autotune.collect.real_graphs`) that ``table`` holds, each by a model trained on the
    rows of every other graph of ``table``: those graphs' timed rows, with the columns of
    :func:`cross_validate` (``fold``: the graph's position in the sorted list)."""
    rows = _timed_cases(table, kind)
    wanted = set(real_graphs() if graphs is None else graphs)
    held_out = sorted(wanted & set(rows["graph"]))
    if not held_out:
        raise ValueError(f"graphs: none of {sorted(wanted)} has timed rows in the data")
    if len(held_out) == rows["graph"].nunique():
        raise ValueError("graphs: every graph of the data would be held out, none left to train on")
    rows = _predict_held_out(rows, {graph: i for i, graph in enumerate(held_out)}, n_estimators, seed, kind)
    return rows[rows["fold"].notna()].reset_index(drop=True)


def against_oracle(
    table: pd.DataFrame,
    exhaustive: pd.DataFrame,
    n_estimators: Optional[int] = None,
    seed: int = 0,
    kind: str = "rank",
) -> pd.DataFrame:
    """Held-out predictions of the cases of ``exhaustive`` (collections of the whole design space
    of some real graphs): each of its real graphs predicted by a model trained on every other
    graph's rows of ``table`` and ``exhaustive``; only ``exhaustive``'s rows are returned, with the
    columns of :func:`cross_validate`."""
    graphs = sorted(set(real_graphs()) & set(exhaustive["graph"]))
    if not graphs:
        raise ValueError(f"oracle: no real graph in the exhaustive data; it holds {sorted(set(exhaustive['graph']))}")
    both = pd.concat([table.assign(exhaustive=False), exhaustive.assign(exhaustive=True)], ignore_index=True)
    rows = leave_one_out(both, graphs, n_estimators, seed, kind)
    rows = rows[rows["exhaustive"]].drop(columns="exhaustive")
    # The cases again, numbered among the exhaustive rows alone.
    rows["case"] = rows.groupby(CASE, sort=False).ngroup()
    return rows.reset_index(drop=True)


def _predict_held_out(
    rows: pd.DataFrame, fold_of: Dict[str, int], n_estimators: Optional[int], seed: int, kind: str
) -> pd.DataFrame:
    """``rows`` with ``fold`` (of ``fold_of``; NaN for graphs never held out), ``pred``,
    ``static`` and ``single``: each fold's rows predicted by a model, and judged by static choices,
    fitted on the rows of every graph outside the fold."""
    rows["fold"] = rows["graph"].map(fold_of)
    rows["pred"] = np.nan
    rows["static"] = False
    rows["single"] = False
    for fold in sorted(set(fold_of.values())):
        test = rows["fold"] == fold
        train = rows[~test]
        model = fit(train, n_estimators, seed, kind)
        rows.loc[test, "pred"] = model.predict(frame_features(rows[test]))
        held_out = _with_message(rows[test])
        for method, by in (("static", ("message", "F")), ("single", ("message",))):
            choices = static_choices(train, by)
            chosen = np.array([choices.get(key) for key in zip(*(held_out[c] for c in by))], dtype=object)
            rows.loc[test, method] = held_out["config"].to_numpy() == chosen
        log.info("fold %d: %d test rows, %d train rows", fold, int(test.sum()), len(train))
    return rows


def case_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per case: best time and each method's ratio to it (NaN where a method's schedule
    was not measured)."""
    rows = rows.assign(ratio=_ratios(rows))
    best = rows.groupby("case")["time_ms"].min().rename("best_ms")
    picked = rows.loc[rows.groupby("case")["pred"].idxmin()].set_index("case")
    out = rows.groupby("case")[CASE + ["family"]].first().join(best)
    out["model"] = picked["ratio"]
    out["model_ms"] = picked["time_ms"]
    out["model_config"] = picked["config"]
    for method, mask in (("static", rows["static"]), ("single", rows["single"]), ("heuristic", rows["heuristic"] == 1)):
        out[method] = rows[mask].groupby("case")["ratio"].min()
    out["measured"] = _measured_ratios(rows)
    edges = rows.groupby("case")["num_edges"].first()
    out["runtime"] = out["model"].where(edges > SMALL_GRAPH_EDGES, _small_graph_ratios(rows))
    out["runtime"] = out["runtime"].where(edges < MEASURE_EDGES, out["measured"])
    out["candidates"] = rows.groupby("case").size()
    return out.reset_index()


_schedule = functools.lru_cache(maxsize=None)(ParallelInfo.deserialize)


def _measured_ratios(rows: pd.DataFrame) -> pd.Series:
    """Per case: the ratio of the schedule :func:`~autotune.selection.select_measured` would keep
    if each schedule it times took its measured time (the ``measured`` method of the module
    docstring); NaN for every case where ``rows`` lack ``op_text``."""
    cases = pd.Index(rows["case"].unique(), name="case")
    if "op_text" not in rows:
        return pd.Series(np.nan, index=cases)
    ratios = {}
    for case, part in rows.groupby("case", sort=False):
        part = part.sort_values("pred", kind="stable")
        ranked = [_schedule(text) for text in part["config"]]
        ratio = dict(zip(ranked, part["ratio"]))
        time_ms = dict(zip(ranked, part["time_ms"]))
        heuristic = [info for info, flag in zip(ranked, part["heuristic"]) if flag == 1]
        op, F = OpInfo.deserialize(part["op_text"].iloc[0]), int(part["F"].iloc[0])
        chosen = fastest(
            shortlisted(ranked, heuristic[0] if heuristic else ranked[0]),
            time_ms.__getitem__,
            timer=lambda call, repeats: call(),
            neighbours_of=lambda info: neighbours(info, op, F),
            rounds=REFINE_ROUNDS,
            refine_above=REFINE_MS,
        )
        ratios[case] = ratio[chosen]
    return pd.Series(ratios).reindex(cases)


def _small_graph_ratios(rows: pd.DataFrame) -> pd.Series:
    """Per case: the ratio of :func:`~autotune.heuristic.small_graph_schedule`'s choice, where
    the case measured it (the rule depends on the operator, read from ``op_text``, and ``F``)."""
    if "op_text" not in rows:
        return pd.Series(np.nan, index=pd.Index(rows["case"].unique(), name="case"))
    first = rows.groupby("case")[["op_text", "F"]].first()
    rule = {
        case: small_graph_schedule(OpInfo.deserialize(op_text), int(F)).serialize()
        for case, (op_text, F) in first.iterrows()
    }
    hit = rows[rows["config"] == rows["case"].map(rule)]
    return hit.groupby("case")["ratio"].min().reindex(first.index)


def _ratio_stats(ratio: pd.Series) -> Dict[str, float]:
    """Case count, geometric mean and fraction within 10% of the best of the ratios ``ratio``."""
    return {
        "cases": len(ratio),
        "geomean": float(np.exp(np.log(ratio).mean())) if len(ratio) else np.nan,
        "within_10pct": float((ratio <= 1.1).mean()) if len(ratio) else np.nan,
    }


def grouped(cases: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of the case column ``by`` (``graph``, ``family``, ``F``) and method: the case
    count, geometric-mean ratio, fraction within 10% of the best and worst ratio."""
    records = []
    for value, part in cases.groupby(by, sort=True):
        for method in METHODS:
            ratio = part[method].dropna()
            worst = float(ratio.max()) if len(ratio) else np.nan
            records.append({by: value, "method": method, **_ratio_stats(ratio), "worst": worst})
    return pd.DataFrame(records)


def summarize(cases: pd.DataFrame) -> pd.DataFrame:
    """Geometric-mean ratio, fraction within 10% and case count per method and corpus half."""
    records = []
    for half in ("all", "power_law", "uniform"):
        part = cases if half == "all" else cases[cases["family"] == half]
        for method in METHODS:
            records.append({"half": half, "method": method, **_ratio_stats(part[method].dropna())})
    return pd.DataFrame(records)


def by_size(cases: pd.DataFrame) -> pd.DataFrame:
    """Geometric-mean ratio and fraction within 10% per method and bin of the best time
    (:data:`SIZE_BINS`), over all cases."""
    bins = pd.cut(cases["best_ms"], SIZE_BINS, right=False)
    records = []
    for interval, part in cases.groupby(bins, observed=True):
        record = {"best_ms_from": interval.left, "best_ms_to": interval.right, "cases": len(part)}
        for method in METHODS:
            ratio = part[method].dropna()
            record[f"{method}_geomean"] = float(np.exp(np.log(ratio).mean())) if len(ratio) else np.nan
            record[f"{method}_within_10pct"] = float((ratio <= 1.1).mean()) if len(ratio) else np.nan
        records.append(record)
    return pd.DataFrame(records)


def timed_twice(table: pd.DataFrame) -> Optional[pd.DataFrame]:
    """The schedules of ``table`` timed successfully at least twice, indexed by case and
    ``config``: their ``first`` and ``second`` times, in the order the table lists them; ``None``
    where there are none."""
    rows = usable(table)
    key = CASE + ["config"]
    rows["run"] = rows.groupby(key, sort=False).cumcount()
    twice = rows.groupby(key, sort=False)["run"].transform("max") >= 1
    rows = rows[twice & (rows["run"] <= 1)]
    if rows.empty:
        return None
    times = rows.pivot_table(index=key, columns="run", values="time_ms", aggfunc="first")
    return times.rename(columns={0: "first", 1: "second"})[["first", "second"]]


def stability(table: pd.DataFrame) -> Optional[pd.DataFrame]:
    """Schedules measured twice: per case (of at least two of them), the schedules measured twice
    (``schedules``), the geometric mean of the larger time of each over the smaller (``spread``),
    the fraction of them whose two times are within 10% (``within_10pct``), and ``oracle``: the
    second time of the schedule best in the first measurement over the best second time, the ratio
    that a perfect model of the first measurement scores against the second. The first two
    measurements of a schedule count, in the order the data lists them. ``None`` where no schedule
    was measured twice."""
    times = timed_twice(table)
    if times is None:
        return None
    first, second = times["first"], times["second"]
    spread = np.maximum(first, second) / np.minimum(first, second)
    per_case = pd.DataFrame({"spread": spread, "first": first, "second": second}).groupby(level=CASE)
    out = per_case.apply(
        lambda case: pd.Series(
            {
                "schedules": len(case),
                "spread": float(np.exp(np.log(case["spread"]).mean())),
                "within_10pct": float((case["spread"] <= 1.1).mean()),
                "oracle": float(case["second"].loc[case["first"].idxmin()] / case["second"].min()),
            }
        )
    )
    out = out[out["schedules"] >= 2]
    return out.reset_index() if len(out) else None


def plot(rows: pd.DataFrame, cases: pd.DataFrame, out: Path, kind: str = "rank") -> List[Path]:
    """Prediction against measurement (every held-out row: the time, relative to the case mean
    for the ``relative`` target; for ``rank``, the score against the time over the case's best)
    and chosen against best time (every case); scatter plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(5.5, 5))
    if kind == "rank":
        # Scores are no times: they only order the candidates of a case.
        ax.scatter(rows["time_ms"] / rows.groupby("case")["time_ms"].transform("min"), rows["pred"], s=3, alpha=0.3)
        ax.set(
            xscale="log",
            xlabel="measured time / best of its case",
            ylabel="predicted score (lower: faster)",
            title="Held-out graphs: score vs measured",
        )
    else:
        measured, predicted = np.exp(rows["target"]), np.exp(rows["pred"])
        ax.scatter(measured, predicted, s=3, alpha=0.3)
        _diagonal(ax, measured, predicted)
        unit = "time (ms)" if kind == "log_time" else "time / geometric mean of its case"
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=f"measured {unit}",
            ylabel=f"predicted {unit}",
            title="Held-out graphs: predicted vs measured",
        )
    paths.append(_save(fig, out / "predicted_vs_measured.png"))
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for half, marker in (("power_law", "o"), ("uniform", "s")):
        part = cases[cases["family"] == half]
        ax.scatter(part["best_ms"], part["model_ms"], s=8, alpha=0.5, marker=marker, label=half)
    _diagonal(ax, cases["best_ms"], cases["model_ms"])
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="best measured time (ms)",
        ylabel="time of the model's choice (ms)",
        title="Held-out graphs: chosen vs oracle",
    )
    ax.legend()
    paths.append(_save(fig, out / "chosen_vs_oracle.png"))
    return paths


def _diagonal(ax, x: pd.Series, y: pd.Series) -> None:
    low, high = min(x.min(), y.min()), max(x.max(), y.max())
    ax.plot([low, high], [low, high], color="black", linewidth=0.8)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


#: What ``--leave-one-out`` can hold out: every real graph of the data, one at a time.
LEAVE_OUT = ("real",)
#: The files of :func:`grouped` summaries that leaving graphs out writes, by case column.
GROUPED_FILES = {"graph": "graphs.csv", "family": "families.csv", "F": "widths.csv"}


def against_repeat(cases: pd.DataFrame, both: pd.DataFrame) -> pd.DataFrame:
    """The cases of ``cases`` (:func:`case_table` of an oracle's held-out predictions) that a
    second timing of the same schedules timed too, ``both`` being the oracle's rows followed by
    the repeat's (:func:`timed_twice` pairs them): per case
    ``schedules`` (timed in both), ``model`` (the model's choice against the oracle, as in
    ``cases``), ``model_repeat`` (the repeat's time of the model's choice over the repeat's best)
    and ``oracle_repeat`` (the repeat's time of the oracle's best schedule over the repeat's best:
    what a perfect model of the oracle scores against the repeat). A ``model_repeat`` near
    ``model`` and far above ``oracle_repeat`` is the model's error, not the timings'. Only
    schedules timed successfully in both count."""
    columns = CASE + ["schedules", "model", "model_repeat", "oracle_repeat"]
    times = timed_twice(both)
    if times is None:
        return pd.DataFrame(columns=columns)
    scored = cases.set_index(CASE)
    rows = []
    for case, timed in times.reset_index().groupby(CASE, sort=False):
        if case not in scored.index:
            continue
        chosen = scored.loc[case]
        picked = timed.loc[timed["config"] == chosen["model_config"], "second"]
        if picked.empty:
            continue
        best_second = timed["second"].min()
        rows.append(
            dict(
                zip(CASE, case),
                schedules=len(timed),
                model=chosen["model"],
                model_repeat=float(picked.iloc[0] / best_second),
                oracle_repeat=float(timed["second"].loc[timed["first"].idxmin()] / best_second),
            )
        )
    return pd.DataFrame(rows, columns=columns)


def evaluate(
    data: Sequence[os.PathLike],
    out: os.PathLike,
    folds: int = 5,
    n_estimators: Optional[int] = None,
    seed: int = 0,
    kind: str = "rank",
    leave_out: Optional[str] = None,
    score_gpu: Optional[str] = None,
    oracle: Optional[Sequence[os.PathLike]] = None,
    repeat: Optional[Sequence[os.PathLike]] = None,
) -> pd.DataFrame:
    """Evaluate a model of target ``kind`` on the tables under ``data``: by ``folds``-fold
    cross-validation, or with ``leave_out="real"`` by leaving each real graph out in turn
    (:func:`leave_one_out`, which also writes the :data:`GROUPED_FILES`). With ``score_gpu`` (a
    slug, :func:`~autotune.gpus.gpu_slug`), the models still train on every GPU's rows, and only
    that GPU's held-out cases are scored: how a model trained on several GPUs' timings picks
    schedules on one of them. With ``oracle`` (collections of the whole design space of some real
    graphs), those graphs are left out in turn and only their exhaustive cases are scored
    (:func:`against_oracle`); with ``repeat`` as well (a second collection of some of those graphs'
    whole design space), the choices are also scored against it (:func:`against_repeat`,
    ``repeat.csv``). Writes ``cases.csv``, ``summary.csv``, ``sizes.csv``, the plots and, for data
    that measured schedules twice, ``stability.csv`` to ``out``; returns the summary."""
    if leave_out is not None and leave_out not in LEAVE_OUT:
        raise ValueError(f"leave_out: unknown {leave_out!r}; expected one of {LEAVE_OUT}")
    if repeat is not None and oracle is None:
        raise ValueError("repeat: a second timing of the oracle needs the oracle (oracle=...)")
    out = Path(out)
    table = read_table(data)
    scored = None
    if score_gpu is not None:
        slugs = table["gpu"].astype(str).map(gpu_slug)
        if not (slugs == score_gpu).any():
            raise ValueError(f"score_gpu: no rows of {score_gpu!r} in the data; its GPUs are {sorted(set(slugs))}")
        scored = slugs == score_gpu
    out.mkdir(parents=True, exist_ok=True)
    exhaustive = None if oracle is None else read_table(oracle)
    if exhaustive is not None:
        rows = against_oracle(table, exhaustive, n_estimators, seed, kind)
    elif leave_out is None:
        rows = cross_validate(table, folds, n_estimators, seed, kind)
    else:
        # Only the scored GPU's real graphs are held out: the others stay in every training set.
        graphs = None if scored is None else sorted(set(real_graphs()) & set(table.loc[scored, "graph"]))
        rows = leave_one_out(table, graphs, n_estimators, seed, kind)
    if scored is not None:
        rows = rows[rows["gpu"].astype(str).map(gpu_slug) == score_gpu]
    cases = case_table(rows)
    summary = summarize(cases)
    cases.to_csv(out / "cases.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    sizes = by_size(cases)
    sizes.to_csv(out / "sizes.csv", index=False)
    plot(rows, cases, out, kind)
    _show(summary, sizes)
    if leave_out is not None or exhaustive is not None:
        for column, name in GROUPED_FILES.items():
            part = grouped(cases, column)
            part.to_csv(out / name, index=False)
            _show(part[part["method"] == "model"])
    if repeat is None:
        repeated = stability(table if exhaustive is None else pd.concat([table, exhaustive], ignore_index=True))
    else:
        both = pd.concat([exhaustive, read_table(repeat)], ignore_index=True)
        repeated = stability(both)
        scored = against_repeat(cases, both)
        scored.to_csv(out / "repeat.csv", index=False)
        for column in ("model", "model_repeat", "oracle_repeat"):
            log.info(
                "%d cases timed again: %s geomean %.3f, %.0f%% within 10%%",
                len(scored),
                column,
                float(np.exp(np.log(scored[column]).mean())),
                100 * float((scored[column] <= 1.1).mean()),
            )
    if repeated is None:
        log.info("no schedule was measured twice: no stability check")
    else:
        repeated.to_csv(out / "stability.csv", index=False)
        oracle = repeated["oracle"]
        log.info(
            "stability of %d cases measured twice: oracle ratio geomean %.3f, %.0f%% within 10%%, worst %.3f",
            len(repeated),
            float(np.exp(np.log(oracle).mean())),
            100 * float((oracle <= 1.1).mean()),
            float(oracle.max()),
        )
    return summary


def _show(*frames: pd.DataFrame) -> None:
    for frame in frames:
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
