"""Schedule selection for pyg_ugrapher operators: features, data collection, cost model, runtime
selection. Imports no frontend code (``pyg_ugrapher.nn``, ``MessagePassing``) and no PyG.

Names are imported lazily: ``python -m autotune collect --device cpu`` must be able to turn on
Triton's interpreter before anything imports Triton.
"""

from importlib import import_module
from typing import Any

_LAZY = {"heuristic": "heuristic", "select": "selection", "CostModel": "cost_model"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
