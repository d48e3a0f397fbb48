r"""Train the shipped cost model: ``python -m autotune train --data <collected> --out <model.json>``.

The features are :func:`autotune.features.frame_features` of the collected base columns of every
successfully timed row. Selection compares the candidates of one case (graph, operator, ``F``,
dtype, GPU) only, so the model need not predict times across cases. Three targets
(``--target``), compared by five-fold leave-graphs-out cross-validation
(:mod:`autotune.evaluate`: chosen / best measured time, fraction within 10% of the best):

* ``rank`` (the shipped model): pairwise ranking (XGBoost's ``rank:pairwise``, the cases as query
  groups) of the label :math:`\min(\log t - \min_{\text{case}} \log t, \log 3)`: the trees learn
  which of two candidates of a case is faster, and every candidate over 3x the best of its case
  ties with the others, so hopeless schedules do not spend the model on how hopeless they are.
  Scores grow with the label, so the lowest score is the predicted fastest, as for a time. Each
  row is paired with :data:`PAIRS_PER_ROW` random candidates of other labels of its case
  (:class:`CostModel`'s ``pairs_per_row``): XGBoost's default pairs come from the top of the
  model's ranking, here the predicted slowest candidates, so the trees would learn the slow end
  of each case and not the fast end the choice is made from;
* ``relative``: regression of :math:`\log t - \overline{\log t}_{\text{case}}`, the log time
  relative to the mean of its case;
* ``log_time``: regression of :math:`\log t` (milliseconds), a cost model proper.

The ranking chooses better than either regression, clipped at 3x the best or not. Sample weights
favouring large or fast cases and further derived features (wave quantisation, occupancy, work
per program) moved the held-out score by less than the spread between fold assignments; more trees
at a lower learning rate (:data:`PARAMS`) improved it. Against the exhaustive oracle
(``evaluate --oracle``), pairs spread over each case choose far better than the default pairs of
the top; more pairs per row (32 train five times as long), a cap of the label at 1.5x, weighting
the exhaustive cases up or the H100's down, and further derived features (waves of the programs
resident per multiprocessor, the last wave's use, index bytes per feature byte) moved the score by
no more than the spread between training seeds. Scoring hundreds of trees at selection time is
too slow for XGBoost on the host, so :func:`autotune.select` walks them on the GPU
(:mod:`autotune.forest`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd

from .collect import digest, read_table
from .cost_model import CostModel
from .features import FEATURES, frame_features

log = logging.getLogger(__name__)

#: The columns that identify a case: the rows of one case are the candidates of one selection.
CASE = ["graph", "op", "F", "dtype", "gpu"]
TARGETS = ("log_time", "relative", "rank")
#: The ``rank`` label ties every candidate slower than this multiple of its case's best.
RANK_CLIP = 3.0

#: Hyperparameters of the shipped model (LightGBM names, see :class:`CostModel`); the objective
#: follows the target (:data:`OBJECTIVE`).
PARAMS: Dict[str, object] = {
    "n_estimators": 400,
    "learning_rate": 0.1,
    "num_leaves": 63,
    "max_depth": -1,
    "min_child_samples": 5,
    "subsample": 0.9,
    "colsample_bytree": 0.9,
    "reg_lambda": 1.0,
}
#: Pairs drawn per candidate for the ``rank`` target (see the module docstring).
PAIRS_PER_ROW = 8
OBJECTIVE = {"log_time": "regression", "relative": "regression", "rank": "rank_pairwise"}


def usable(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a model learns from: timed successfully, with a positive finite time."""
    ok = (table["status"] == "ok") & np.isfinite(table["time_ms"]) & (table["time_ms"] > 0)
    return table[ok].reset_index(drop=True)


def target(rows: pd.DataFrame, kind: str = "log_time") -> np.ndarray:
    """The label of usable ``rows`` for the target ``kind`` (see the module docstring)."""
    if kind not in TARGETS:
        raise ValueError(f"target: unknown {kind!r}; expected one of {TARGETS}")
    log_time = np.log(rows["time_ms"].to_numpy())
    if kind == "log_time":
        return log_time
    per_case = pd.Series(log_time, index=rows.index).groupby([rows[c] for c in CASE])
    if kind == "relative":
        return log_time - per_case.transform("mean").to_numpy()
    return np.minimum(log_time - per_case.transform("min").to_numpy(), np.log(RANK_CLIP))


def fit(table: pd.DataFrame, n_estimators: Optional[int] = None, seed: int = 0, kind: str = "rank") -> CostModel:
    """A :class:`CostModel` of the target ``kind`` fitted on the usable rows of ``table``."""
    rows = usable(table)
    if rows.empty:
        raise ValueError("data: no successfully timed rows")
    if kind not in TARGETS:
        raise ValueError(f"kind: unknown {kind!r}; expected one of {TARGETS}")
    params = dict(PARAMS, objective=OBJECTIVE[kind], random_state=seed)
    if kind == "rank":
        params["pairs_per_row"] = PAIRS_PER_ROW
    if n_estimators is not None:
        params["n_estimators"] = n_estimators
    model = CostModel(**params)
    group = None
    if model.ranking:
        # Query groups are runs of consecutive rows: one run per case.
        case = rows.groupby(CASE, sort=False).ngroup().to_numpy()
        rows = rows.iloc[np.argsort(case, kind="stable")].reset_index(drop=True)
        group = np.bincount(case)
    model.fit(frame_features(rows), target(rows, kind), feature_name=list(FEATURES), group=group)
    model.booster_.set_attr(target=kind)
    return model


def train(
    data: Sequence[os.PathLike], out: os.PathLike, n_estimators: Optional[int] = None, seed: int = 0, kind: str = "rank"
) -> Path:
    """Fit on every table under ``data`` and save the model to ``out`` (with the target, the data's
    digest and GPUs recorded in the file)."""
    table = read_table(data)
    model = fit(table, n_estimators, seed, kind)
    model.booster_.set_attr(
        data_digest=digest(table),
        data_rows=str(len(usable(table))),
        gpus=";".join(sorted(table["gpu"].astype(str).unique())),
    )
    path = model.save_model(out)
    log.info(
        "trained on %d rows of %d graphs: %s (%.0f kB)",
        len(usable(table)),
        table["graph"].nunique(),
        path,
        path.stat().st_size / 1024,
    )
    return path
