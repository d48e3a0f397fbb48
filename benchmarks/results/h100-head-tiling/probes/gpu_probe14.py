"""GPU probe 14: why the GAT softmax-aggregation op costs 2.4 ms when copy_u_sum costs 0.4 ms (4M edges)."""
import os, sys
import torch, triton
sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug
from pyg_ugrapher import ops, attention
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
dev = torch.device(os.environ.get("DEV", "cuda"))
N, E = int(os.environ.get("N", 200_000)), int(os.environ.get("E", 4_000_000))
if dev.type == "cpu": triton.testing.do_bench = lambda f, **k: (f(), 0.0)[1]
out_op = attention.attention_ops(False)[2]
def bench(label, g, op, operands, info=None, reuse=False):
    call = (lambda ts: ug.compute(g, op, *ts, parallel_info=chosen)) if isinstance(op, str) else (
        lambda ts: ug.compute(g, op, operands=ts, parallel_info=chosen))
    op = ug.OpInfo.from_name(op) if isinstance(op, str) else op
    layout = ops._layout_of(op.serialize(), operands)
    chosen = info or ops.schedule_for(op, layout, g.csr(dev), torch.float32, dev)
    f = lambda: call(operands if reuse else [t.view_as(t) for t in operands])
    f()
    ms = triton.testing.do_bench(f, warmup=5, rep=40, return_mode="median")
    print(f"  {ms:7.3f} ms  {label:44s} {chosen}", flush=True)
for kind, gen in [("power_law", power_law_graph), ("uniform", uniform_graph)]:
    ei = gen(N, E, device=dev)
    g = ug.GraphTensor(ei[0], ei[1], N, N)
    E = g.num_edges
    x = torch.randn(N, 128, device=dev); xh = x.view(-1, 4, 32)
    w = torch.rand(E, device=dev); wh = torch.rand(E, 4, 1, device=dev); n = torch.rand(N, 4, 1, device=dev)
    print(f"== {kind}")
    bench("copy_u_sum [N,128]", g, "copy_u_sum", [x])
    bench("u_mul_e_sum e[E]", g, "u_mul_e_sum", [x, w])
    bench("u_mul_e_sum e[E,4,1] (user order)", g, "u_mul_e_sum", [xh, wh])
    bench("u_mul_e_sum e[E,4,1] (reused: csr order)", g, "u_mul_e_sum", [xh, wh], reuse=True)
    bench("out op (u*exp(e-v)) e reused: csr order", g, out_op, [xh, wh, n], reuse=True)
    bench("out op (u*exp(e-v)) e user order", g, out_op, [xh, wh, n])
    for info in [ug.ParallelInfo("vertex", block_v=16, block_e=4, block_f=64, num_warps=8), ug.ParallelInfo("vertex", block_v=16, block_e=4, block_f=32, num_warps=8),
                 ug.ParallelInfo("vertex", block_v=8, block_e=4, block_f=32), ug.ParallelInfo("vertex", block_v=4, block_e=8, block_f=128),
                 ug.ParallelInfo("group", group_size=512, block_v=16, block_e=4, block_f=32), ug.ParallelInfo("group", group_size=512, block_v=16, block_e=4, block_f=64),
                 ug.ParallelInfo("group", group_size=128, block_v=16, block_e=2, block_f=128), ug.ParallelInfo("group", group_size=64, block_v=8, block_e=8, block_f=32),
                 ug.ParallelInfo("edge", block_e=64, block_f=32)]:
        bench("out op, fixed schedule", g, out_op, [xh, wh, n], info)
        bench("u_mul_e_sum e[E,4,1] fixed", g, "u_mul_e_sum", [xh, wh], info)
import pyg_ugrapher.nn as ugnn
for kind, gen in [("power_law", power_law_graph), ("uniform", uniform_graph)]:
    ei = gen(N, E, device=dev)
    x = torch.randn(N, 128, device=dev); target = torch.randn(N, 128, device=dev)
    m = ugnn.GATConv(128, 32, heads=4).to(dev); opt = torch.optim.Adam(m.parameters())
    def step():
        opt.zero_grad(set_to_none=True); torch.nn.functional.mse_loss(m(x, ei), target).backward(); opt.step()
    for _ in range(3): step()
    print(f"GAT step {kind}: {triton.testing.do_bench(step, warmup=5, rep=40, return_mode='median'):.2f} ms", flush=True)
