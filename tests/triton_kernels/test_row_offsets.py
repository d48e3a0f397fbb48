"""The degree-count kernel (``triton_kernels.row_offsets``) against the sorted structures' row
offsets, on every graph case and on skewed sizes."""

import pytest
import torch

from triton_kernels import row_offsets
from triton_kernels.csr_pair import build_csr_pair


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_offsets_match_the_sorted_structures(graph_case, graph_factory, index_dtype, device):
    g = graph_factory(graph_case, index_dtype=index_dtype)
    src, dst = (t.to(device) for t in g.coo())
    rowptr, csc_rowptr = row_offsets.row_offsets(src, dst, g.num_src, g.num_dst)
    csr, csc = build_csr_pair(src, dst, g.num_src, g.num_dst, index_dtype)
    for got, want in ((rowptr, csr.rowptr), (csc_rowptr, csc.rowptr)):
        assert got.dtype == index_dtype and got.device == want.device and torch.equal(got, want)


@pytest.mark.parametrize("num_src,num_dst,num_edges", [(1, 1, 0), (3000, 2, 4099), (2, 3000, 4099), (700, 900, 1)])
def test_offsets_on_skewed_and_sparse_sizes(num_src, num_dst, num_edges, device):
    """More rows than edges and the other way round, one edge, no edge; a hub holding half the
    edges (many atomics on one counter)."""
    g = torch.Generator().manual_seed(num_edges)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, num_dst, (num_edges,), generator=g)
    dst[: num_edges // 2] = 0
    rowptr, csc_rowptr = row_offsets.row_offsets(
        src.to(device, torch.int32), dst.to(device, torch.int32), num_src, num_dst
    )
    for got, index, size in ((rowptr, dst, num_dst), (csc_rowptr, src, num_src)):
        want = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(index, minlength=size).cumsum(0)])
        assert torch.equal(got.cpu().long(), want)


def test_offsets_reject_mismatched_endpoints(interpret):
    src = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="src, dst"):
        row_offsets.row_offsets(src, src.long(), 2, 2)
    with pytest.raises(ValueError, match="src, dst"):
        row_offsets.row_offsets(src, src[:1], 2, 2)
