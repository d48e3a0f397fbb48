"""Demo on the bundled Cora graph: real pyg_ugrapher operators, checked against PyG.

Run with ``make demo``. On a machine without a GPU it sets ``TRITON_INTERPRET=1``, so the Triton
kernels run through Triton's CPU interpreter and the timings printed say nothing about GPU speed
(``benchmarks/`` measures that).
"""

from __future__ import annotations

import time
from typing import Callable, List, Tuple

import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import MessagePassing as PyGMessagePassing

import pyg_ugrapher as ug
from pyg_ugrapher.datasets import load_cora
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.ops import schedule_for
from triton_kernels import interpreting


class _PyGOperator(PyGMessagePassing):
    """The PyG module a user would write for one operator."""

    def __init__(self, aggr: str, message: Callable) -> None:
        super().__init__(aggr=aggr)
        self._message = message

    def forward(self, x, edge_index, w=None):
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_j, x_i, w):
        return self._message(x_j, x_i, w)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().float(), ref.detach().float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _timed(fn: Callable[[], torch.Tensor]) -> Tuple[torch.Tensor, float]:
    """One call's result and wall time; on a GPU after a first call that compiles the kernels
    (on the CPU every interpreted call costs the same)."""
    if torch.cuda.is_available():
        fn()
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - start) * 1e3


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = load_cora()
    edge_index = data.edge_index.to(device)
    graph = ug.GraphTensor.from_edge_index(edge_index, data.num_nodes)
    stats = graph.stats(device)
    # Project the 1433 bag-of-words features to 64 so the CPU interpreter stays quick.
    x = (data.x.to(device) @ torch.randn(data.num_features, 64, device=device)) / 8
    w = torch.rand(graph.num_edges, device=device)
    if device.type == "cuda":
        mode = "CUDA"
    elif interpreting():
        mode = "CPU, Triton interpreter (timings are not GPU timings)"
    else:
        mode = "CPU, reference executor (set TRITON_INTERPRET=1 to run the Triton kernels)"
    print(
        f"Cora: {graph.num_dst} vertices, {graph.num_edges} edges, in-degree mean {stats.rows.mean:.1f}, "
        f"max {stats.rows.max:.0f}; features 64; running on {mode}\n"
    )

    src, dst = edge_index
    cases: List[Tuple[str, Tuple, Callable[[], torch.Tensor]]] = [
        ("copy_u_sum", (x,), lambda: _PyGOperator("sum", lambda xj, xi, w: xj)(x, edge_index)),
        ("copy_u_mean", (x,), lambda: _PyGOperator("mean", lambda xj, xi, w: xj)(x, edge_index)),
        ("copy_u_max", (x,), lambda: _PyGOperator("max", lambda xj, xi, w: xj)(x, edge_index)),
        ("u_mul_e_sum", (x, w), lambda: _PyGOperator("sum", lambda xj, xi, w: xj * w.view(-1, 1))(x, edge_index, w)),
        ("u_dot_v", (x, x), lambda: (x[src] * x[dst]).sum(-1, keepdim=True)),
        ("u_add_v", (x, x), lambda: x[src] + x[dst]),
    ]
    header = f"{'operator':<13} {'schedule chosen by the autotuner':<84} {'ms':>8} {'rel err vs PyG':>15}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name, operands, pyg_fn in cases:
        op = ug.OpInfo.from_name(name)
        layout = infer_layout(op, [t.shape for t in operands])
        info = schedule_for(op, layout, graph.csr(device), x.dtype, device)
        out, ms = _timed(lambda: ug.compute(graph, op, *operands))
        err = _rel_err(out, pyg_fn())
        worst = max(worst, err)
        print(f"{name:<13} {str(info):<84} {ms:8.1f} {err:15.2e}")

    gcn_ref = pyg_nn.GCNConv(64, 16).to(device)
    gcn = ug.nn.GCNConv(64, 16).to(device)
    gcn.load_state_dict(gcn_ref.state_dict())
    out, ms = _timed(lambda: gcn(x, edge_index))
    err = _rel_err(out, gcn_ref(x, edge_index))
    worst = max(worst, err)
    print(f"\nGCNConv(64, 16) with PyG's weights: {ms:.1f} ms, rel err vs torch_geometric.nn.GCNConv {err:.2e}")
    print("Its operators, as ug.plan shows them:")
    for entry in ug.plan(gcn, x, edge_index):
        print(f"  {entry.op.name}: {entry.parallel_info}")

    ok = worst < 1e-5
    print(f"\n{'All results match PyG' if ok else 'MISMATCH'} (worst relative error {worst:.2e}, tolerance 1e-5)")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
