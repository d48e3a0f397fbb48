"""Save mini-batch graphs for probe26: 60 sampler batches (512 seeds, fan-out [10, 10]) and 60
random 20k-node subsets of a 2e5 / 4e6 power-law graph."""
import sys, torch
sys.path.insert(0, sys.argv[1])
from torch_geometric.utils import subgraph
from pyg_ugrapher.datasets import power_law_graph, neighbor_sample
N = 200_000
ei = power_law_graph(N, 4_000_000, seed=0, device="cuda")
g = torch.Generator().manual_seed(0)
sampled, subsets = [], []
for i in range(60):
    seeds = torch.randperm(N, generator=g)[:512].cuda()
    b, n = neighbor_sample(ei, N, seeds, [10, 10], seed=i)
    sampled.append((b, n.numel()))
    nodes = torch.randperm(N, generator=g)[:20_000].cuda()
    subsets.append((subgraph(nodes, ei, relabel_nodes=True, num_nodes=N)[0], 20_000))
torch.save({"sampled": sampled, "subsets": subsets}, "/tmp/batches.pt")
print("sampled: nodes/edges", [s[1] for s in sampled[:5]], [s[0].shape[1] for s in sampled[:5]])
