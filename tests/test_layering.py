"""Imports go one way: down the layers of ``docs/architecture.md``, and never round in a circle.

Every module of ``pyg_ugrapher``, ``triton_kernels`` and ``autotune`` is parsed (nothing is
imported), and every ``import`` statement in it is read, at module level and inside functions
alike. An import of ``a.b.c`` runs the ``__init__.py`` of ``a`` and ``a.b`` first, so it reaches
them too; a name that a package's ``__init__.py`` loads on first use (its ``_LAZY`` table or its
``_SUBMODULES``, PEP 562) reaches the module that defines it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pyg_ugrapher", "triton_kernels", "autotune")

#: The layers, bottom (0) to top (3), as ``docs/architecture.md`` draws them. A module may import
#: its own layer and the layers below. Layer 0: the IR, the schedule record and the graph-structure
#: records, and leaf utilities that import nothing of the project above them; ``pyg_ugrapher``'s
#: ``__init__.py`` is there too, since importing any of its modules runs it.
LAYER_0 = (
    "pyg_ugrapher",
    "pyg_ugrapher.ir",
    "pyg_ugrapher.layout",
    "pyg_ugrapher.parallel",
    "pyg_ugrapher.structure",
    "pyg_ugrapher.paths",
    "pyg_ugrapher.backward",
    "pyg_ugrapher.datasets",
)
#: Layers 1 and 2 are whole packages; every other module of ``pyg_ugrapher`` is layer 3.
PACKAGE_LAYERS = {"triton_kernels": 1, "autotune": 2, "pyg_ugrapher": 3}
LAYER_NAMES = {0: "IR, schedule and structure records", 1: "kernels", 2: "tuner", 3: "runtime and frontend"}


def layer_of(module: str) -> int:
    """The layer of a module of the three packages."""
    if module in LAYER_0:
        return 0
    return PACKAGE_LAYERS[module.split(".")[0]]


class Import(NamedTuple):
    """One module that an import statement reaches."""

    line: int
    target: str


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_tree() -> Dict[str, Tuple[str, bool]]:
    """``module -> (source, is a package)`` for every module of :data:`PACKAGES`."""
    return {
        module_name(path): (path.read_text(), path.name == "__init__.py")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def lazy_names(source: str) -> Dict[str, str]:
    """``name -> submodule`` that a package's ``__init__.py`` imports on first use: the entries of
    its ``_LAZY`` dictionary and of its ``_SUBMODULES`` tuple."""
    names: Dict[str, str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        value = node.value
        if node.targets[0].id == "_LAZY" and isinstance(value, ast.Dict):
            names.update({ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(value.keys, value.values)})
        elif node.targets[0].id == "_SUBMODULES" and isinstance(value, (ast.Tuple, ast.List)):
            names.update({ast.literal_eval(e): ast.literal_eval(e) for e in value.elts})
    return names


def ancestors(module: str) -> List[str]:
    """``a`` and ``a.b`` for ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(module: str, source: str, is_package: bool, tree: Dict[str, Tuple[str, bool]]) -> Iterator[Import]:
    """The modules of :data:`PACKAGES` that each import statement of ``module`` reaches, wherever
    it stands: the imported module, its packages' ``__init__.py`` (but not ``module``'s own
    packages, already being imported), and the module a lazily imported name comes from."""
    package = module if is_package else module.rpartition(".")[0]
    own = set(ancestors(module))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found = [(base, alias.name) for alias in node.names]
        else:
            continue
        for name, member in found:
            if name.split(".")[0] not in PACKAGES:
                continue
            targets = [name]
            if member is not None:
                if f"{name}.{member}" in tree:
                    targets = [f"{name}.{member}"]
                elif name in tree and tree[name][1] and member in lazy_names(tree[name][0]):
                    targets = [name, f"{name}.{lazy_names(tree[name][0])[member]}"]
            for target in targets:
                for reached in ancestors(target) + [target]:
                    if reached not in own and reached != module:
                        yield Import(node.lineno, reached)


def upward_imports(tree: Dict[str, Tuple[str, bool]]) -> List[str]:
    """Every import that reaches a higher layer, as ``file:line: module (layer) imports target
    (layer)``."""
    found = []
    for module, (source, is_package) in tree.items():
        for line, target in imports_of(module, source, is_package, tree):
            if layer_of(target) > layer_of(module):
                path = module.replace(".", "/") + ("/__init__.py" if is_package else ".py")
                found.append(
                    f"{path}:{line}: {module} (layer {layer_of(module)}) imports {target} "
                    f"(layer {layer_of(target)}, {LAYER_NAMES[layer_of(target)]})"
                )
    return found


