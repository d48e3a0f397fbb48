"""The tree-ensemble kernel (``triton_kernels.tree_ensemble``) against a walk of the same trees in
Python, on random forests and rows (missing values included), with its output poisoned first."""

import math
from typing import Dict, List

import numpy as np
import pytest
import torch

from triton_kernels.tree_ensemble import MAX_BLOCK_T, tree_ensemble_scores

FIELDS = ("feature", "threshold", "left", "right", "default_left", "value")


def random_forest(rng: np.random.Generator, num_trees: int, num_features: int, max_depth: int) -> Dict[str, np.ndarray]:
    """Trees of random shapes (a lone leaf among them) as the kernel's flat node arrays."""
    arrays: Dict[str, List] = {name: [] for name in FIELDS}
    roots = []

    def grow(depth: int) -> int:
        node = len(arrays["feature"])
        for name in FIELDS:
            arrays[name].append(0)
        if depth < max_depth and rng.random() < 0.8:
            arrays["feature"][node] = int(rng.integers(num_features))
            arrays["threshold"][node] = float(rng.normal())
            arrays["default_left"][node] = int(rng.integers(2))
            arrays["left"][node] = grow(depth + 1)
            arrays["right"][node] = grow(depth + 1)
        else:
            arrays["left"][node] = arrays["right"][node] = node
            arrays["value"][node] = float(rng.normal())
        return node

    for tree in range(num_trees):
        roots.append(grow(max_depth if tree == 0 else 0))
    dtypes = {"threshold": np.float32, "value": np.float32}
    forest = {name: np.asarray(values, dtype=dtypes.get(name, np.int32)) for name, values in arrays.items()}
    forest["roots"] = np.asarray(roots, dtype=np.int32)
    return forest


def walk(forest: Dict[str, np.ndarray], x: np.ndarray, base: float) -> np.ndarray:
    """The reference: each row down each tree, one node at a time, leaves summed in float64."""
    scores = np.full(x.shape[0], base, dtype=np.float64)
    for r, row in enumerate(x):
        for node in forest["roots"]:
            while forest["left"][node] != node:
                value = row[forest["feature"][node]]
                go_left = value < forest["threshold"][node] if not math.isnan(value) else forest["default_left"][node]
                node = forest["left"][node] if go_left else forest["right"][node]
            scores[r] += forest["value"][node]
    return scores


def _tensors(forest, device):
    return [torch.from_numpy(forest[name]).to(device) for name in FIELDS + ("roots",)]


@pytest.mark.parametrize("num_rows,num_trees,max_depth", [(1, 1, 0), (37, 5, 4), (9, MAX_BLOCK_T + 3, 3), (130, 40, 6)])
def test_scores_match_a_walk_of_the_trees(num_rows, num_trees, max_depth, device):
    """Rows not a multiple of a block, more trees than one block holds, a forest of one leaf;
    a quarter of the values missing."""
    rng = np.random.default_rng(num_rows * 1000 + num_trees)
    num_features = 7
    forest = random_forest(rng, num_trees, num_features, max_depth)
    x = rng.normal(size=(num_rows, num_features)).astype(np.float32)
    x[rng.random(x.shape) < 0.25] = np.nan
    out = torch.full((num_rows,), float("nan"), device=device)
    got = tree_ensemble_scores(torch.from_numpy(x).to(device), *_tensors(forest, device), max_depth, 0.5, out=out)
    assert got is out
    expected = walk(forest, x, 0.5)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_a_deeper_walk_stays_on_the_leaves(device):
    """Steps past a tree's depth leave its rows where they are."""
    rng = np.random.default_rng(3)
    forest = random_forest(rng, 6, 4, 3)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    got = tree_ensemble_scores(torch.from_numpy(x).to(device), *_tensors(forest, device), 11, -1.0)
    np.testing.assert_allclose(got.cpu().numpy(), walk(forest, x, -1.0), rtol=1e-5, atol=1e-5)


def test_no_rows_and_no_trees(device):
    forest = random_forest(np.random.default_rng(0), 3, 2, 2)
    empty = tree_ensemble_scores(torch.zeros(0, 2, device=device), *_tensors(forest, device), 2, 1.0)
    assert empty.shape == (0,)
    no_trees = {name: array[:0] for name, array in forest.items()}
    got = tree_ensemble_scores(torch.zeros(3, 2, device=device), *_tensors(no_trees, device), 0, 1.5)
    assert torch.equal(got.cpu(), torch.full((3,), 1.5))


def test_bad_arguments_are_named():
    forest = random_forest(np.random.default_rng(0), 2, 3, 2)
    arrays = _tensors(forest, "cpu")
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="x:"):
        tree_ensemble_scores(x.double(), *arrays, 2, 0.0)
    with pytest.raises(ValueError, match="threshold:"):
        tree_ensemble_scores(x, arrays[0], arrays[1][:-1], *arrays[2:], 2, 0.0)
    with pytest.raises(ValueError, match="left:"):
        tree_ensemble_scores(x, arrays[0], arrays[1], arrays[2].long(), *arrays[3:], 2, 0.0)
    with pytest.raises(ValueError, match="depth:"):
        tree_ensemble_scores(x, *arrays, -1, 0.0)
    with pytest.raises(ValueError, match="out:"):
        tree_ensemble_scores(x, *arrays, 2, 0.0, out=torch.zeros(5))
