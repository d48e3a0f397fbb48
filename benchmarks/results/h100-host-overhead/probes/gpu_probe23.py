"""Isolate: is run_graph_op slow with grad-requiring inputs, or after a backward?"""
import time, torch
import pyg_ugrapher as ug
from pyg_ugrapher import ops
dev = "cuda"
torch.manual_seed(0)
N, E = 2708, 10556
ei = torch.randint(0, N, (2, E), device=dev)
g = ug.GraphTensor.from_edge_index(ei, num_nodes=N)
xd = torch.randn(N, 128, device=dev)
x = xd.clone().requires_grad_()
go = torch.randn(N, 128, device=dev)
structure = g.structure(xd.device)
text = "copy_u_sum"
def host(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6
def bw():
    out = ug.compute(g, text, x)
    torch.autograd.grad(out, [x], go)
def rg_after_bw():
    bw()
    t = time.perf_counter()
    ops.run_graph_op(structure, [xd], text, "auto")
    return time.perf_counter() - t
cases = {
    "run_graph_op detached": lambda: ops.run_graph_op(structure, [xd], text, "auto"),
    "run_graph_op requires_grad, no_grad": lambda: (torch.no_grad().__enter__(), ops.run_graph_op(structure, [x], text, "auto")),
    "run_graph_op requires_grad": lambda: ops.run_graph_op(structure, [x], text, "auto"),
    "compute detached": lambda: ug.compute(g, text, xd),
    "f+b": bw,
}
torch.set_grad_enabled(True)
for name, fn in cases.items():
    torch.set_grad_enabled(True)
    print(f"{name:40s} {host(fn):7.1f} us")
torch.set_grad_enabled(True)
for _ in range(20): rg_after_bw()
ts = [rg_after_bw() for _ in range(500)]
print(f"run_graph_op right after a backward: median {sorted(ts)[250]*1e6:.1f} us")
def rg_after_sync():
    bw(); torch.cuda.synchronize()
    t = time.perf_counter()
    ops.run_graph_op(structure, [xd], text, "auto")
    return time.perf_counter() - t
ts = [rg_after_sync() for _ in range(500)]
print(f"run_graph_op after backward+sync: median {sorted(ts)[250]*1e6:.1f} us")
def sleep_after_bw():
    bw(); time.sleep(0.0005)
    t = time.perf_counter()
    ops.run_graph_op(structure, [xd], text, "auto")
    return time.perf_counter() - t
ts = [sleep_after_bw() for _ in range(500)]
print(f"run_graph_op after backward+0.5ms sleep: median {sorted(ts)[250]*1e6:.1f} us")
import sys; print("switchinterval", sys.getswitchinterval())
