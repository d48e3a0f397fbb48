r"""Mini-batches for data-parallel training: every rank samples around its own shard of seeds.

:func:`seed_batches` shards the training vertices with PyTorch's
:class:`~torch.utils.data.distributed.DistributedSampler` (one permutation per epoch shared by all
ranks, each rank taking every ``world_size``-th vertex, padded so that every rank runs the same
number of steps, which ``DistributedDataParallel`` needs) and cuts a rank's shard into batches.
:func:`sample_batches` samples the graph of each batch with
:func:`pyg_ugrapher.datasets.neighbor_sample` (what PyG's ``NeighborLoader`` does, without
pyg-lib).
"""

from __future__ import annotations

import numbers
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data.distributed import DistributedSampler

from ..datasets import neighbor_sample

_SEED_MODULUS = 2**62


class MiniBatch(NamedTuple):
    """One sampled mini-batch: the whole graph's id of each of its vertices (seeds first), its
    edges over its own numbering, and the number of seeds (the rows the loss is taken on)."""

    node_ids: Tensor
    edge_index: Tensor
    num_seeds: int


def seed_batches(
    train_nodes: Tensor,
    batch_size: int,
    epoch: int,
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    seed: int = 0,
    shuffle: bool = True,
) -> List[Tensor]:
    r"""This rank's seed vertices of one epoch, in batches of at most ``batch_size``.

    Args:
        train_nodes (Tensor): ``[T]`` ids of the training vertices.
        batch_size (int): Seeds per batch and rank.
        epoch (int): The epoch (a new permutation every epoch).
        rank (int, optional): This rank. (default: ``torch.distributed``'s)
        world_size (int, optional): The number of ranks. (default: ``torch.distributed``'s)
        seed (int, optional): Seed of the permutation, the same on every rank. (default: :obj:`0`)
        shuffle (bool, optional): Permute the vertices every epoch. (default: :obj:`True`)

    Every rank gets the same number of batches; the shards are disjoint up to the fewer than
    ``world_size`` vertices that pad the last one.
    """
    if not isinstance(train_nodes, Tensor) or train_nodes.dim() != 1:
        raise ValueError("train_nodes: expected a 1-D tensor of vertex ids")
    for name, value in (("batch_size", batch_size), ("epoch", epoch), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be positive, got {batch_size}")
    rank, world_size = _rank_and_size(rank, world_size)
    if train_nodes.numel() < world_size:
        raise ValueError(f"train_nodes: {train_nodes.numel()} vertices for {world_size} ranks")
    sampler = DistributedSampler(
        range(train_nodes.numel()), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
    )
    sampler.set_epoch(epoch)
    order = torch.tensor(list(sampler), dtype=torch.int64, device=train_nodes.device)
    return list(train_nodes[order].split(batch_size))


def sample_batches(
    edge_index: Tensor,
    num_nodes: int,
    train_nodes: Tensor,
    batch_size: int,
    num_neighbors: Sequence[int],
    epoch: int,
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    seed: int = 0,
) -> Iterator[MiniBatch]:
    r"""This rank's mini-batches of one epoch: :func:`seed_batches`, each sampled by
    :func:`~pyg_ugrapher.datasets.neighbor_sample` (``num_neighbors`` incoming edges per vertex and
    hop) with a sampling seed of its own per (epoch, batch, rank)."""
    rank, world_size = _rank_and_size(rank, world_size)
    batches = seed_batches(train_nodes, batch_size, epoch, rank=rank, world_size=world_size, seed=seed)
    for step, seeds in enumerate(batches):
        stream = (((seed * 1_000_003 + epoch) * 1_000_003 + step) * world_size + rank) % _SEED_MODULUS
        edges, node_ids = neighbor_sample(edge_index, num_nodes, seeds, num_neighbors, seed=stream)
        yield MiniBatch(node_ids, edges, seeds.numel())


def _rank_and_size(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """``rank`` and ``world_size``, each ``torch.distributed``'s where not given."""
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("rank, world_size: give both, or initialise torch.distributed")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected a value in [0, {world_size}), got {rank}")
    return int(rank), int(world_size)
