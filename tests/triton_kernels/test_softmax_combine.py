"""The combining kernel of split rows' partial softmax sums (``triton_kernels.softmax_combine``)
against the same combination in float64 torch, on random partials of chunks of one to 300 slots,
with partial maxima far apart (rescaled, not overflowing); other rows are left as they were."""

import pytest
import torch

from triton_kernels import softmax_combine

GROUP_SIZE = 4


def _partials(degrees, heads, channels, device, spread=1.0, seed=0):
    """A graph whose rows have ``degrees``, its split rows, their first slots and random partials."""
    gen = torch.Generator().manual_seed(seed)
    degree = torch.tensor(degrees)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.int64), degree.cumsum(0)])
    counts = (degree + GROUP_SIZE - 1) // GROUP_SIZE
    split = torch.nonzero(degree > GROUP_SIZE).view(-1)
    slot_start = torch.cat([torch.zeros(1, dtype=torch.int64), counts[split].cumsum(0)[:-1]])
    num_slots = int(counts[split].sum())
    part = torch.randn(num_slots, heads * channels, generator=gen, dtype=torch.float64)
    part_max = torch.randn(num_slots, heads, generator=gen, dtype=torch.float64) * spread
    part_sum = torch.rand(num_slots, heads, generator=gen, dtype=torch.float64) * 5 + 0.5
    on = [t.to(device) for t in (split, slot_start, rowptr)]
    return on, (part, part_max, part_sum), counts[split]


def _expected(split, slot_start, counts, part, part_max, part_sum, channels):
    outs, normalisers = [], []
    for first, count in zip(slot_start.tolist(), counts.tolist()):
        chunks = slice(first, first + count)
        largest = part_max[chunks].max(0).values
        scale = (part_max[chunks] - largest).exp()
        total = (part_sum[chunks] * scale).sum(0) + 1e-16
        weighted = (part[chunks] * scale.repeat_interleave(channels, 1)).sum(0)
        outs.append(weighted / total.repeat_interleave(channels))
        normalisers.append(largest + total.log())
    return torch.stack(outs), torch.stack(normalisers)


@pytest.mark.parametrize("heads,channels", [(4, 8), (1, 12), (3, 1), (2, 80)])
@pytest.mark.parametrize("spread", [1.0, 500.0], ids=["close", "far"])
def test_matches_torch(device, heads, channels, spread):
    degrees = [0, 3, 4, 5, 9, 1200, 2, 17, 8, 4, 33, 0, 13]
    (split, slot_start, rowptr), partials, counts = _partials(degrees, heads, channels, device, spread)
    part, part_max, part_sum = (t.float().to(device) for t in partials)
    rows, width = len(degrees), heads * channels
    out = torch.full((rows, width), 7.0, device=device)
    normaliser = torch.full((rows, heads), 7.0, device=device)
    softmax_combine.combine(split, slot_start, rowptr, part, part_max, part_sum, out, normaliser, GROUP_SIZE, channels)
    want_out, want_normaliser = _expected(split.cpu(), slot_start.cpu(), counts, *partials, channels)
    got_out, got_normaliser = out.cpu().double(), normaliser.cpu().double()
    error = ((got_out[split.cpu()] - want_out).abs().max() / want_out.abs().max()).item()
    assert error < 1e-5, f"out: relative error {error:.2e}"
    assert (got_normaliser[split.cpu()] - want_normaliser).abs().max().item() < 1e-4
    assert torch.isfinite(got_out).all() and torch.isfinite(got_normaliser).all()
    others = torch.ones(rows, dtype=torch.bool)
    others[split.cpu()] = False
    assert torch.all(got_out[others] == 7.0) and torch.all(got_normaliser[others] == 7.0)


def test_no_split_rows_writes_nothing(device):
    (split, slot_start, rowptr), partials, _ = _partials([1, 2, 0, 4], 2, 4, device)
    assert split.numel() == 0
    out, normaliser = torch.zeros(4, 8, device=device), torch.zeros(4, 2, device=device)
    empty = torch.zeros(1, 8, device=device), torch.zeros(1, 2, device=device), torch.zeros(1, 2, device=device)
    softmax_combine.combine(split, slot_start, rowptr, *empty, out, normaliser, GROUP_SIZE, 4)
    assert torch.all(out == 0) and torch.all(normaliser == 0)


def test_bad_shapes(device):
    (split, slot_start, rowptr), partials, _ = _partials([9, 1], 2, 4, device)
    part, part_max, part_sum = (t.float().to(device) for t in partials)
    out, normaliser = torch.zeros(2, 8, device=device), torch.zeros(2, 2, device=device)
    with pytest.raises(ValueError, match="^out, normaliser, part:"):
        softmax_combine.combine(split, slot_start, rowptr, part, part_max, part_sum, out, normaliser, GROUP_SIZE, 3)
    with pytest.raises(ValueError, match="^out, normaliser, part:"):
        softmax_combine.combine(
            split, slot_start, rowptr, part[:, :4], part_max, part_sum, out, normaliser, GROUP_SIZE, 4
        )
