"""The cost model's trees as flat node arrays, scored on the GPU in one kernel.

Runtime selection scores the whole design space of a case (468-814 schedules) under the shipped
model. XGBoost does it on the host in about a millisecond or more, too slow per decision; a
:class:`Forest` hands the same trees to :func:`triton_kernels.tree_ensemble.tree_ensemble_scores`,
which walks every (schedule, tree) pair at once on the GPU. The scores are XGBoost's up to the
order of float32 additions.

Only models whose prediction is a weighted sum of their trees' leaves plus the base score convert
(gradient-boosted trees, numerical splits, one output, an objective without a link function);
:meth:`Forest.from_booster` refuses others with a ``ValueError``, and they stay on XGBoost. Trees
trained with dropout (DART: XGBoost's ``dart`` booster, which XGBoost 3.4 saves as a ``gbtree``
trained with ``rate_drop``) carry a weight each, which is folded into their leaves.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Dict, Tuple

import numpy as np
import torch
import triton
from torch import Tensor

from triton_kernels.tree_ensemble import tree_ensemble_scores

#: XGBoost objectives whose prediction is the margin itself (no sigmoid, exponential, softmax).
IDENTITY_OBJECTIVES = (
    "reg:squarederror",
    "reg:absoluteerror",
    "reg:pseudohubererror",
    "rank:pairwise",
    "rank:ndcg",
    "rank:map",
)


def _trees_and_weights(gradient_booster: dict) -> Tuple[list, list]:
    """The trees of a saved model's ``gradient_booster`` and the weight of each: 1 for plain
    gradient boosting, the dropout weights of DART (XGBoost keeps them beside the trees of a
    ``dart`` booster; XGBoost 3.4 keeps them inside the model of a ``gbtree`` trained with
    ``rate_drop``)."""
    name = gradient_booster["name"]
    if name == "gbtree":
        model = gradient_booster["model"]
        weights = model.get("weight_drop")
    elif name == "dart":
        model = gradient_booster["gbtree"]["model"]
        weights = gradient_booster.get("weight_drop")
    else:
        raise ValueError(f"booster: {name!r} models do not convert; only gbtree and dart (trees) do")
    trees = model["trees"]
    if weights is None:
        weights = [1.0] * len(trees)
    if len(weights) != len(trees):
        raise ValueError(f"booster: {len(weights)} tree weights for {len(trees)} trees")
    return trees, weights


def _depths(parents: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Each node's number of ancestors, from its parent's global number (roots: themselves)."""
    depth = np.zeros(parents.size, dtype=np.int64)
    for _ in range(parents.size):
        deeper = depth[parents] + 1
        deeper[roots] = 0
        if np.array_equal(deeper, depth):
            break
        depth = deeper
    return depth


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    """A stream of its own for scoring: waiting for the scores does not wait for the work the
    caller has queued on its stream."""
    return torch.cuda.Stream(device)


class _Staging:
    """Buffers of one GPU's scorings, reused: the rows in pinned host memory and on the device,
    the scores on the device and in pinned host memory. Copies from and to pageable memory, and
    the allocations, cost more host time than the kernel takes."""

    def __init__(self, device: torch.device, rows: int, num_features: int) -> None:
        self.rows = rows
        self.host_x = torch.empty((rows, num_features), dtype=torch.float32, pin_memory=True)
        self.host_scores = torch.empty(rows, dtype=torch.float32, pin_memory=True)
        self.x = torch.empty((rows, num_features), dtype=torch.float32, device=device)
        self.scores = torch.empty(rows, dtype=torch.float32, device=device)


