"""A two-layer GCN written with ``ug.compute`` trains on Cora to PyG's accuracy, and one training
step through the Triton kernels (the interpreter on a CPU) matches the reference executor's."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

import pyg_ugrapher as ug
from pyg_ugrapher.datasets import load_cora

SEED = 12345
#: Half of PyG's example's 200: from epoch 75 on, both models' Cora test accuracy stays within
#: 0.795-0.817, and the two follow the same trajectory throughout.
EPOCHS = 100
U_MUL_E_SUM = ug.OpInfo.from_name("u_mul_e_sum")


def gcn_graph(edge_index: torch.Tensor, num_nodes: int):
    r"""Self loops and the symmetric normalisation :math:`w_{uv} = d_u^{-1/2} d_v^{-1/2}`."""
    loops = torch.arange(num_nodes).repeat(2, 1)
    edge_index = torch.cat([edge_index, loops], dim=1)
    degree = torch.bincount(edge_index[1], minlength=num_nodes).float()
    norm = degree.rsqrt()
    return ug.GraphTensor.from_edge_index(edge_index, num_nodes), norm[edge_index[0]] * norm[edge_index[1]]


class PyGGCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class UgGCN(torch.nn.Module):
    """The same model, each propagation one ``u_mul_e_sum`` over the normalised graph."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, schedules=(None, None)) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(in_channels, hidden, bias=False)
        self.bias1 = torch.nn.Parameter(torch.zeros(hidden))
        self.lin2 = torch.nn.Linear(hidden, out_channels, bias=False)
        self.bias2 = torch.nn.Parameter(torch.zeros(out_channels))
        self.schedules = schedules

    def load_pyg(self, model: PyGGCN) -> None:
        with torch.no_grad():
            for lin, bias, conv in ((self.lin1, self.bias1, model.conv1), (self.lin2, self.bias2, model.conv2)):
                lin.weight.copy_(conv.lin.weight)
                bias.copy_(conv.bias)

    def forward(self, x, graph, norm):
        x = F.dropout(x, p=0.5, training=self.training)
        x = ug.compute(graph, U_MUL_E_SUM, self.lin1(x), norm, parallel_info=self.schedules[0]) + self.bias1
        x = F.dropout(F.relu(x), p=0.5, training=self.training)
        return ug.compute(graph, U_MUL_E_SUM, self.lin2(x), norm, parallel_info=self.schedules[1]) + self.bias2


def train(model, forward, data) -> float:
    """PyG's GCN example optimiser, Adam(lr=0.01, weight_decay=5e-4), for ``EPOCHS``; test accuracy."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    torch.manual_seed(SEED)
    for _ in range(EPOCHS):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(forward()[data.train_mask], data.y[data.train_mask]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        pred = forward().argmax(dim=-1)
    return (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()


@pytest.fixture(scope="module")
def cora():
    data = load_cora()
    graph, norm = gcn_graph(data.edge_index, data.num_nodes)
    return data, graph, norm


def _models(data):
    torch.manual_seed(SEED)
    theirs = PyGGCN(data.num_features, 16, 7)
    ours = UgGCN(data.num_features, 16, 7)
    ours.load_pyg(theirs)
    return ours, theirs


@pytest.mark.slow
def test_gcn_matches_pyg_accuracy(cora):
    data, graph, norm = cora
    ours, theirs = _models(data)
    acc_pyg = train(theirs, lambda: theirs(data.x, data.edge_index), data)
    acc_ours = train(ours, lambda: ours(data.x, graph, norm), data)
    assert acc_pyg > 0.75, f"PyG's GCN reached only {acc_pyg:.3f}"
    assert abs(acc_ours - acc_pyg) <= 0.015, f"ours {acc_ours:.3f} vs PyG {acc_pyg:.3f}"


def test_one_step_through_the_kernels(cora, device, check_close, monkeypatch):
    """Loss and every gradient of one training step on Cora, kernels vs the reference executor."""
    data, graph, norm = cora
    schedules = (
        ug.ParallelInfo("vertex", block_v=32, block_e=16, block_f=16),
        ug.ParallelInfo("group", group_size=32, block_v=16, block_e=8, block_f=8),
    )
    ours, _ = _models(data)
    ours.schedules = schedules
    ours = ours.to(device).eval()
    x, y, mask = data.x.to(device), data.y.to(device), data.train_mask.to(device)
    results = []
    for interpreted in (True, False):
        if not interpreted:
            ours.schedules = (None, None)
            x, ours = x.cpu(), ours.cpu()
            y, mask = y.cpu(), mask.cpu()
            monkeypatch.setenv("TRITON_INTERPRET", "0")
        ours.zero_grad()
        loss = F.cross_entropy(ours(x, graph, norm.to(x.device))[mask], y[mask])
        loss.backward()
        results.append([loss.detach().cpu()] + [p.grad.detach().cpu().clone() for p in ours.parameters()])
    for k, (a, b) in enumerate(zip(*results)):
        check_close(a, b, context=f"tensor {k}")
