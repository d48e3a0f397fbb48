"""Schedule selection for pyg_ugrapher operators: features, data collection, cost model, runtime
selection. Imports no frontend code (``pyg_ugrapher.nn``, ``MessagePassing``) and no PyG."""
from .heuristic import heuristic
from .selection import select

__all__ = ["heuristic", "select"]
