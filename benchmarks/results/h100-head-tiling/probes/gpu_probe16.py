"""GPU probe 16: tolokers 2-layer GAT (8 heads of 8, dropout 0.6) training step: head tiling and the
block-diagonal attention halves on/off (median do_bench), plus the named-kernel breakdown."""
import os, sys
import torch, triton
import torch.nn.functional as F
sys.path.insert(0, os.getcwd())
import pyg_ugrapher.nn as ugnn
from pyg_ugrapher.nn import gat_conv
from triton_kernels import dispatch
from benchmarks.train_e2e import make_task, build_model
dev = torch.device("cuda")
task = make_task("tolokers", dev, 0)
tiling, halves = dispatch.head_tiling, gat_conv.GATConv._attention_halves
def old_halves(self, x, vectors):
    return tuple((x * a).sum(-1) for a in vectors)
for label, t, h in [("current", True, True), ("no head tiling", False, True), ("elementwise halves", True, False), ("both off", False, False)]:
    dispatch.head_tiling = tiling if t else (lambda *a: (0, False))
    gat_conv.GATConv._attention_halves = halves if h else old_halves
    dispatch._kernel.cache_clear()
    torch.manual_seed(0)
    model = build_model("gat", ugnn, task.x.size(1), 64, int(task.y.max()) + 1).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    def step():
        opt.zero_grad(); out = model(task.x, task.edge_index)
        F.cross_entropy(out[task.train_mask], task.y[task.train_mask]).backward(); opt.step()
    for _ in range(3): step()
    ms = triton.testing.do_bench(step, warmup=5, rep=60, return_mode="median")
    print(f"tolokers GAT step, {label}: {ms:.2f} ms", flush=True)
    if label == "current":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3): step()
            torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"   GPU kernel time {sum(e.self_device_time_total for e in ev)/3e3:.2f} ms")
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:10]:
            print(f"   {e.self_device_time_total/3e3:7.3f} ms x{e.count//3:3d}  {e.key[:90]}")
