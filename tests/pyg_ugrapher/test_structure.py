"""Values derived from a graph's structure alone."""

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher.structure import largest_row

EDGES = torch.tensor([[0, 1, 2, 3, 0], [1, 1, 1, 0, 2]])


def test_largest_row_on_a_cpu_is_the_largest_degree():
    graph = ug.GraphTensor.from_edge_index(EDGES, 4)
    assert largest_row(graph.csr()) == 3  # destination 1
    assert largest_row(graph.csc()) == 2  # source 0
    empty = ug.GraphTensor.from_edge_index(torch.empty(2, 0, dtype=torch.int64), 3)
    assert largest_row(empty.csr()) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device-side probe needs a GPU")
def test_largest_row_on_a_gpu_arrives_without_a_sync():
    csr = ug.GraphTensor.from_edge_index(EDGES, 4).csr("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        first = largest_row(csr)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert first in (None, 3) and largest_row(csr) == 3
