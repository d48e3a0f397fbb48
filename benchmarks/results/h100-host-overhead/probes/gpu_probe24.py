"""A/B: eager GAT layer step (2e5 / 4e6 power-law) of the working tree given as argv[1]."""
import sys, os
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
import pyg_ugrapher, pyg_ugrapher.nn as ugnn
from pyg_ugrapher import datasets
from torch.profiler import profile, ProfilerActivity
print("code from", os.path.dirname(pyg_ugrapher.__file__))
dev = torch.device("cuda")
ei = datasets.power_law_graph(200_000, 4_000_000, seed=0, device=dev)
torch.manual_seed(0)
x = torch.randn(200_000, 128, device=dev)
target = torch.randn(200_000, 128, device=dev)
model = ugnn.GATConv(128, 32, heads=4).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
def step():
    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(x, ei), target).backward()
    opt.step()
for _ in range(5): step()
torch.cuda.synchronize()
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); step(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e))
print("median step ms", sorted(times)[10])
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5): step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
