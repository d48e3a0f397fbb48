"""Values derived from a graph's structure alone, and what a sampler records of the indices it made."""

import pytest
import torch

import pyg_ugrapher as ug
from pyg_ugrapher.structure import checked, largest_row, note_checked

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


def test_checked_index_facts_hold_while_the_index_is_unchanged_and_within_the_sizes():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 0, 2, 3]])
    assert checked(edge_index, 4, 4) is None  # nothing recorded
    note_checked(edge_index, 4, 1)
    assert checked(edge_index, 4, 4) == (edge_index._version, 4, 1)
    assert checked(edge_index, 5, 4) is not None  # larger sizes are still bounds
    assert checked(edge_index, 3, 4) is None and checked(edge_index, 4, 3) is None
    assert checked(edge_index.clone(), 4, 4) is None  # by the object, not its values
    edge_index[0, 0] = 7  # changed in place: the facts no longer hold
    assert checked(edge_index, 8, 8) is None
    with torch.inference_mode():
        frozen = torch.tensor([[0], [1]])
    note_checked(frozen, 2, 0)  # an inference tensor counts no changes: nothing is recorded
    assert checked(frozen, 2, 2) is None
