"""The user-order structure builder (``triton_kernels.row_offsets``) against the sorted structures'
row offsets and the edges themselves, on every graph case, on skewed sizes, on strided and bad
indices."""

import pytest
import torch

from triton_kernels import row_offsets
from triton_kernels.csr_pair import build_csr_pair


def _extremes(src: torch.Tensor, dst: torch.Tensor):
    """What the builder's extremes must be: each side's lowest and highest index, or 0."""
    lows = [min(0, int(t.min())) if t.numel() else 0 for t in (src, dst)]
    highs = [max(0, int(t.max())) if t.numel() else 0 for t in (src, dst)]
    return lows + highs


def _check_pair(pair, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int, index_dtype) -> None:
    num_edges = src.numel()
    for csr, col, rows, size in ((pair.csr, src, dst, num_dst), (pair.csc, dst, src, num_src)):
        assert csr.user_order and csr.num_rows == size
        for array in (csr.rowptr, csr.col, csr.eid, csr.rows):
            assert array.dtype == index_dtype and array.device == src.device
        assert torch.equal(csr.col.cpu().long(), col.cpu().long())
        assert torch.equal(csr.rows.cpu().long(), rows.cpu().long())
        assert torch.equal(csr.eid.cpu().long(), torch.arange(num_edges))
        degree = torch.bincount(rows.cpu().long(), minlength=size)
        want = torch.cat([torch.zeros(1, dtype=torch.int64), degree.cumsum(0)])
        assert torch.equal(csr.rowptr.cpu().long(), want)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pair_matches_the_sorted_structures(graph_case, graph_factory, index_dtype, device):
    g = graph_factory(graph_case, index_dtype=index_dtype)
    src, dst = (t.to(device) for t in g.coo())
    pair = row_offsets.build_user_order_pair(src, dst, g.num_src, g.num_dst, index_dtype, extrema=True)
    csr, csc = build_csr_pair(src, dst, g.num_src, g.num_dst, index_dtype)
    for got, want in ((pair.csr.rowptr, csr.rowptr), (pair.csc.rowptr, csc.rowptr)):
        assert got.dtype == index_dtype and got.device == want.device and torch.equal(got, want)
    _check_pair(pair, src, dst, g.num_src, g.num_dst, index_dtype)
    assert pair.extremes.tolist() == _extremes(src.cpu(), dst.cpu())


