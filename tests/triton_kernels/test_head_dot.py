"""GAT's backward total, per-head dot products (``triton_kernels.head_dot``), against the torch
product and sum, on random inputs of several shapes (heads wider than one block of features, odd
sizes, no rows) and dtypes, outputs poisoned first; bad input raises."""

import pytest
import torch

from triton_kernels.head_dot import head_dot

SHAPES = [(37, 4, 32), (5, 1, 200), (130, 3, 1), (1, 2, 7), (0, 4, 32), (6, 2, 0)]


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_torch(device, poison, check_close, shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    a, b = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(2))
    got = head_dot(a.to(device, dtype), b.to(device, dtype))
    assert got.shape == shape[:2] + (1,) and got.dtype == dtype
    want = (a.to(dtype).double() * b.to(dtype).double()).sum(-1, keepdim=True)
    check_close(got.cpu(), want.to(dtype), context=str(shape))


def test_strided_inputs(device, poison, check_close):
    """Views that are not contiguous (a transposed gradient) read as their values."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 50, 16, generator=gen).transpose(0, 1)
    b = torch.randn(50, 16, 4, generator=gen).transpose(1, 2)
    got = head_dot(a.to(device), b.to(device))
    check_close(got.cpu(), (a * b).sum(-1, keepdim=True))


@pytest.mark.parametrize(
    "change,error",
    [
        (lambda a, b: (a, b[:3]), ValueError),
        (lambda a, b: (a.view(6, 8), b.view(6, 8)), ValueError),
        (lambda a, b: (a, b.double()), ValueError),
        (lambda a, b: (a.long(), b.long()), TypeError),
        (lambda a, b: (a, None), TypeError),
    ],
)
def test_bad_input(device, change, error):
    a, b = torch.zeros(6, 2, 4, device=device), torch.zeros(6, 2, 4, device=device)
    with pytest.raises(error, match="^a, b:"):
        head_dot(*change(a, b))
