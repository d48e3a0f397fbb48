"""GPU names as short slugs, and the architecture of the GPUs a model can be named after.

A model file is ``autotune/models/<slug>.json`` and a benchmark's results folder
``benchmarks/results/<slug>/``, both named by :func:`gpu_slug` of the device's name
(``torch.cuda.get_device_name``). :data:`CAPABILITY` gives the compute capability behind a slug,
so that a GPU without a model of its own can take the model of its nearest architecture
(:func:`autotune.selection.model_for`).

This module imports nothing of the project: ``benchmarks`` names its folders with it too.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

#: Words of a device name that name a vendor or a product line, not the GPU.
_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla", "amd", "radeon", "instinct", "quadro"})

#: Compute capability ``(major, minor)`` of the data-centre and workstation GPUs a model may be
#: trained on, by slug, oldest first within a capability (a later entry is the newer GPU).
CAPABILITY: Dict[str, Tuple[int, int]] = {
    "v100": (7, 0),
    "t4": (7, 5),
    "rtx2080": (7, 5),
    "a100": (8, 0),
    "a30": (8, 0),
    "rtx3090": (8, 6),
    "a10": (8, 6),
    "a10g": (8, 6),
    "a40": (8, 6),
    "rtxa6000": (8, 6),
    "rtx4090": (8, 9),
    "l4": (8, 9),
    "l40": (8, 9),
    "l40s": (8, 9),
    "rtx6000": (8, 9),
    "h100": (9, 0),
    "gh200": (9, 0),
    "h200": (9, 0),
    "b200": (10, 0),
    "gb200": (10, 0),
    "rtx5090": (12, 0),
}


def gpu_slug(name: str) -> str:
    """A short name for a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA H200`` ->
    ``h200``, ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``;
    ``cpu`` for a CPU. The words of the name up to the first one with a digit, without vendor
    words, joined."""
    if not name or name.lower().startswith("cpu"):
        return "cpu"
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _VENDOR_WORDS]
    picked: List[str] = []
    for word in words:
        picked.append(word)
        if any(c.isdigit() for c in word):
            break
    return "".join(picked) or "gpu"
