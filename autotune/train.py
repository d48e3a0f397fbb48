r"""Train the shipped cost model: ``python -m autotune train --data <collected> --out <model.json>``.

The features are :func:`autotune.features.frame_features` of the collected base columns of every
successfully timed row. Two targets (``--target``):

* ``relative`` (the shipped model): :math:`\log t - \overline{\log t}_{\text{case}}`, the log
  time relative to the mean of its case (graph, operator, ``F``, dtype, GPU). Selection compares
  candidates of one case only, so nothing is lost, and the trees need not spend their splits on
  the six orders of magnitude between a small and a large graph: on the H100 data it selects
  slightly better in leave-graphs-out cross-validation (geometric mean 1.244 against 1.255);
* ``log_time``: :math:`\log t` (milliseconds), a cost model proper.
 The model is kept small
on purpose: :func:`autotune.select` scores the whole design space (700-800 schedules) per
uncached call, and a tree costs about 15 ns per scored row (XGBoost's predictor, one thread), so
60 trees keep a selection under a millisecond; larger leaves (63) make up for fewer trees.
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
TARGETS = ("log_time", "relative")

#: Hyperparameters of the shipped model (LightGBM names, see :class:`CostModel`).
PARAMS: Dict[str, object] = {"n_estimators": 60, "learning_rate": 0.2, "num_leaves": 63, "max_depth": -1,
                             "min_child_samples": 5, "subsample": 0.9, "colsample_bytree": 0.9,
                             "reg_lambda": 1.0, "objective": "regression"}


def usable(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a model learns from: timed successfully, with a positive finite time."""
    ok = (table["status"] == "ok") & np.isfinite(table["time_ms"]) & (table["time_ms"] > 0)
    return table[ok].reset_index(drop=True)


def target(rows: pd.DataFrame, kind: str = "log_time") -> np.ndarray:
    """The regression target of usable ``rows`` (see the module docstring)."""
    if kind not in TARGETS:
        raise ValueError(f"target: unknown {kind!r}; expected one of {TARGETS}")
    log_time = np.log(rows["time_ms"].to_numpy())
    if kind == "relative":
        log_time = log_time - pd.Series(log_time, index=rows.index).groupby(
            [rows[c] for c in CASE]).transform("mean").to_numpy()
    return log_time


def fit(table: pd.DataFrame, n_estimators: Optional[int] = None, seed: int = 0,
        kind: str = "relative") -> CostModel:
    """A :class:`CostModel` of the target ``kind`` fitted on the usable rows of ``table``."""
    rows = usable(table)
    if rows.empty:
        raise ValueError("data: no successfully timed rows")
    params = dict(PARAMS, random_state=seed)
    if n_estimators is not None:
        params["n_estimators"] = n_estimators
    model = CostModel(**params)
    model.fit(frame_features(rows), target(rows, kind), feature_name=list(FEATURES))
    model.booster_.set_attr(target=kind)
    return model


def train(data: Sequence[os.PathLike], out: os.PathLike, n_estimators: Optional[int] = None,
          seed: int = 0, kind: str = "relative") -> Path:
    """Fit on every table under ``data`` and save the model to ``out`` (with the target, the data's
    digest and GPUs recorded in the file)."""
    table = read_table(data)
    model = fit(table, n_estimators, seed, kind)
    model.booster_.set_attr(data_digest=digest(table), data_rows=str(len(usable(table))),
                            gpus=";".join(sorted(table["gpu"].astype(str).unique())))
    path = model.save_model(out)
    log.info("trained on %d rows of %d graphs: %s (%.0f kB)", len(usable(table)), table["graph"].nunique(),
             path, path.stat().st_size / 1024)
    return path
