"""A/B of launch paths in one process, and cProfile of compute on the GPU host."""
import time, torch, triton, cProfile, pstats, io
import pyg_ugrapher as ug
import triton_kernels
from triton_kernels import dispatch as d
from pyg_ugrapher import ops
dev = "cuda"
torch.manual_seed(0)
N, E = 2708, 10556
ei = torch.randint(0, N, (2, E), device=dev)
g = ug.GraphTensor.from_edge_index(ei, num_nodes=N)
x = torch.randn(N, 128, device=dev)
def host(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    best = 1e9
    for rep in range(3):
        t = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best
structure = g.structure(x.device)
op = ops._named("copy_u_sum"); text = op.serialize()
layout = ops._layout_of(text, [x])
arrays = ops._arrays(structure)
info = ops.schedule_for(op, layout, arrays.csr, torch.float32, x.device)
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
DK = c["kernel"]
print(type(DK).__name__, "binaries", len(DK.binaries), "direct", DK.direct)
csr = arrays.csr
grid = (triton.cdiv(csr.num_rows, info.block_v), triton.cdiv(c["width"], info.block_f))
args = [csr.rowptr, csr.col, csr.eid, *c["args"], c["out"], csr.num_rows, c["width"], layout.inner]
kw = dict(BLOCK_V=info.block_v, BLOCK_E=info.block_e, BLOCK_F=info.block_f, num_warps=info.num_warps, num_stages=info.num_stages)
K = DK.fn
compiled = K[grid](*args, **kw)
stream = torch.cuda.current_stream().cuda_stream
const = [info.block_v, info.block_e, info.block_f]
from triton.runtime.driver import driver
from triton import knobs
A = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(E, device=dev), (N, N))
cases = {
    "empty_like": lambda: torch.empty_like(x),
    "cusparse": lambda: A @ x,
    "jit launch": lambda: K[grid](*args, **kw),
    "DirectKernel launch": lambda: DK[grid](*args, **kw),
    "DirectKernel._key": lambda: DK._key(0, args, kw),
    "knobs hook read": lambda: knobs.runtime.launch_enter_hook,
    "get_current_device": lambda: driver.active.get_current_device(),
    "compiled.run direct": lambda: compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *args, *const),
    "template.launch": lambda: orig(DK, c["graph"], c["args"], c["out"], c["width"], c["layout"], c["info"]),
    "triton_kernels.run": lambda: triton_kernels.run(op, layout, arrays, [x], info),
    "run_graph_op": lambda: ops.run_graph_op(structure, [x], text, "auto"),
    "ug.compute": lambda: ug.compute(g, "copy_u_sum", x),
}
for name, fn in cases.items():
    print(f"{name:24s} {host(fn):7.1f} us")
print("binaries after", len(DK.binaries), "direct", DK.direct)
def prof(name, fn, n):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print(f"==== {name} ({n} calls)\n" + s.getvalue()[-4500:])
prof("compute", lambda: ug.compute(g, "copy_u_sum", x), 2000)
