"""GPU probe 15: named-kernel breakdown of a GATConv training step after the head tiling and einsum halves."""
import os, sys
import torch, triton
sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
dev = torch.device("cuda")
for kind, gen in [("power_law", power_law_graph), ("uniform", uniform_graph)]:
    ei = gen(200_000, 4_000_000, device=dev)
    x = torch.randn(200_000, 128, device=dev); target = torch.randn(200_000, 128, device=dev)
    m = ugnn.GATConv(128, 32, heads=4).to(dev); opt = torch.optim.Adam(m.parameters())
    def step():
        opt.zero_grad(set_to_none=True); torch.nn.functional.mse_loss(m(x, ei), target).backward(); opt.step()
    for _ in range(3): step()
    ms = triton.testing.do_bench(step, warmup=5, rep=40, return_mode="median")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3): step()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"== GATConv {kind}: step {ms:.2f} ms, GPU kernel time {sum(e.self_device_time_total for e in ev)/3e3:.2f} ms", flush=True)
    for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:14]:
        print(f"   {e.self_device_time_total/3e3:7.3f} ms x{e.count//3:3d}  {e.key[:100]}")
