"""Functions whose global names of some functions read others instead.

A traced ``message()`` must call the trace's ``softmax`` where its module imported PyG's, and a
routed layer's ``forward()`` the graph-keeping forms of PyG's self-loop helpers: both without
changing the module the code comes from, which other code shares.
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

#: Per code object, globals and replacement table: the namespace with the replacements in place
#: (``None`` where the code reads none of the replaced functions).
_NAMESPACES: Dict[Tuple[Any, int, int], Optional[Dict[str, Any]]] = {}
_LOCK = threading.Lock()


def with_globals_replaced(function: Callable, replacements: Mapping[Any, Callable]) -> Callable:
    """``function`` (a plain function) reading ``replacements[f]`` wherever its module's globals
    hold a function ``f`` among the keys of ``replacements``, under any name its code reads; the
    same function when its code reads none of them. ``replacements`` must live as long as the
    program (a module-level table): its identity keys the namespaces made for it."""
    code = getattr(function, "__code__", None)
    if code is None:
        return function
    key = (code, id(function.__globals__), id(replacements))
    if key not in _NAMESPACES:
        replaced = {
            name: replacements[value]
            for name, value in function.__globals__.items()
            if name in code.co_names and _is_key(value, replacements)
        }
        namespace = None
        if replaced:
            namespace = dict(function.__globals__)
            namespace.update(replaced)
        with _LOCK:
            _NAMESPACES[key] = namespace
    namespace = _NAMESPACES[key]
    if namespace is None:
        return function
    # the function's own closure and defaults: functions of one code object may differ in them
    rebound = types.FunctionType(code, namespace, function.__name__, function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    rebound.__doc__ = function.__doc__
    rebound.__module__ = function.__module__
    return rebound


def _is_key(value: Any, replacements: Mapping[Any, Callable]) -> bool:
    try:
        return value in replacements
    except TypeError:  # an unhashable global
        return False


__all__ = ["with_globals_replaced"]
