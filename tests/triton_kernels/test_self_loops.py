"""The looped-index kernel (``triton_kernels.self_loops``: ``spare_row_index``, ``looped_index``)
against the torch operations it replaces (:mod:`pyg_ugrapher.graph_argument`'s ``_spare_row_index``
and ``_looped_index`` where kernels do not run), on random indices with stored self loops,
duplicates, indices out of range on either side, negative ones, strided and int32 indices, no
edges and no loops."""

import pytest
import torch

from pyg_ugrapher import graph_argument
from triton_kernels import self_loops


def _expected(monkeypatch, index, flow, num_dst, num_loops, spare_src_row_of):
    """The torch operations' index, run on the CPU."""
    with monkeypatch.context() as patch:
        patch.setattr(graph_argument, "uses_triton", lambda device: False)
        return graph_argument._spare_row_index(index.cpu().long(), flow, num_dst, num_loops, spare_src_row_of)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("spare_src", [False, True], ids=["sources_kept", "spare_source_row"])
@pytest.mark.parametrize("layout", ["int64", "int32", "strided"])
@pytest.mark.parametrize("num_edges,num_loops", [(0, 0), (0, 5), (7, 0), (3000, 900)])
def test_matches_the_torch_operations(monkeypatch, device, flow, spare_src, layout, num_edges, num_loops):
    g = torch.Generator().manual_seed(num_edges + num_loops)
    num_src, num_dst = 1000, 900
    index = torch.randint(-2, num_dst + 3, (2, num_edges), generator=g)
    if num_edges:
        loops = torch.randint(0, num_edges, (num_edges // 5 + 1,), generator=g)
        index[1, loops] = index[0, loops]  # stored self loops
        index[:, -1] = index[:, 0]  # a duplicate
    if layout == "int32":
        index = index.int()
    elif layout == "strided":
        index = index.t().contiguous().t()  # column-major: a row stride of 1
    spare_src_row_of = num_src if spare_src else None
    j, i = graph_argument.endpoints(flow)
    got = self_loops.spare_row_index(index.to(device), i, num_dst, num_loops, spare_src_row_of)
    want = _expected(monkeypatch, index, flow, num_dst, num_loops, spare_src_row_of)
    assert got.dtype == torch.int64 and got.device.type == device.type
    assert got.shape == (2, num_edges + num_loops)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", ["int64", "int32", "strided"])
@pytest.mark.parametrize("num_edges,num_loops", [(0, 0), (0, 5), (7, 0), (3000, 900)])
def test_looped_index_matches_the_torch_operations(monkeypatch, device, layout, num_edges, num_loops):
    """The edges as they are (stored loops, indices out of range and negative ones kept), then the loops."""
    g = torch.Generator().manual_seed(num_edges + num_loops)
    index = torch.randint(-2, 1003, (2, num_edges), generator=g)
    if layout == "int32":
        index = index.int()
    elif layout == "strided":
        index = index.t().contiguous().t()
    got = self_loops.looped_index(index.to(device), num_loops)
    with monkeypatch.context() as patch:
        patch.setattr(graph_argument, "uses_triton", lambda device: False)
        want = graph_argument._looped_index(index.long(), num_loops)
    assert got.dtype == torch.int64 and got.shape == (2, num_edges + num_loops)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_a_hub_and_isolated_vertices(monkeypatch, device, flow):
    """A destination of 100,000 edges (a few of them self loops on it), vertices with no edge at
    all, and loops for every vertex, the isolated ones included: both kernels as the torch ones."""
    g = torch.Generator().manual_seed(7)
    num_nodes, hub = 50, 3
    sources = torch.randint(4, 40, (100_000,), generator=g)  # vertices 0-2 and 40-49 have no edge
    sources[:5] = hub
    ends = [sources, torch.full_like(sources, hub)]
    index = torch.stack(ends if flow == "source_to_target" else ends[::-1])
    j, i = graph_argument.endpoints(flow)
    got = self_loops.spare_row_index(index.to(device), i, num_nodes, num_nodes, num_nodes)
    assert torch.equal(got.cpu(), _expected(monkeypatch, index, flow, num_nodes, num_nodes, num_nodes))
    assert int((got[i, :100_000] == num_nodes).sum()) == 5  # the hub's stored loops, in the spare row
    with monkeypatch.context() as patch:
        patch.setattr(graph_argument, "uses_triton", lambda device: False)
        want = graph_argument._looped_index(index, num_nodes)
    assert torch.equal(self_loops.looped_index(index.to(device), num_nodes).cpu(), want)


def test_is_what_the_spare_row_graph_reads(monkeypatch, device):
    """Where kernels run, the layers' spare-row index is the kernel's, equal to the torch one's."""
    index = torch.tensor([[0, 1, 2, 3, 3], [1, 2, 3, 0, 3]], device=device)
    calls = []
    kernel = self_loops.spare_row_index
    monkeypatch.setattr(self_loops, "spare_row_index", lambda *args: calls.append(args) or kernel(*args))
    got = graph_argument._spare_row_index(index, "source_to_target", 4, 4)
    assert len(calls) == 1
    assert got.cpu().tolist() == [[0, 1, 2, 3, 3, 0, 1, 2, 3], [1, 2, 3, 0, 4, 0, 1, 2, 3]]


@pytest.mark.parametrize(
    "index,args,error,message",
    [
        (torch.zeros(3, 4, dtype=torch.long), (1, 4, 4), ValueError, r"^index: expected shape \[2, E\]"),
        (torch.zeros(2, 4), (1, 4, 4), TypeError, "^index: expected an integer tensor"),
        (torch.zeros(2, 4, dtype=torch.long), (2, 4, 4), ValueError, "^dst_row: expected 0 or 1"),
        (torch.zeros(2, 4, dtype=torch.long), (1, -1, 4), ValueError, "^num_dst: expected a count"),
        (torch.zeros(2, 4, dtype=torch.long), (1, 4, -1), ValueError, "^num_loops: expected a count"),
    ],
)
def test_refuses_bad_arguments(index, args, error, message):
    with pytest.raises(error, match=message):
        self_loops.spare_row_index(index, *args)
    if args[0] == 1 and args[1] >= 0:  # the same index and loops, for looped_index
        with pytest.raises(error, match=message):
            self_loops.looped_index(index, args[2])
