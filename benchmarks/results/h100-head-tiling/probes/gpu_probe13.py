"""GPU probe 13: named-kernel breakdown of a GATConv step (power-law 4M) and of u_mul_e_sum fwd+bwd
(uniform 16M); alternative schedules for the GAT backward's u_dot_v."""
import os, sys
import torch, triton
sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug
import pyg_ugrapher.nn as ugnn
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
dev = torch.device("cuda")
def profile(label, step, n=3):
    for _ in range(3): step()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(step, warmup=5, rep=40, return_mode="median")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n): step()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"== {label}: step {ms:.2f} ms, GPU kernel time {sum(e.self_device_time_total for e in ev)/n/1e3:.2f} ms", flush=True)
    for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:16]:
        print(f"   {e.self_device_time_total/n/1e3:7.3f} ms x{e.count//n:3d}  {e.key[:100]}")
for kind, gen in [("power_law", power_law_graph), ("uniform", uniform_graph)]:
    ei = gen(200_000, 4_000_000, device=dev)
    x = torch.randn(200_000, 128, device=dev); target = torch.randn(200_000, 128, device=dev)
    m = ugnn.GATConv(128, 32, heads=4).to(dev); opt = torch.optim.Adam(m.parameters())
    def step():
        opt.zero_grad(set_to_none=True); torch.nn.functional.mse_loss(m(x, ei), target).backward(); opt.step()
    profile(f"GATConv {kind}", step)
    g = ug.GraphTensor(ei[0], ei[1], 200_000, 200_000)
    xs = torch.randn(g.num_edges, 128, device=dev); gr = torch.randn(200_000, 128, device=dev)
    xv = torch.randn(200_000, 4, 32, device=dev); gv = torch.randn(200_000, 4, 32, device=dev)
    for info in [None, ug.ParallelInfo("edge", block_e=32, block_f=128), ug.ParallelInfo("vertex", block_v=4, block_e=8, block_f=128),
                 ug.ParallelInfo("vertex", block_v=1, block_e=16, block_f=128), ug.ParallelInfo("edge", block_e=64, block_f=128, num_warps=8)]:
        f = lambda: ug.compute(g, "u_dot_v", xv, gv, parallel_info=info)
        print(f"   u_dot_v [E,4,32] {kind} {info}: {triton.testing.do_bench(f, warmup=5, rep=40, return_mode='median'):.3f} ms", flush=True)
for kind, gen in [("uniform", uniform_graph), ("power_law", power_law_graph)]:
    ei = gen(1_000_000, 16_000_000, device=dev)
    g = ug.GraphTensor(ei[0], ei[1], 1_000_000, 1_000_000)
    x = torch.randn(1_000_000, 128, device=dev, requires_grad=True); w = torch.rand(16_000_000, device=dev, requires_grad=True)
    profile(f"u_mul_e_sum f+b {kind} 16M", lambda: ug.compute(g, "u_mul_e_sum", x, w).sum().backward(), n=2)
