"""A pytest plugin that runs PyG's own tests on :mod:`pyg_ugrapher.nn`'s layers.

    python -m pytest -p benchmarks.pyg_tests_plugin <pyg>/test/nn/conv/test_gcn_conv.py

PyG's test modules import their layer with ``from torch_geometric.nn import GCNConv``, which reads
the attribute of the package when the test module is imported, at collection. ``pytest_configure``
runs before collection, so replacing the attributes of ``torch_geometric.nn`` and
``torch_geometric.nn.conv`` there hands every test module our class under PyG's name. The modules
that define PyG's layers (``torch_geometric.nn.conv.gcn_conv``, ...) keep theirs: PyG's other code
(models, ``gcn_norm``, ...) still sees its own. ``pytest_unconfigure`` puts PyG's classes back.

:data:`MODULES` and :data:`REPLACEMENTS` are the whole configuration; a plugin for other classes
calls :func:`replace` and :func:`restore` with its own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Dict, Sequence, Tuple

import torch_geometric.nn
import torch_geometric.nn.conv

import pyg_ugrapher.nn

#: The modules whose attributes PyG's tests import the layers from.
MODULES: Tuple[ModuleType, ...] = (torch_geometric.nn, torch_geometric.nn.conv)
#: Class name -> our class that takes its place.
REPLACEMENTS: Dict[str, type] = {name: getattr(pyg_ugrapher.nn, name) for name in pyg_ugrapher.nn.__all__}

Saved = Dict[Tuple[str, str], object]
_saved: Saved = {}


def replace(modules: Sequence[ModuleType], replacements: Dict[str, type]) -> Saved:
    """Sets every ``module.name`` to ``replacements[name]``; returns what was there, to :func:`restore`."""
    saved: Saved = {}
    for module in modules:
        for name, cls in replacements.items():
            if not hasattr(module, name):
                raise AttributeError(f"{module.__name__} has no attribute {name!r} to replace")
            saved[module.__name__, name] = getattr(module, name)
            setattr(module, name, cls)
    return saved


def restore(modules: Sequence[ModuleType], saved: Saved) -> None:
    """Undoes :func:`replace`."""
    by_name = {module.__name__: module for module in modules}
    for (module_name, name), value in saved.items():
        setattr(by_name[module_name], name, value)


def pytest_configure(config) -> None:
    _saved.update(replace(MODULES, REPLACEMENTS))


def pytest_unconfigure(config) -> None:
    restore(MODULES, _saved)
    _saved.clear()


def pytest_report_header(config) -> str:
    return "pyg_tests_plugin: " + ", ".join(
        f"{module.__name__}.{name} -> {cls.__module__}.{cls.__qualname__}"
        for module in MODULES
        for name, cls in REPLACEMENTS.items()
    )
