"""GPU probe 17: the backward's gather + edge output in one kernel. f+b of u_mul_e_sum (w [E] and
[E,4,1]) with the pair fused vs run one by one; a sweep of fused schedules; the GAT layer step."""
import os, sys
import torch, triton
sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug
import triton_kernels
from pyg_ugrapher import ops
from pyg_ugrapher.layout import infer_layout
from pyg_ugrapher.datasets import power_law_graph, uniform_graph
dev = torch.device(os.environ.get("DEV", "cuda"))
SIZES = [(int(os.environ.get("N", 1_000_000)), int(os.environ.get("E", 16_000_000)), 128, 1),
         (int(os.environ.get("N2", 200_000)), int(os.environ.get("E2", 4_000_000)), 32, 4)]
if dev.type == "cpu": triton.testing.do_bench = lambda f, **k: (f(), 0.0)[1]
real_pair = triton_kernels.run_with_edge_output
def bench(f, rep=60):
    f(); torch.cuda.synchronize() if dev.type == "cuda" else None
    return triton.testing.do_bench(f, warmup=5, rep=rep, return_mode="median")
for kind, gen in [("uniform", uniform_graph), ("power_law", power_law_graph)]:
    for N, E, C, H in SIZES:
        ei = gen(N, E, device=dev)
        g = ug.GraphTensor(ei[0], ei[1], N, N)
        E = g.num_edges
        x = torch.randn(N, H, C, device=dev, requires_grad=True)
        w = torch.rand((E,) if H == 1 else (E, H, 1), device=dev, requires_grad=True)
        xx = x.view(N, C) if H == 1 else x
        grad = torch.randn(N, H * C, device=dev).view_as(xx)
        def fb():
            x.grad = w.grad = None
            ug.compute(g, "u_mul_e_sum", xx, w).backward(grad)
        def fwd():
            with torch.no_grad(): ug.compute(g, "u_mul_e_sum", xx, w)
        print(f"== {kind} N={N} E={E} x{list(xx.shape[1:])} w{list(w.shape[1:])}", flush=True)
        t_f = bench(fwd)
        triton_kernels.run_with_edge_output = real_pair
        t_fused = bench(fb)
        triton_kernels.run_with_edge_output = lambda *a: None
        t_sep = bench(fb)
        triton_kernels.run_with_edge_output = real_pair
        print(f"  fwd {t_f:.3f}  f+b fused {t_fused:.3f}  f+b separate {t_sep:.3f}  (bwd fused {t_fused-t_f:.3f} vs {t_sep-t_f:.3f})", flush=True)
        # the pair directly, under several schedules
        rs = ops.reversed_structure(g.structure(dev)); arrays = ops._arrays(rs)
        G = grad.detach(); xd = xx.detach(); wd = w.detach()
        wcol = wd if H > 1 else wd
        gop, mop = ug.OpInfo.from_name("u_mul_e_sum"), ug.OpInfo.from_name("v_dot_u")
        gl = infer_layout(gop, [G.shape, wcol.shape]); ml = infer_layout(mop, [xd.shape, G.shape])
        auto = ops.schedule_for(gop, gl, arrays.csr, torch.float32, dev)
        t_g = bench(lambda: triton_kernels.run(gop, gl, arrays, [G, wcol], auto))
        t_m = bench(lambda: ops.run_graph_op(ops.reversed_structure(rs), [xd, G], "u_dot_v", "auto") if False else
                    ops.run_graph_op(g.structure(dev), [xd, G.view_as(xd)], "u_dot_v", "auto"))
        print(f"  gather alone {t_g:.3f} ({auto}); u_dot_v alone {t_m:.3f}", flush=True)
        F = H * C
        cands = [auto]
        for bf in (32, 64, 128):
            for bv, be in ((1, 16), (2, 8), (4, 4), (8, 4), (16, 4), (4, 8), (8, 2)):
                if bv * be * bf <= 8192:
                    cands.append(ug.ParallelInfo("vertex", block_v=bv, block_e=be, block_f=bf, num_warps=4 if bv*be*bf <= 2048 else 8))
            for gs, bv, be in ((128, 16, 4), (512, 16, 4), (512, 4, 8), (128, 8, 2)):
                if bv * be * bf <= 8192:
                    cands.append(ug.ParallelInfo("group", group_size=gs, block_v=bv, block_e=be, block_f=bf, num_warps=4 if bv*be*bf <= 2048 else 8))
        res = []
        for info in (cands[:3] if dev.type == 'cpu' else cands):
            try:
                t = bench(lambda: real_pair(gop, gl, mop, ml, arrays, [G, wcol], [xd, G], info, (torch.float32, torch.float32)), rep=25)
                res.append((t, str(info)))
            except Exception as exc:
                res.append((float("inf"), f"{info} failed {type(exc).__name__}: {str(exc)[:80]}"))
        res.sort()
        print(f"  fused auto: {[r for r in res if r[1] == str(auto)]}")
        for t, s in res[:8]:
            print(f"    {t:7.3f}  {s}")
        print(f"    worst {res[-1][0]:.3f} {res[-1][1]}", flush=True)
import pyg_ugrapher.nn as ugnn
N, E = 200_000, 4_000_000
for kind, gen in [("uniform", uniform_graph), ("power_law", power_law_graph)]:
    ei = gen(N, E, device=dev)
    x = torch.randn(N, 128, device=dev); target = torch.randn(N, 128, device=dev)
    m = ugnn.GATConv(128, 32, heads=4).to(dev); opt = torch.optim.Adam(m.parameters())
    def step():
        opt.zero_grad(set_to_none=True); torch.nn.functional.mse_loss(m(x, ei), target).backward(); opt.step()
    for label, pair in (("fused", real_pair), ("separate", lambda *a: None)):
        triton_kernels.run_with_edge_output = pair
        for _ in range(3): step()
        print(f"GAT step {kind} {label}: {bench(step, rep=80):.2f} ms", flush=True)
    triton_kernels.run_with_edge_output = real_pair
    if dev.type != "cuda": continue
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3): step()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"   GPU kernel time {sum(e.self_device_time_total for e in ev)/3e3:.2f} ms")
    for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:8]:
        print(f"   {e.self_device_time_total/3e3:7.3f} ms x{e.count//3:3d}  {e.key[:90]}")
from benchmarks import layers as blayers
print("layers:", blayers.LAYERS if hasattr(blayers, "LAYERS") else "")
for kind, gen in [("power_law", power_law_graph)]:
    ei = gen(N, E, device=dev)
    x = torch.randn(N, 128, device=dev); target = torch.randn(N, 128, device=dev)
    mlp = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
    m = ugnn.GINConv(mlp).to(dev); opt = torch.optim.Adam(m.parameters())
    def step():
        opt.zero_grad(set_to_none=True); torch.nn.functional.mse_loss(m(x, ei), target).backward(); opt.step()
    for _ in range(3): step()
    print(f"GIN step {kind}: {bench(step, rep=80):.2f} ms", flush=True)
    if dev.type != "cuda": continue
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3): step()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"   GPU kernel time {sum(e.self_device_time_total for e in ev)/3e3:.2f} ms")
    for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:14]:
        print(f"   {e.self_device_time_total/3e3:7.3f} ms x{e.count//3:3d}  {e.key[:90]}")