def circles(tree: Dict[str, Tuple[str, bool]]) -> List[List[str]]:
    """The import circles among the modules of ``tree``: each strongly connected set of more than
    one module (or one that imports itself), sorted."""
    edges: Dict[str, Set[str]] = {module: set() for module in tree}
    for module, (source, is_package) in tree.items():
        edges[module].update(target for _, target in imports_of(module, source, is_package, tree) if target in tree)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(edges[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in edges[module]:
                found.append(sorted(component))

    for module in sorted(tree):
        if module not in index:
            visit(module)
    return sorted(found)


# -- the tree as it is ---------------------------------------------------------------------------
def test_no_module_imports_a_higher_layer():
    found = upward_imports(read_tree())
    assert not found, "imports that go up the layers:\n" + "\n".join(found)


def test_no_import_circle():
    found = circles(read_tree())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_layer_table_names_modules_that_exist():
    """Every layer-0 module of the table is a module of the tree (a renamed one would leave the
    table silently permissive), and every layer is drawn in ``docs/architecture.md``."""
    tree = read_tree()
    assert [module for module in LAYER_0 if module not in tree] == []
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for module in LAYER_0[1:]:
        assert module.replace(".", "/") + ".py" in doc, f"docs/architecture.md does not place {module}"


# -- the checks can fail ---------------------------------------------------------------------------
def _tree(**modules: str) -> Dict[str, Tuple[str, bool]]:
    """A synthetic tree: keyword ``a__b`` is the module ``a.b``; a name ending in ``__init`` is a
    package."""
    tree = {}
    for key, source in modules.items():
        name = key.replace("__", ".")
        is_package = name.endswith(".init")
        tree[name[: -len(".init")] if is_package else name] = (source, is_package)
    return tree


def test_an_upward_import_is_flagged_with_its_file_and_line():
    tree = _tree(
        pyg_ugrapher__init="",
        pyg_ugrapher__graph="",
        triton_kernels__init="",
        triton_kernels__dispatch="import torch\n\nfrom pyg_ugrapher.graph import GraphTensor\n",
    )
    assert upward_imports(tree) == [
        "triton_kernels/dispatch.py:3: triton_kernels.dispatch (layer 1) imports pyg_ugrapher.graph "
        "(layer 3, runtime and frontend)"
    ]


def test_an_import_inside_a_function_is_flagged():
    source = "def select():\n    from pyg_ugrapher import ops\n    return ops\n"
    tree = _tree(pyg_ugrapher__init="", pyg_ugrapher__ops__init="", autotune__init="", autotune__selection=source)
    assert [entry.split(": ", 1)[0] for entry in upward_imports(tree)] == ["autotune/selection.py:2"]


def test_a_lazy_name_reaches_the_module_that_defines_it():
    """``from pyg_ugrapher import GraphTensor`` names the package, but loads ``pyg_ugrapher.graph``."""
    tree = _tree(
        pyg_ugrapher__init='_LAZY = {"GraphTensor": "graph"}\n',
        pyg_ugrapher__graph="",
        pyg_ugrapher__ir="",
        triton_kernels__init="from pyg_ugrapher import GraphTensor\n",
    )
    assert [entry.split(" imports ")[1].split(" ")[0] for entry in upward_imports(tree)] == ["pyg_ugrapher.graph"]
    relative = _tree(pyg_ugrapher__init="from . import ir\n", pyg_ugrapher__ir="", pyg_ugrapher__graph="")
    assert upward_imports(relative) == []


def test_an_eager_package_init_is_flagged():
    """Importing the layer-0 ``pyg_ugrapher.ir`` runs ``pyg_ugrapher/__init__.py``: an eager import
    of a runtime module there is an upward import of layer 0."""
    tree = _tree(pyg_ugrapher__init="from .graph import GraphTensor\n", pyg_ugrapher__graph="", pyg_ugrapher__ir="")
    assert [entry.split(": ", 1)[0] for entry in upward_imports(tree)] == ["pyg_ugrapher/__init__.py:1"]


def test_a_circle_is_flagged_and_a_package_importing_its_own_modules_is_not():
    tree = _tree(
        pyg_ugrapher__init="",
        pyg_ugrapher__ops__init="from .decisions import AUTO\n",
        pyg_ugrapher__ops__decisions="from ..graph import GraphTensor\n",
        pyg_ugrapher__graph="def f():\n    from .ops import decisions\n",
    )
    assert circles(tree) == [["pyg_ugrapher.graph", "pyg_ugrapher.ops", "pyg_ugrapher.ops.decisions"]]
    tree["pyg_ugrapher.graph"] = ("", False)
    assert circles(tree) == []


def test_importing_a_module_reaches_its_packages_init():
    """``message_passing`` importing ``pyg_ugrapher.nn._graph`` runs ``pyg_ugrapher/nn/__init__.py``,
    whose layers import ``message_passing``: a circle, though no module imports its importer."""
    tree = _tree(
        pyg_ugrapher__init="",
        pyg_ugrapher__message_passing="from .nn._graph import layer_graph\n",
        pyg_ugrapher__nn__init="from .gat_conv import GATConv\n",
        pyg_ugrapher__nn__gat_conv="from ..message_passing import MessagePassing\n",
        pyg_ugrapher__nn___graph="",
    )
    assert circles(tree) == [["pyg_ugrapher.message_passing", "pyg_ugrapher.nn", "pyg_ugrapher.nn.gat_conv"]]
