"""pyg_ugrapher: uGrapher's unified graph-operator abstraction for PyTorch Geometric.

What is computed (:class:`OpInfo`), on what (:class:`GraphTensor`) and how (:class:`ParallelInfo`)
are kept apart; :func:`compute` runs any operator through Triton kernels, with a learned cost model
choosing the schedule when none is given.

The PyG-facing frontend (``MessagePassing``, ``plan``, ``nn``, ``datasets``) is imported lazily, so
``triton_kernels`` and ``autotune`` can use the core without importing PyG.
"""
from importlib import import_module
from typing import Any

from .graph import GraphTensor
from .ir import Expr, OpInfo
from .ops import compute
from .parallel import ParallelInfo

_LAZY = {"MessagePassing": "message_passing", "plan": "inspect", "Plan": "inspect"}
_SUBMODULES = ("nn", "datasets", "reference", "backward", "layout")

__all__ = ["GraphTensor", "Expr", "OpInfo", "ParallelInfo", "compute", *_LAZY, *_SUBMODULES]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
