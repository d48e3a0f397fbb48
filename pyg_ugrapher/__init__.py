"""pyg_ugrapher: uGrapher's unified graph-operator abstraction for PyTorch Geometric.

What is computed (:class:`OpInfo`), on what (:class:`GraphTensor`) and how (:class:`ParallelInfo`)
are kept apart; :func:`compute` runs any operator through Triton kernels, with a learned cost model
choosing the schedule when none is given.

Every name that needs the kernels or the tuner (``GraphTensor``, ``compute``, ``MessagePassing``,
``plan``, ``nn``, ...) is imported on first use (PEP 562), because ``triton_kernels`` and
``autotune`` import this package's bottom layer (``pyg_ugrapher.ir``, ``layout``, ``parallel``,
``structure``), and importing any module of a package runs the package's ``__init__.py`` first:
an eager ``from .graph import GraphTensor`` here would import ``triton_kernels`` while
``triton_kernels`` is importing ``pyg_ugrapher.ir``. Only the bottom layer's names are eager.
"""

from importlib import import_module
from typing import Any

from .ir import Expr, OpInfo
from .parallel import ParallelInfo

_LAZY = {
    "GraphTensor": "graph",
    "compute": "ops",
    "MessagePassing": "message_passing",
    "plan": "inspect",
    "Plan": "inspect",
    "accelerate": "acceleration",
    "RecordedStep": "recording",
    "pad_to_bucket": "recording",
}
_SUBMODULES = ("nn", "datasets", "reference", "backward", "layout", "ops")

__all__ = ["Expr", "OpInfo", "ParallelInfo", *_LAZY, *_SUBMODULES]
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
