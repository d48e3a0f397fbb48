"""``CostModel``: gradient-boosted trees under LightGBM's scikit-learn interface, run by XGBoost.

LightGBM's names are the interface (they are what most tuning recipes use); XGBoost does the work
by default because it ships wheels everywhere and its JSON models load without the library that
wrote them being importable. ``backend="lightgbm"`` runs LightGBM itself when it is installed.

How the LightGBM arguments map to XGBoost:

=====================  ===============================================================================
LightGBM               XGBoost
=====================  ===============================================================================
``n_estimators``       boosting rounds (``num_boost_round``)
``learning_rate``      ``eta``
``num_leaves``         ``max_leaves`` with ``grow_policy="lossguide"`` (leaf-wise growth, as LightGBM)
``max_depth``          ``max_depth``; LightGBM's ``-1`` (no limit) is XGBoost's ``0``
``min_child_samples``  ``min_child_weight``: the hessian sum in a leaf, which is the sample count for the
                       squared error (exact there, approximate for the other objectives)
``subsample``          ``subsample`` (LightGBM only bags with ``subsample_freq > 0``; XGBoost bags
                       every round)
``colsample_bytree``   ``colsample_bytree``
``reg_lambda``         ``lambda`` (L2 on leaf values); ``reg_alpha`` is ``alpha``
``objective``          ``regression`` (``l2``): ``reg:squarederror``; ``regression_l1`` (``l1``):
                       ``reg:absoluteerror``; ``huber``: ``reg:pseudohubererror``; ``lambdarank``:
                       ``rank:ndcg`` (integer relevance labels, higher is better); ``rank_pairwise``
                       (XGBoost only, LightGBM has no such objective): ``rank:pairwise``, which only
                       compares labels within a group, so any real label works and a higher label
                       gets a higher score (``eval_set`` scores: the ranking ``auc``, the fraction of
                       pairs in the right order)
``random_state``       ``seed`` (``None``: 0)
``n_jobs``             ``nthread`` (``None`` or ``-1``: all cores)
``pairs_per_row``      (XGBoost only, LightGBM has no such sampling) ``lambdarank_pair_method="mean"``
                       with ``lambdarank_num_pair_per_sample``: each row of a query group is paired with
                       this many rows of other labels of its group, drawn at random; ``None`` keeps
                       XGBoost's default, every pair between the top 32 rows of the model's current
                       ranking (the highest scores) and the rest of their group
=====================  ===============================================================================

The ranking objectives learn an order within *query groups* (LightGBM's ``group``: the sizes of
runs of consecutive rows, here the candidates of one selection) and predict scores that only
compare within a group. Which pairs the gradients come from matters when the rows that count
are not the highest-scored ones: a cost ranked with the lowest score best is better learnt from
``pairs_per_row`` pairs spread over the whole group than from the default pairs of its top
(highest-scored, slowest) rows.

Example::

    >>> model = CostModel(n_estimators=200, num_leaves=31).fit(X, np.log(time_ms))
    >>> ranker = CostModel(objective="rank_pairwise").fit(X, np.log(time_ms), group=[24, 20, 31])
    >>> model.save_model("autotune/models/h100.json")
    >>> CostModel.load("autotune/models/h100.json").predict(X)
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

OBJECTIVES = {
    "regression": "reg:squarederror",
    "l2": "reg:squarederror",
    "regression_l1": "reg:absoluteerror",
    "l1": "reg:absoluteerror",
    "huber": "reg:pseudohubererror",
    "lambdarank": "rank:ndcg",
    "rank_pairwise": "rank:pairwise",
}
#: Objectives that rank rows within query groups (``fit(..., group=...)``).
RANKING = ("lambdarank", "rank_pairwise")
BACKENDS = ("xgboost", "lightgbm")
#: Booster attribute holding the constructor arguments (so that a loaded model reports them).
_PARAMS_ATTR = "cost_model_params"
_FEATURES_ATTR = "cost_model_features"

ArrayLike = Union[np.ndarray, Any]


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: must be at least {low}, got {value}")
    return int(value)


def _check_float(name: str, value: Any, low: float, high: float, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a float, got {type(value).__name__}")
    if not (low < value if open_low else low <= value) or value > high:
        bracket = "(" if open_low else "["
        raise ValueError(f"{name}: must lie in {bracket}{low}, {high}], got {value}")
    return float(value)


def _matrix(X: ArrayLike) -> Tuple[np.ndarray, Optional[List[str]]]:
    """``X`` as a 2-D float32 array, and its column names if it is a DataFrame."""
    names = [str(c) for c in X.columns] if hasattr(X, "columns") else None
    array = np.asarray(X, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"X: expected a 2-D matrix, got shape {list(array.shape)}")
    return array, names


class CostModel:
    """Gradient-boosted trees (regression or ranking) with LightGBM's constructor arguments (see the module
    docstring for their XGBoost meaning).

    Args:
        n_estimators: boosting rounds.
        learning_rate: shrinkage of each tree.
        num_leaves: most leaves per tree.
        max_depth: most depth per tree, ``-1`` for no limit.
        min_child_samples: fewest samples in a leaf.
        subsample: fraction of rows drawn for each tree.
        colsample_bytree: fraction of features drawn for each tree.
        reg_lambda: L2 regularisation of leaf values.
        reg_alpha: L1 regularisation of leaf values.
        objective: ``"regression"``, ``"regression_l1"``, ``"huber"``, or a ranking objective:
            ``"lambdarank"`` or ``"rank_pairwise"`` (XGBoost only).
        random_state: seed.
        n_jobs: threads (``None`` or ``-1``: all cores).
        backend: ``"xgboost"`` or ``"lightgbm"``.
        pairs_per_row: ranking objectives on XGBoost: pairs drawn per row among the other labels
            of its group (``None``: pairs of the top 32 rows of the current ranking with the rest).
    """

    def __init__(
        self,
        n_estimators: int = 100,
        learning_rate: float = 0.1,
        num_leaves: int = 31,
        max_depth: int = -1,
        min_child_samples: int = 20,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        reg_lambda: float = 0.0,
        reg_alpha: float = 0.0,
        objective: str = "regression",
        random_state: Optional[int] = None,
        n_jobs: Optional[int] = None,
        backend: str = "xgboost",
        pairs_per_row: Optional[int] = None,
    ) -> None:
        self.n_estimators = _check_int("n_estimators", n_estimators, 1)
        self.learning_rate = _check_float("learning_rate", learning_rate, 0.0, 1.0, open_low=True)
        self.num_leaves = _check_int("num_leaves", num_leaves, 2)
        self.max_depth = _check_int("max_depth", max_depth, -1)
        if self.max_depth == 0:
            raise ValueError("max_depth: must be -1 (no limit) or positive, got 0")
        self.min_child_samples = _check_int("min_child_samples", min_child_samples, 0)
        self.subsample = _check_float("subsample", subsample, 0.0, 1.0, open_low=True)
        self.colsample_bytree = _check_float("colsample_bytree", colsample_bytree, 0.0, 1.0, open_low=True)
        self.reg_lambda = _check_float("reg_lambda", reg_lambda, 0.0, float("inf"))
        self.reg_alpha = _check_float("reg_alpha", reg_alpha, 0.0, float("inf"))
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: unknown {objective!r}; expected one of {sorted(OBJECTIVES)}")
        self.objective = objective
        if random_state is not None:
            random_state = _check_int("random_state", random_state, 0)
        self.random_state = random_state
        if n_jobs is not None:
            n_jobs = _check_int("n_jobs", n_jobs, -1)
        self.n_jobs = n_jobs
        if backend not in BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {BACKENDS}")
        if backend == "lightgbm" and objective == "rank_pairwise":
            raise ValueError(
                "objective: 'rank_pairwise' needs the xgboost backend (LightGBM has no pairwise "
                "objective; 'lambdarank' runs on both)"
            )
        if backend == "lightgbm":
            try:
                import lightgbm  # noqa: F401
            except ImportError as error:
                raise ImportError(
                    "backend: 'lightgbm' needs the lightgbm package (pip install lightgbm); "
                    "the default backend 'xgboost' takes the same arguments"
                ) from error
        self.backend = backend
        if pairs_per_row is not None:
            pairs_per_row = _check_int("pairs_per_row", pairs_per_row, 1)
            if objective not in RANKING or backend != "xgboost":
                raise ValueError(
                    f"pairs_per_row: samples the pairs of XGBoost's ranking objectives {RANKING}, "
                    f"not {objective!r} on {backend!r}"
                )
        self.pairs_per_row = pairs_per_row
        self.feature_names_: Optional[List[str]] = None
        self.evals_result_: Dict[str, Dict[str, List[float]]] = {}
        self._booster = None

    # -- parameters ----------------------------------------------------------------------------
    def get_params(self) -> Dict[str, Any]:
        """The constructor arguments (scikit-learn's convention)."""
        names = (
            "n_estimators",
            "learning_rate",
            "num_leaves",
            "max_depth",
            "min_child_samples",
            "subsample",
            "colsample_bytree",
            "reg_lambda",
            "reg_alpha",
            "objective",
            "random_state",
            "n_jobs",
            "backend",
            "pairs_per_row",
        )
        return {name: getattr(self, name) for name in names}

    def xgboost_params(self) -> Dict[str, Any]:
        """The XGBoost training parameters these arguments stand for."""
        params = {
            "objective": OBJECTIVES[self.objective],
            "eta": self.learning_rate,
            "max_leaves": self.num_leaves,
            "grow_policy": "lossguide",
            "max_depth": 0 if self.max_depth == -1 else self.max_depth,
            "min_child_weight": float(self.min_child_samples),
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "lambda": self.reg_lambda,
            "alpha": self.reg_alpha,
            "seed": self.random_state or 0,
            "tree_method": "hist",
            "nthread": 0 if self.n_jobs in (None, -1) else self.n_jobs,
        }
        if self.objective == "rank_pairwise":
            # The default metric (NDCG) needs integer relevance; the ranking AUC, the fraction of
            # pairs of a group in the right order, takes any label.
            params["eval_metric"] = "auc"
        if self.pairs_per_row is not None:
            params["lambdarank_pair_method"] = "mean"
            params["lambdarank_num_pair_per_sample"] = self.pairs_per_row
        return params

    @property
    def ranking(self) -> bool:
        """Whether the objective ranks within query groups (``fit`` then needs ``group``)."""
        return self.objective in RANKING

    def _lightgbm(self):
        import lightgbm

        estimator = lightgbm.LGBMRanker if self.ranking else lightgbm.LGBMRegressor
        return estimator(
            n_estimators=self.n_estimators,
            learning_rate=self.learning_rate,
            num_leaves=self.num_leaves,
            max_depth=self.max_depth,
            min_child_samples=self.min_child_samples,
            subsample=self.subsample,
            subsample_freq=1 if self.subsample < 1 else 0,
            colsample_bytree=self.colsample_bytree,
            reg_lambda=self.reg_lambda,
            reg_alpha=self.reg_alpha,
            objective=self.objective,
            random_state=self.random_state,
            n_jobs=self.n_jobs if self.n_jobs is not None else -1,
            verbose=-1,
        )

    # -- training and prediction -----------------------------------------------------------------
    def fit(
        self,
        X: ArrayLike,
        y: ArrayLike,
        eval_set: Optional[Sequence[Tuple[ArrayLike, ArrayLike]]] = None,
        feature_name: Optional[Sequence[str]] = None,
        group: Optional[ArrayLike] = None,
        eval_group: Optional[Sequence[ArrayLike]] = None,
    ) -> "CostModel":
        """Fit on ``X`` (``[n, d]``) and targets ``y`` (``[n]``); ``eval_set`` pairs are scored each
        round into :attr:`evals_result_` (``valid_0``, ``valid_1``, ... as LightGBM names them).

        A ranking objective needs ``group``: the sizes of the query groups, runs of consecutive
        rows that sum to ``n`` (and ``eval_group``, one such array per ``eval_set`` pair)."""
        X, names = _matrix(X)
        y = np.asarray(y, dtype=np.float32).reshape(-1)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"y: {y.shape[0]} targets for {X.shape[0]} rows of X")
        if X.shape[0] == 0:
            raise ValueError("X: no rows to fit")
        if not np.isfinite(y).all():
            raise ValueError("y: targets must be finite")
        names = list(feature_name) if feature_name is not None else names
        if names is not None and len(names) != X.shape[1]:
            raise ValueError(f"feature_name: {len(names)} names for {X.shape[1]} columns")
        evals = [(np.asarray(_matrix(a)[0]), np.asarray(b, dtype=np.float32).reshape(-1)) for a, b in (eval_set or [])]
        group = self._groups("group", group, X.shape[0])
        if eval_group is not None and len(eval_group) != len(evals):
            raise ValueError(f"eval_group: {len(eval_group)} groupings for {len(evals)} eval_set pairs")
        eval_groups = [
            self._groups(f"eval_group[{i}]", None if eval_group is None else eval_group[i], len(b))
            for i, (_, b) in enumerate(evals)
        ]
        self.feature_names_ = names
        if self.backend == "lightgbm":
            model = self._lightgbm()
            extra = {"group": group, "eval_group": eval_groups or None} if self.ranking else {}
            model.fit(X, y, eval_set=evals or None, **extra)
            self.evals_result_ = {k: dict(v) for k, v in getattr(model, "evals_result_", {}).items()}
            self._booster = model.booster_
            return self
        import xgboost

        def matrix(features: np.ndarray, labels: np.ndarray, sizes: Optional[np.ndarray]) -> "xgboost.DMatrix":
            data = xgboost.DMatrix(features, label=labels, feature_names=names)
            if sizes is not None:
                data.set_group(sizes)
            return data

        train = matrix(X, y, group)
        watch = [(matrix(a, b, g), f"valid_{i}") for i, ((a, b), g) in enumerate(zip(evals, eval_groups))]
        result: Dict[str, Dict[str, List[float]]] = {}
        self._booster = xgboost.train(
            self.xgboost_params(),
            train,
            num_boost_round=self.n_estimators,
            evals=watch,
            evals_result=result,
            verbose_eval=False,
        )
        self.evals_result_ = result
        return self

    def _groups(self, name: str, sizes: Optional[ArrayLike], rows: int) -> Optional[np.ndarray]:
        """Checked query-group sizes: required exactly for a ranking objective."""
        if not self.ranking:
            if sizes is not None:
                raise ValueError(f"{name}: query groups need a ranking objective {RANKING}, not {self.objective!r}")
            return None
        if sizes is None:
            raise ValueError(f"{name}: the objective {self.objective!r} ranks within query groups; pass their sizes")
        sizes = np.asarray(sizes).reshape(-1)
        if sizes.size and (not np.issubdtype(sizes.dtype, np.integer) or sizes.min() < 1):
            raise ValueError(f"{name}: group sizes must be positive ints")
        if int(sizes.sum()) != rows:
            raise ValueError(f"{name}: group sizes sum to {int(sizes.sum())}, the data has {rows} rows")
        return sizes.astype(np.int64)

    @property
    def booster_(self):
        """The trained booster (``xgboost.Booster`` or ``lightgbm.Booster``)."""
        if self._booster is None:
            raise ValueError("booster_: the model is not fitted; call fit() or CostModel.load() first")
        return self._booster

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted targets of the rows of ``X`` (for a ranking objective: scores, comparable
        between rows of one group only)."""
        booster = self.booster_
        X, _ = _matrix(X)
        expected = booster.num_features() if self.backend == "xgboost" else booster.num_feature()
        if X.shape[1] != expected:
            raise ValueError(f"X: {X.shape[1]} columns, the model was trained on {expected}")
        if self.backend == "lightgbm":
            return np.asarray(booster.predict(X), dtype=np.float32)
        return np.asarray(booster.inplace_predict(X), dtype=np.float32)

    @property
    def feature_importances_(self) -> np.ndarray:
        """Splits per feature (LightGBM's default ``importance_type="split"``), in column order."""
        booster = self.booster_
        if self.backend == "lightgbm":
            return np.asarray(booster.feature_importance("split"), dtype=np.int64)
        count = booster.num_features()
        names = booster.feature_names or [f"f{i}" for i in range(count)]
        score = booster.get_score(importance_type="weight")
        return np.array([int(score.get(name, 0)) for name in names], dtype=np.int64)

    # -- persistence ---------------------------------------------------------------------------
    def save_model(self, path: Union[str, os.PathLike]) -> Path:
        """Write the model: XGBoost JSON (``.json``) or UBJSON (``.ubj``); LightGBM text otherwise.
        The constructor arguments travel inside the file."""
        path = Path(path)
        booster = self.booster_
        path.parent.mkdir(parents=True, exist_ok=True)
        params = json.dumps(self.get_params())
        if self.backend == "lightgbm":
            booster.save_model(str(path))
            path.with_suffix(path.suffix + ".params.json").write_text(params)
            return path
        if path.suffix not in (".json", ".ubj"):
            raise ValueError(f"path: an XGBoost model is saved as .json or .ubj, got {path.name!r}")
        booster.set_attr(**{_PARAMS_ATTR: params})
        booster.save_model(str(path))
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "CostModel":
        """Read a model written by :meth:`save_model` (``.json`` / ``.ubj``: XGBoost, else
        LightGBM)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"path: no model at {path}")
        if path.suffix in (".json", ".ubj"):
            import xgboost

            booster = xgboost.Booster()
            booster.load_model(str(path))
            params = json.loads(booster.attr(_PARAMS_ATTR) or "{}")
            model = cls(**{**params, "backend": "xgboost"})
            model.feature_names_ = booster.feature_names
        else:
            import lightgbm

            booster = lightgbm.Booster(model_file=str(path))
            side = path.with_suffix(path.suffix + ".params.json")
            params = json.loads(side.read_text()) if side.exists() else {}
            model = cls(**{**params, "backend": "lightgbm"})
            model.feature_names_ = booster.feature_name()
        model._booster = booster
        return model

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"CostModel({args})"
