r"""Training on several GPUs (or CPU processes) with ``torch.distributed``.

Two ways, both on PyTorch's own machinery (NCCL on GPUs, gloo on CPUs, ``torchrun``):

* **Data-parallel mini-batches.** Every rank holds the graph and a replica of the model wrapped in
  :class:`torch.nn.parallel.DistributedDataParallel`, samples its own mini-batches around its
  shard of the training vertices (:func:`sample_batches`) and DDP averages the gradients.
* **A partitioned graph, full-graph training.** The vertices are split into one part per rank
  (:func:`partition_graph`); a rank holds its part's features and incoming edges
  (:class:`DistributedGraph`), and every layer fetches the remote source rows it reads through
  ``all_to_all_single`` (:func:`halo_exchange`, differentiable) before running our operators
  (:func:`layer_forward`). :func:`all_reduce_gradients` sums the gradients. Results equal training
  on the whole graph on one device; no device ever holds the whole graph's features.

See ``docs/distributed.md``; ``python -m pyg_ugrapher.distributed.example`` runs both on Cora.
"""

from .graph import DistributedGraph, NormalizedGraph
from .halo import Exchange, HaloPlan, halo_exchange, record_exchanges, with_halo
from .launch import Worker, cpu_start_method, init_from_env, spawn
from .layers import aggregate_first, all_reduce_gradients, layer_forward
from .minibatch import MiniBatch, sample_batches, seed_batches
from .partition import Partition, metis_available, partition_graph

__all__ = [
    "Partition",
    "partition_graph",
    "metis_available",
    "HaloPlan",
    "Exchange",
    "halo_exchange",
    "with_halo",
    "record_exchanges",
    "DistributedGraph",
    "NormalizedGraph",
    "layer_forward",
    "aggregate_first",
    "all_reduce_gradients",
    "MiniBatch",
    "seed_batches",
    "sample_batches",
    "Worker",
    "init_from_env",
    "spawn",
    "cpu_start_method",
]
