"""Host cost per call of each layer of the stack on a Cora-size graph (GPU)."""
import time, torch, triton, sys
import pyg_ugrapher as ug
import triton_kernels
from triton_kernels import dispatch as d
from pyg_ugrapher import ops
from torch_geometric.nn import SAGEConv as PygSAGE
dev = "cuda"
torch.manual_seed(0)
N, E = int(sys.argv[1]) if len(sys.argv) > 1 else 2708, int(sys.argv[2]) if len(sys.argv) > 2 else 10556
ei = torch.randint(0, N, (2, E), device=dev)
g = ug.GraphTensor.from_edge_index(ei, num_nodes=N)
x = torch.randn(N, 128, device=dev)
w = torch.randn(E, device=dev)
def host(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    t2 = (time.perf_counter() - t) / n * 1e6
    return h, t2
structure = g.structure(x.device)
op = ops._named("copy_u_sum"); text = op.serialize()
layout = ops._layout_of(text, [x])
arrays = ops._arrays(structure)
info = ops.schedule_for(op, layout, arrays.csr, torch.float32, x.device)
print("schedule", info)
# raw launch: capture what _launch passes
captured = {}
tmpl = d.template_for(op, info)
orig = tmpl.launch
def spy(kernel, graph, args, out, width, lay, inf):
    captured.update(kernel=kernel, graph=graph, args=args, out=out, width=width, layout=lay, info=inf)
    orig(kernel, graph, args, out, width, lay, inf)
tmpl.launch = spy
triton_kernels.run(op, layout, arrays, [x], info)
tmpl.launch = orig
c = captured
A = torch.sparse_csr_tensor(arrays.csr.rowptr, arrays.csr.col, torch.ones(E, device=dev), (N, N))
xr = x.clone().requires_grad_()
def fb():
    ug.compute(g, "copy_u_sum", xr).sum().backward()
pyg = PygSAGE(128, 128).to(dev)
ours_sage = ug.nn.SAGEConv(128, 128).to(dev)
def pyg_step(): pyg(x, ei).sum().backward()
def ours_step(): ours_sage(x, ei).sum().backward()
cases = {
    "empty_like": lambda: torch.empty_like(x),
    "cusparse": lambda: A @ x,
    "raw_launch": lambda: orig(c["kernel"], c["graph"], c["args"], c["out"], c["width"], c["layout"], c["info"]),
    "triton_kernels.run": lambda: triton_kernels.run(op, layout, arrays, [x], info),
    "run_graph_op": lambda: ops.run_graph_op(structure, [x], text, "auto"),
    "ug.compute": lambda: ug.compute(g, "copy_u_sum", x),
    "ug.compute u_mul_e": lambda: ug.compute(g, "u_mul_e_sum", x, w),
    "compute f+b": fb,
    "sage f+b pyg": pyg_step,
    "sage f+b ours": ours_step,
}
for name, fn in cases.items():
    h, t = host(fn)
    ms = triton.testing.do_bench(fn, warmup=25, rep=200)
    print(f"{name:22s} host {h:7.1f} us  synced {t:7.1f} us  do_bench {ms*1e3:7.1f} us")
