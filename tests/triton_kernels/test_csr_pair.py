"""The structure kernel (``triton_kernels.csr_pair``) against the torch build of both directions,
on every graph case, with its outputs poisoned first."""

import pytest
import torch

from pyg_ugrapher.structure import build_csr
from triton_kernels import csr_pair

FIELDS = ("rowptr", "col", "eid", "rows")


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Outputs filled with -7 (no row, offset or edge id) before the kernel runs."""
    allocate = csr_pair._allocate

    def poisoned(sizes, like):
        return [t.fill_(-7) for t in allocate(sizes, like)]

    monkeypatch.setattr(csr_pair, "_allocate", poisoned)


def _torch_build(src, dst, num_src, num_dst, dtype):
    return (build_csr(dst, src, num_dst, num_src, dtype), build_csr(src, dst, num_src, num_dst, dtype))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_structure_kernel_matches_torch_build(graph_case, graph_factory, index_dtype, device, poisoned_outputs):
    g = graph_factory(graph_case, index_dtype=index_dtype)
    src, dst = (t.to(device) for t in g.coo())
    built = csr_pair.build_csr_pair(src, dst, g.num_src, g.num_dst, index_dtype)
    expected = _torch_build(src, dst, g.num_src, g.num_dst, index_dtype)
    for got_csr, want_csr in zip(built, expected):
        assert got_csr.num_cols == want_csr.num_cols
        for field in FIELDS:
            got, want = getattr(got_csr, field), getattr(want_csr, field)
            assert got.dtype == index_dtype and got.device == want.device and torch.equal(got, want), field


@pytest.mark.parametrize("num_src,num_dst,num_edges", [(1, 1, 0), (3000, 2, 4099), (2, 3000, 4099), (700, 900, 1)])
def test_structure_kernel_on_skewed_and_sparse_sizes(num_src, num_dst, num_edges, device, poisoned_outputs):
    """More rows than one block of positions, more positions than rows, one edge, no edge; a hub
    holding most edges."""
    g = torch.Generator().manual_seed(num_edges)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, num_dst, (num_edges,), generator=g)
    dst[: num_edges // 2] = 0
    src, dst = src.to(device, torch.int32), dst.to(device, torch.int32)
    built = csr_pair.build_csr_pair(src, dst, num_src, num_dst, torch.int32)
    expected = _torch_build(src, dst, num_src, num_dst, torch.int32)
    for got_csr, want_csr in zip(built, expected):
        for field in FIELDS:
            assert torch.equal(getattr(got_csr, field), getattr(want_csr, field)), field


def test_structure_kernel_rejects_mismatched_sort(interpret):
    src = torch.tensor([0, 1], dtype=torch.int32)
    keys, perm = torch.sort(torch.tensor([1, 0, 2, 3], dtype=torch.int32), stable=True)
    with pytest.raises(ValueError, match="sorted_keys, perm"):
        csr_pair.csr_pair_arrays(keys[:3], perm[:3], src, src, 2, 2)
    assert csr_pair.fits(2**29, 10, 10) and not csr_pair.fits(2**30, 10, 10)
    assert not csr_pair.fits(10, 2**30, 2**30)
