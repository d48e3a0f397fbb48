"""The small-graph rule against every edge-parallel schedule, on small graphs in the user's order.

A GPU graph of up to :data:`autotune.selection.SMALL_GRAPH_EDGES` edges runs its gathers under
:func:`autotune.heuristic.small_graph_schedule`, one edge-parallel schedule per operator and width,
on its edges in the user's order (no sort, no statistics: a new mini-batch graph costs the host
least). This suite times that rule and every edge-parallel schedule of the design space
(:mod:`triton_kernels.space`) on each graph, with the edges in the user's order (``edge_order``
``user``, as a step runs them) and sorted by destination (``sorted``, as ``autotune collect``
times them), the way ``collect`` times a schedule (a cold L2, behind a GPU busy-wait, the median
of up to 10 calls), and appends one row per schedule to ``small_graph_rule.csv``::

    python -m benchmarks.small_graph_rule                       # the default graphs, ~3 minutes
    python -m benchmarks.small_graph_rule --graphs cora --features 32

Graphs: the real ones by name (Cora, CiteSeer, PubMed, PROTEINS), synthetic ones of the
``autotune collect`` corpus by name (uniform, power-law, a batch of small graphs), and
``pubmed-batch-padded``: an induced subgraph of an eighth of PubMed's vertices (seeded), padded to
its bucket by :func:`pyg_ugrapher.pad_to_bucket`, whose padded edges are one row's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pandas as pd
import torch
from torch import Tensor
from torch_geometric.utils import subgraph
from tqdm import tqdm

from autotune.collect import OpCase, Timer, compile_all, op_cases, operands, runner, select_graphs
from autotune.heuristic import small_graph_schedule
from pyg_ugrapher import GraphTensor, datasets, pad_to_bucket
from pyg_ugrapher.parallel import ParallelInfo
from pyg_ugrapher.structure import GraphStructure
from triton_kernels.space import space

from . import rows
from .report import plot, small_graph_rule_summary

GRAPHS = ("cora", "citeseer", "pubmed", "proteins", "uni-n1e4-e1e5", "pl0.8-n1e4-e1e5", "batch-n2.5e4-e1e5")
PADDED = "pubmed-batch-padded"
OPS = ("copy_u_sum", "u_mul_e_sum", "copy_u_max")
WIDTHS = (32, 64, 128)
ORDERS = ("user", "sorted")
#: The share of PubMed's vertices whose induced subgraph is the padded mini-batch.
BATCH_FRACTION = 8


def padded_batch(edge_index: Tensor, num_nodes: int, seed: int) -> Tuple[Tensor, int]:
    """The subgraph induced by ``num_nodes // BATCH_FRACTION`` random vertices (seeded), padded to
    its bucket: ``(edge_index, num_nodes)``."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.randperm(num_nodes, generator=generator)[: num_nodes // BATCH_FRACTION].to(edge_index.device)
    sub, _ = subgraph(keep, edge_index, relabel_nodes=True, num_nodes=num_nodes)
    x, padded = pad_to_bucket(keep.new_zeros(keep.numel(), 1, dtype=torch.float32), sub)[:2]
    return padded, x.size(0)


def load_graphs(names: Sequence[str], device: torch.device, seed: int = 0) -> Dict[str, Tuple[Tensor, int]]:
    """``name -> (edge_index, num_nodes)`` on ``device``: corpus graphs by name, and
    :data:`PADDED` (made from PubMed)."""
    graphs: Dict[str, Tuple[Tensor, int]] = {}
    corpus = [name for name in names if name != PADDED]
    for spec in select_graphs(corpus) if corpus else []:
        if spec.kind == "real":
            data = datasets.load_dataset(spec.name)
            graphs[spec.name] = (data.edge_index.to(device), int(data.num_nodes))
        else:
            loaded = spec.load(device)
            graphs[spec.name] = (torch.stack([loaded.src.long(), loaded.dst.long()]), spec.num_nodes)
    if PADDED in names:
        data = datasets.load_dataset("pubmed")
        graphs[PADDED] = padded_batch(data.edge_index.to(device), int(data.num_nodes), seed)
    return graphs


