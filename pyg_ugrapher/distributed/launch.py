r"""Starting the processes: under ``torchrun``, or spawned from Python.

* :func:`init_from_env` joins the process group that ``torchrun`` describes in the environment
  (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): NCCL and the
  process's own GPU where CUDA is available, gloo and the CPU otherwise.
* :func:`spawn` starts ``world_size`` processes from Python (``torch.multiprocessing``) that meet
  through a file in a temporary folder, and runs a function in each inside its process group.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Worker(NamedTuple):
    """Where one process of a distributed run stands."""

    rank: int
    world_size: int
    local_rank: int  #: the process's index on its machine (its GPU)
    device: torch.device


def _device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_from_env(backend: Optional[str] = None) -> Worker:
    r"""Join the process group ``torchrun`` set up (or a process group of one process when the
    environment names none) and return this process's :class:`Worker`.

    Args:
        backend (str, optional): ``"nccl"`` or ``"gloo"``. (default: NCCL where CUDA is available,
            else gloo)
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend: expected 'nccl' or 'gloo', got {backend!r}")
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    device = _device(backend, local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, device_id=device if device.type == "cuda" else None
        )
    return Worker(rank, world_size, local_rank, device)


def cpu_start_method() -> str:
    r"""How :func:`spawn` starts CPU (gloo) processes that use PyG soonest: ``"forkserver"`` on a
    machine without a GPU (the server imports the libraries once, each spawned process would again);
    ``"spawn"`` on one with a GPU, where importing PyG initialises the CUDA driver, so that the
    server's children could not use CUDA, which torch's optimizers query at every step."""
    return "spawn" if torch.cuda.is_available() else "forkserver"


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    start_method: str = "spawn",
    preload: Sequence[str] = (),
) -> None:
    r"""Run ``fn(worker, *args)`` in ``world_size`` new processes, each inside its process group.

    ``fn`` must be importable by the new processes (a module-level function); an exception in
    one of them is raised here. With ``backend="nccl"`` process ``i`` uses GPU ``i``.

    Args:
        fn (Callable): The function; its first argument is the process's :class:`Worker`.
        world_size (int): The number of processes.
        args (Sequence, optional): More arguments of ``fn`` (picklable).
        backend (str, optional): ``"gloo"`` (CPU) or ``"nccl"``. (default: :obj:`"gloo"`)
        start_method (str, optional): ``"spawn"`` or ``"forkserver"``, see
            :mod:`multiprocessing` and :func:`cpu_start_method`. (default: :obj:`"spawn"`)
        preload (Sequence[str], optional): Modules the fork server imports once for all its
            processes (with ``start_method="forkserver"``; each spawned process imports its own).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend: expected 'nccl' or 'gloo', got {backend!r}")
    if start_method == "forkserver" and preload:
        mp.get_context("forkserver").set_forkserver_preload(list(preload))
    with tempfile.TemporaryDirectory(prefix="pyg_ugrapher_rendezvous_") as folder:
        init_method = "file://" + os.path.join(folder, "store")
        mp.start_processes(
            _run, args=(fn, world_size, backend, init_method, tuple(args)), nprocs=world_size, start_method=start_method
        )


def _run(
    rank: int, fn: Callable[..., Any], world_size: int, backend: str, init_method: str, args: Sequence[Any]
) -> None:
    device = _device(backend, rank)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        device_id=device if device.type == "cuda" else None,
    )
    try:
        fn(Worker(rank, world_size, rank, device), *args)
    finally:
        dist.destroy_process_group()
