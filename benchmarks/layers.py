"""Layer level: one training step (forward, MSE loss, backward, Adam step) of one layer.

Ours is ``pyg_ugrapher.nn.<Layer>`` (another module with PyG's layer names can stand in, see
``--ours-layers``), or for the layers of :data:`ROUTED`, which have no drop-in, ``ug.accelerate`` of
PyG's layer (its ``message()`` captured or run staged); PyG is ``torch_geometric.nn.<Layer>``, both
built with PyG's constructor arguments, each eager and under ``torch.compile(model, dynamic=False)``
(the optimizer step stays eager, as users write it). Every model starts from the PyG model's
weights, so the first step's output of each is checked against eager PyG's.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
import torch_geometric.nn
from torch import nn
from tqdm import tqdm

import pyg_ugrapher

from .graphs import GraphSpec, LoadedGraph
from .rows import ResultsFile
from .timing import Budget, Settings, failure, free_memory, max_rel_err, measure

log = logging.getLogger(__name__)

METHODS = ("pyg", "pyg_compiled", "ours", "ours_compiled")
WIDTH = 128
TINY_WIDTH = 16
HEADS = 4
#: Layer name -> constructor, given the namespace that provides the layer and the feature width.
LAYERS: Dict[str, Callable[[ModuleType, int], nn.Module]] = {
    "GCNConv": lambda ns, w: ns.GCNConv(w, w),
    "GATConv": lambda ns, w: ns.GATConv(w, w // HEADS, heads=HEADS),
    "GATv2Conv": lambda ns, w: ns.GATv2Conv(w, w // HEADS, heads=HEADS),
    "SAGEConv": lambda ns, w: ns.SAGEConv(w, w, aggr="mean"),
    "GraphConv": lambda ns, w: ns.GraphConv(w, w, aggr="max"),
    "GINConv": lambda ns, w: ns.GINConv(nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w))),
}
#: The degree histogram PNAConv is built with (see :data:`ROUTED`).
PNA_DEGREES = torch.bincount(torch.full((16,), 16))
#: PyG layers without a drop-in: ours is ``ug.accelerate`` of PyG's layer.
ROUTED: Dict[str, Callable[[ModuleType, int], nn.Module]] = {
    "TransformerConv": lambda ns, w: ns.TransformerConv(w, w // HEADS, heads=HEADS),
    "EdgeConv": lambda ns, w: ns.EdgeConv(nn.Sequential(nn.Linear(2 * w, w), nn.ReLU(), nn.Linear(w, w)), aggr="max"),
    "GENConv": lambda ns, w: ns.GENConv(w, w),
    "EGConv": lambda ns, w: ns.EGConv(w, w),
    # PNA's scalers read the average degree of the training graphs: a histogram with every vertex at
    # degree 16, about the benchmark graphs' mean (it scales the outputs, not the work).
    "PNAConv": lambda ns, w: ns.PNAConv(
        w, w, ["mean", "min", "max", "std"], ["identity", "amplification", "attenuation"], PNA_DEGREES
    ),
}
LAYERS.update(ROUTED)
SEED = 0


def run(
    suite: str,
    specs: Sequence[GraphSpec],
    layer_names: Sequence[str],
    ours_module: str,
    tiny: bool,
    results: ResultsFile,
    budget: Budget,
    settings: Settings,
    device: torch.device,
    env: dict,
    backend: str,
) -> None:
    """Time every (graph, layer, method) not already in ``results``; see :func:`ops.run`."""
    width = TINY_WIDTH if tiny else WIDTH
    todo = {
        spec: [
            (layer, m)
            for layer in layer_names
            for m in METHODS
            if not results.done({"layer": layer, "graph": spec.name, "method": m})
        ]
        for spec in specs
    }
    skipped = 0
    common = {"suite": suite, "F": width, **env}
    with tqdm(total=sum(map(len, todo.values())), desc=suite, mininterval=10, unit="meas") as bar:
        for spec, items in todo.items():
            if not items:
                continue
            if budget.expired:
                skipped += len(items)
                continue
            try:
                loaded = spec.load(device)
            except Exception as error:  # noqa: BLE001 - recorded per row, the run goes on
                for layer, method in items:
                    results.write(
                        {
                            **common,
                            "layer": layer,
                            "graph": spec.name,
                            "graph_kind": spec.kind,
                            "method": method,
                            **failure(error),
                        }
                    )
                bar.update(len(items))
                continue
            skipped += _run_graph(
                loaded, items, width, ours_module, common, results, budget, settings, device, backend, bar
            )
            del loaded
            torch._dynamo.reset()
            free_memory(device)
    if skipped:
        log.warning(
            "time budget of %s s exhausted: %d %s measurements skipped; rerun with --resume to measure them",
            budget.seconds,
            skipped,
            suite,
        )


def _run_graph(
    loaded: LoadedGraph,
    items: List[Tuple[str, str]],
    width: int,
    ours_module: str,
    common: dict,
    results: ResultsFile,
    budget: Budget,
    settings: Settings,
    device: torch.device,
    backend: str,
    bar: tqdm,
) -> int:
    """Measure the (layer, method) items of one graph; returns how many the budget skipped."""
    gen = torch.Generator(device=device).manual_seed(SEED)
    x = torch.randn(loaded.num_nodes, width, generator=gen, device=device)
    target = torch.randn(loaded.num_nodes, width, generator=gen, device=device)
    edge_index = loaded.edge_index
    skipped = 0
    for layer in dict.fromkeys(layer for layer, _ in items):
        methods = [m for l_, m in items if l_ == layer]
        if budget.expired:
            skipped += len(methods)
            continue
        try:
            torch.manual_seed(SEED)
            reference = LAYERS[layer](torch_geometric.nn, width).to(device)
            with torch.no_grad():
                expected = reference(x, edge_index)
        except Exception as error:  # noqa: BLE001 - without PyG's model no method of it can run
            for method in methods:
                results.write({**common, **loaded.columns(), "layer": layer, "method": method, **failure(error)})
            bar.update(len(methods))
            continue
        for method in methods:
            if budget.expired:
                skipped += 1
                continue
            row = _measure(
                layer, method, reference, expected, x, edge_index, target, width, ours_module, settings, device, backend
            )
            results.write({**common, **loaded.columns(), "layer": layer, "method": method, **row})
            bar.update()
        del reference, expected
        free_memory(device)
    return skipped


def _measure(
    layer: str,
    method: str,
    reference: nn.Module,
    expected: torch.Tensor,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    target: torch.Tensor,
    width: int,
    ours_module: str,
    settings: Settings,
    device: torch.device,
    backend: str,
) -> dict:
    try:
        # Imported here, per row: a module that is missing or incomplete makes "unavailable" rows.
        routed = layer in ROUTED
        namespace = torch_geometric.nn if method.startswith("pyg") or routed else importlib.import_module(ours_module)
        model = LAYERS[layer](namespace, width).to(device)
        if routed and method.startswith("ours"):
            model = pyg_ugrapher.accelerate(model)
    except (ImportError, AttributeError) as error:
        return {"status": "unavailable", "note": f"{ours_module}.{layer}: {failure(error)['note']}"}
    except Exception as error:  # noqa: BLE001 - a layer that fails to build is a row, not a crash
        return failure(error)
    note = ""
    try:
        model.load_state_dict(reference.state_dict())
        compare = lambda out: max_rel_err((out,), (expected,))  # noqa: E731
    except RuntimeError as error:  # different parameter names or shapes: weights cannot be shared
        compare, note = None, f"unchecked: PyG's weights do not load ({failure(error)['note']})"
    runner = torch.compile(model, dynamic=False, backend=backend) if method.endswith("compiled") else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        out = runner(x, edge_index)
        F.mse_loss(out, target).backward()
        optimizer.step()
        return out.detach()

    row = measure(step, device, settings, compare=compare, compiled=method.endswith("compiled"))
    row["note"] = "; ".join(filter(None, [row["note"], note]))
    return row
