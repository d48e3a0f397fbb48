"""pyg_ugrapher: uGrapher's unified graph-operator abstraction for PyTorch Geometric.

What is computed (:class:`OpInfo`), on what (:class:`GraphTensor`) and how (:class:`ParallelInfo`)
are kept apart; :func:`compute` runs any operator through Triton kernels, with a learned cost model
choosing the schedule when none is given.

The PyG-facing frontend (``MessagePassing``, ``plan``, ``nn``, ``datasets``) and ``compute`` are
imported lazily, so ``triton_kernels`` and ``autotune`` can use the core (``ir``, ``graph``,
``layout``, ``parallel``) without importing PyG, and without an import cycle.
"""
from importlib import import_module
from typing import Any

from .graph import GraphTensor
from .ir import Expr, OpInfo
from .parallel import ParallelInfo

# ``compute`` is lazy too: it needs triton_kernels, which itself imports this package's core.
_LAZY = {"compute": "ops", "MessagePassing": "message_passing", "plan": "inspect", "Plan": "inspect"}
_SUBMODULES = ("nn", "datasets", "reference", "backward", "layout", "ops")

__all__ = ["GraphTensor", "Expr", "OpInfo", "ParallelInfo", *_LAZY, *_SUBMODULES]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolved once: ``ug.compute`` is looked up on every operator call
    return value
