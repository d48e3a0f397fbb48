"""The outputs and scratch buffers of the kernels, allocated as the kernels fill them.

A kernel that writes every element of its output gets it uninitialised (:func:`uninitialised`: the
tests fill such outputs with NaN, so that an element a kernel forgets shows); partial results that
meet through atomics accumulate in :func:`atomic_dtype`.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor


def atomic_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where atomics accumulate partial results: half types would lose precision across many
    partials, so they accumulate in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def uninitialised(shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An output whose every element the kernel writes (the tests fill it with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)