@pytest.mark.parametrize("num_src,num_dst,num_edges", [(1, 1, 0), (3000, 2, 4099), (2, 3000, 4099), (700, 900, 1)])
def test_pair_on_skewed_and_sparse_sizes(num_src, num_dst, num_edges, device):
    """More rows than edges and the other way round, one edge, no edge; a hub holding half the
    edges (many atomics on one counter); int64 edges in, int32 structures out."""
    g = torch.Generator().manual_seed(num_edges)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = torch.randint(0, num_dst, (num_edges,), generator=g)
    dst[: num_edges // 2] = 0
    src, dst = src.to(device), dst.to(device)
    pair = row_offsets.build_user_order_pair(src, dst, num_src, num_dst, torch.int32, extrema=True)
    _check_pair(pair, src, dst, num_src, num_dst, torch.int32)
    assert pair.extremes.tolist() == _extremes(src.cpu(), dst.cpu())


@pytest.mark.parametrize("paired_scan_rows", [0, 1 << 15], ids=["two_scans", "paired_scan"])
@pytest.mark.parametrize("num_src,num_dst", [(20000, 20), (20, 20000), (5, 7)])
def test_pair_offsets_by_either_scan(monkeypatch, num_src, num_dst, paired_scan_rows, device):
    """The running sums of both directions, as one scan of a ``[2, rows]`` tensor (up to
    ``PAIRED_SCAN_ROWS`` rows, here every size) or two 1-D scans (here every size), on sides of
    very different sizes."""
    monkeypatch.setattr(row_offsets, "PAIRED_SCAN_ROWS", paired_scan_rows)
    g = torch.Generator().manual_seed(num_src)
    src = torch.randint(0, num_src, (3000,), generator=g).to(device)
    dst = torch.randint(0, num_dst, (3000,), generator=g).to(device)
    pair = row_offsets.build_user_order_pair(src, dst, num_src, num_dst, torch.int32, extrema=True)
    _check_pair(pair, src, dst, num_src, num_dst, torch.int32)


def test_pair_of_a_100k_edge_hub(device):
    """Every edge into one vertex (100k atomics on one counter), vertices without edges around it."""
    g = torch.Generator().manual_seed(7)
    src = torch.randint(0, 5000, (100_000,), generator=g).to(device)
    dst = torch.full((100_000,), 3, device=device)
    pair = row_offsets.build_user_order_pair(src, dst, 5000, 10, torch.int32, extrema=True)
    _check_pair(pair, src, dst, 5000, 10, torch.int32)
    assert pair.csr.rowptr.tolist() == [0, 0, 0, 0] + [100_000] * 7
    assert pair.extremes.tolist() == _extremes(src.cpu(), dst.cpu())


def test_pair_reads_strided_rows_and_keeps_no_extremes_unasked(device):
    """The rows of a transposed ``[E, 2]`` index (stride 2); without ``extrema``, none are kept."""
    g = torch.Generator().manual_seed(3)
    pairs = torch.randint(0, 50, (2000, 2), generator=g).to(device)
    src, dst = pairs.t()
    assert src.stride(0) == 2
    pair = row_offsets.build_user_order_pair(src, dst, 50, 50, torch.int64)
    _check_pair(pair, src, dst, 50, 50, torch.int64)
    assert pair.extremes is None


def test_pair_extremes_saturate_at_the_index_dtype(device):
    """Indices beyond int32 in an int32 build are reported at int32's limits (still out of any
    int32 graph's range), exactly in an int64 build."""
    src = torch.tensor([0, 2**40, 1], device=device)
    dst = torch.tensor([1, -(2**35), 0], device=device)
    narrow = row_offsets.build_user_order_pair(src, dst, 3, 3, torch.int32, extrema=True)
    assert narrow.extremes.dtype == torch.int32 and narrow.extremes.tolist() == [0, -(2**31), 2**31 - 1, 1]
    wide = row_offsets.build_user_order_pair(src, dst, 3, 3, torch.int64, extrema=True)
    assert wide.extremes.dtype == torch.int64 and wide.extremes.tolist() == [0, -(2**35), 2**40, 1]
    # Clamped into range: destinations [1, 0, 0].
    assert narrow.csr.rowptr.tolist() == wide.csr.rowptr.tolist() == [0, 2, 3, 3]


def test_pair_clamps_indices_out_of_range(device):
    """Negative and too-large indices are clamped into their side's range in the copies and the
    counts, which stay consistent (nothing that reads the structure reads out of bounds), and show
    as given in the extremes, for the caller's check."""
    src = torch.tensor([0, -3, 1, 2, 7], device=device)
    dst = torch.tensor([1, 1, 9, -1, 0], device=device)
    pair = row_offsets.build_user_order_pair(src, dst, 3, 2, torch.int32, extrema=True)
    assert pair.extremes.tolist() == [-3, -1, 7, 9]
    clamped_src, clamped_dst = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([1, 1, 1, 0, 0])
    _check_pair(pair, clamped_src.to(device), clamped_dst.to(device), 3, 2, torch.int32)
    assert pair.csr.rowptr.tolist() == [0, 2, 5] and pair.csc.rowptr.tolist() == [0, 2, 3, 5]


def test_pair_rejects_mismatched_endpoints_and_index_dtypes():
    src = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="src, dst"):
        row_offsets.build_user_order_pair(src, src[:1], 2, 2, torch.int32)
    with pytest.raises(ValueError, match="src, dst"):
        row_offsets.build_user_order_pair(src.view(1, 2), src.view(1, 2), 2, 2, torch.int32)
    with pytest.raises(TypeError, match="index_dtype"):
        row_offsets.build_user_order_pair(src, src, 2, 2, torch.int16)