class Forest:
    """Trees over ``num_features`` columns as arrays over all their nodes, numbered tree after
    tree: ``feature`` and ``threshold`` of each split (a row goes left when below it, or when
    missing and ``default_left``), ``left`` / ``right`` children (a leaf is its own), leaf
    ``value`` (0 at splits), each tree's root in ``roots``, and the ``base`` score added to the
    sum of leaves."""

    def __init__(
        self,
        feature: np.ndarray,
        threshold: np.ndarray,
        left: np.ndarray,
        right: np.ndarray,
        default_left: np.ndarray,
        value: np.ndarray,
        roots: np.ndarray,
        base: float,
        num_features: int,
    ) -> None:
        self.feature = np.asarray(feature, dtype=np.int32)
        self.threshold = np.asarray(threshold, dtype=np.float32)
        self.left = np.asarray(left, dtype=np.int32)
        self.right = np.asarray(right, dtype=np.int32)
        self.default_left = np.asarray(default_left, dtype=np.int32)
        self.value = np.asarray(value, dtype=np.float32)
        self.roots = np.asarray(roots, dtype=np.int32)
        self.base = float(base)
        self.num_features = int(num_features)
        nodes = self.feature.size
        for name in ("threshold", "left", "right", "default_left", "value"):
            if getattr(self, name).shape != (nodes,):
                raise ValueError(f"{name}: expected {nodes} entries (one per node), got {getattr(self, name).shape}")
        for name in ("left", "right", "roots"):
            array = getattr(self, name)
            if array.size and (array.min() < 0 or array.max() >= nodes):
                raise ValueError(f"{name}: node numbers must lie in [0, {nodes})")
        splits = (self.left != np.arange(nodes)) | (self.right != np.arange(nodes))
        if splits.any() and (self.feature[splits].min() < 0 or self.feature[splits].max() >= self.num_features):
            raise ValueError(f"feature: split features must lie in [0, {self.num_features})")
        parents = np.arange(nodes)
        parents[self.left[splits]] = np.flatnonzero(splits)
        parents[self.right[splits]] = np.flatnonzero(splits)
        #: Splits on the longest path from a root: the kernel's number of steps.
        self.depth = int(_depths(parents, self.roots).max(initial=0))
        self._tensors: Dict[torch.device, Tuple[Tensor, ...]] = {}
        self._staged: Dict[torch.device, _Staging] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_booster(cls, booster) -> "Forest":
        """The trees of an ``xgboost.Booster``; ``ValueError`` for a model that is not a weighted sum
        of numerical trees (see the module docstring)."""
        model = json.loads(booster.save_raw("json"))
        learner = model["learner"]
        objective = learner["objective"]["name"]
        if objective not in IDENTITY_OBJECTIVES:
            raise ValueError(
                f"booster: objective {objective!r} transforms the sum of leaves; only {IDENTITY_OBJECTIVES} convert"
            )
        trees, weights = _trees_and_weights(learner["gradient_booster"])
        params = learner["learner_model_param"]
        if int(params.get("num_target", 1)) > 1 or int(params.get("num_class", 0)) > 1:
            raise ValueError("booster: models of several outputs do not convert")
        arrays = {name: [] for name in ("feature", "threshold", "left", "right", "default_left", "value")}
        roots = []
        offset = 0
        for tree, weight in zip(trees, weights):
            left = np.asarray(tree["left_children"], dtype=np.int64)
            right = np.asarray(tree["right_children"], dtype=np.int64)
            if np.any(np.asarray(tree.get("split_type", [0]), dtype=np.int64) != 0):
                raise ValueError("booster: categorical splits do not convert")
            condition = np.asarray(tree["split_conditions"], dtype=np.float32)
            leaf = left == -1
            own = np.arange(left.size) + offset
            arrays["feature"].append(np.where(leaf, 0, np.asarray(tree["split_indices"], dtype=np.int64)))
            arrays["threshold"].append(np.where(leaf, 0.0, condition))
            arrays["left"].append(np.where(leaf, own, left + offset))
            arrays["right"].append(np.where(leaf, own, right + offset))
            arrays["default_left"].append(np.asarray(tree["default_left"], dtype=np.int64))
            # XGBoost keeps a leaf's value (learning rate applied) where a split keeps its threshold.
            arrays["value"].append(np.where(leaf, condition * np.float32(weight), 0.0))
            roots.append(offset)
            offset += left.size
        joined = {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in arrays.items()}
        base = float(str(params["base_score"]).strip("[]"))
        return cls(**joined, roots=np.asarray(roots), base=base, num_features=int(params["num_feature"]))

    def _arrays(self, device: torch.device) -> Tuple[Tensor, ...]:
        if device not in self._tensors:
            self._tensors[device] = tuple(
                torch.from_numpy(getattr(self, name)).to(device)
                for name in ("feature", "threshold", "left", "right", "default_left", "value", "roots")
            )
        return self._tensors[device]

    def _staging(self, device: torch.device, rows: int) -> _Staging:
        staging = self._staged.get(device)
        if staging is None or staging.rows < rows:
            staging = self._staged[device] = _Staging(device, triton.next_power_of_2(rows), self.num_features)
        return staging

    def predict(self, X: np.ndarray, device: torch.device) -> np.ndarray:
        """The score of each row of ``X`` (``[rows, num_features]``), computed on ``device`` (a GPU,
        or the CPU through Triton's interpreter), as a float32 array on the host."""
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.num_features:
            raise ValueError(f"X: expected a [rows, {self.num_features}] matrix, got shape {list(X.shape)}")
        device = torch.device(device)
        if device.type != "cuda":
            x = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(device)
            return tree_ensemble_scores(x, *self._arrays(device), self.depth, self.base).numpy()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        rows = X.shape[0]
        stream = _side_stream(device)
        # The staging buffers are shared: one scoring at a time (the autograd engine's device
        # thread selects too).
        with self._lock, torch.cuda.stream(stream):
            staging = self._staging(device, rows)
            host_x, host_scores = staging.host_x[:rows], staging.host_scores[:rows]
            np.copyto(host_x.numpy(), X, casting="same_kind")
            x = staging.x[:rows]
            x.copy_(host_x, non_blocking=True)
            scores = tree_ensemble_scores(x, *self._arrays(device), self.depth, self.base, out=staging.scores[:rows])
            host_scores.copy_(scores, non_blocking=True)
            stream.synchronize()
            return host_scores.numpy().copy()