def structures(edge_index: Tensor, num_nodes: int) -> Dict[str, GraphStructure]:
    """The graph's structure with its edges in the user's order and sorted, by :data:`ORDERS`."""
    graph = GraphTensor.from_edge_index(edge_index, num_nodes)
    return {order: graph.structure(edge_index.device, sort=order == "sorted") for order in ORDERS}


def schedules(case: OpCase, F: int, limit: Optional[int] = None) -> Tuple[List[ParallelInfo], ParallelInfo]:
    """The rule's schedule and the edge-parallel schedules of the space (the first ``limit``):
    ``(schedules, rule)``, the rule among the schedules."""
    rule = small_graph_schedule(case.op, F)
    edge = [info for info in space(case.op, F) if info.strategy == "edge"][:limit]
    return list(dict.fromkeys(edge + [rule])), rule


def measure(
    graphs: Dict[str, Tuple[Tensor, int]],
    ops: Sequence[str],
    widths: Sequence[int],
    device: torch.device,
    workers: int = 0,
    limit: Optional[int] = None,
) -> Iterator[dict]:
    """One row per (graph, edge order, case, schedule), as it is timed."""
    cases = [(F, case) + schedules(case, F, limit) for F in widths for case in op_cases(ops, F, backward=False)]
    compile_all([(case, "float32", info) for _, case, infos, _ in cases for info in infos], workers, device)
    timer = Timer(device)
    total = len(graphs) * len(ORDERS) * sum(len(infos) for _, _, infos, _ in cases)
    with tqdm(total=total, desc="schedules", unit="schedule", mininterval=10) as bar:
        for name, (edge_index, num_nodes) in graphs.items():
            for order, graph in structures(edge_index, num_nodes).items():
                for F, case, infos, rule in cases:
                    tensors = operands(graph, case, torch.float32, device)
                    for info in infos:
                        row = {
                            "graph": name,
                            "num_nodes": num_nodes,
                            "num_edges": edge_index.size(1),
                            "edge_order": order,
                            "op": case.name,
                            "F": F,
                            "config": info.serialize(),
                            "rule": int(info == rule),
                            "status": "ok",
                            "note": "",
                        }
                        try:
                            row["time_ms"] = timer(runner(graph, case, tensors, info))[0]
                        except Exception as error:  # noqa: BLE001 - a failing schedule is a row
                            row.update(time_ms=float("nan"), status="error", note=f"{type(error).__name__}: {error}")
                        bar.update()
                        yield row


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.small_graph_rule", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS) + [PADDED])
    parser.add_argument("--ops", nargs="+", default=list(OPS))
    parser.add_argument("--features", nargs="+", type=int, default=list(WIDTHS))
    parser.add_argument("--workers", type=int, default=14, help="compile processes (GPU only)")
    parser.add_argument("--limit", type=int, default=None, help="time only the first N edge schedules of a case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="folder of small_graph_rule.csv")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Time, append the rows, redraw the plot; returns (and prints) the summary of this commit's rows
    (:func:`benchmarks.report.small_graph_rule_summary`)."""
    args = parse_args(argv)
    device = torch.device(args.device)
    out = Path(args.out) if args.out is not None else rows.default_out(device)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "small_graph_rule.csv"
    env = rows.environment(device)
    graphs = load_graphs(args.graphs, device, args.seed)
    measured = measure(graphs, args.ops, args.features, device, args.workers, args.limit)
    rows.write_rows(path, ({**env, **row} for row in measured))
    plot(path)
    frame = rows.read(path)
    table = small_graph_rule_summary(frame[frame.commit == env["commit"]])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return table


if __name__ == "__main__":
    main()
