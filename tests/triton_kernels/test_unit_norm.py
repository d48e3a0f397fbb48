"""GCN's unit-weight normalisation kernels (``triton_kernels.unit_norm``) against the torch
formulation, on every graph case, with their outputs poisoned first (the ``poison`` fixture)."""

import pytest
import torch

from pyg_ugrapher.nn.gcn_conv import unit_norm_torch
from triton_kernels import unit_norm


@pytest.mark.parametrize("add_self_loops", [True, False], ids=["loops", "no_loops"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_kernels_match_torch(graph_case, graph_factory, device, poison, add_self_loops, dtype, index_dtype):
    g = graph_factory(graph_case)
    if g.num_src != g.num_dst:
        pytest.skip("GCN's graphs are square")
    src, dst = g.src.to(device, index_dtype), g.dst.to(device, index_dtype)
    got = unit_norm.unit_norm_weights(src, dst, g.num_dst, add_self_loops, dtype)
    want = unit_norm_torch(src.long(), dst.long(), g.num_dst, add_self_loops, dtype)
    assert got.dtype == dtype and got.shape == want.shape and got.device == want.device
    assert not got.isnan().any()
    tolerance = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=0)


def test_strided_endpoints(device):
    """Rows of a transposed ``[E, 2]`` index are strided views: read as such, not as contiguous."""
    pairs = torch.tensor([[1, 0], [2, 0], [0, 1], [3, 3], [2, 1]], device=device)
    index = pairs.t()
    got = unit_norm.unit_norm_weights(index[0], index[1], 4, True, torch.float32)
    torch.testing.assert_close(got, unit_norm_torch(index[0], index[1], 4, True, torch.float32))


def test_bad_input(device):
    src = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="src, dst"):
        unit_norm.unit_norm_weights(src, src[:1], 2, True, torch.float32)
    with pytest.raises(TypeError, match="src, dst"):
        unit_norm.unit_norm_weights(src.float(), src.float(), 2, True, torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        unit_norm.unit_norm_weights(src, src, 2, True, torch.int32)
