"""GraphTensor: construction, cached structures, CSR <-> user edge order, statistics, reordering and
every validation error."""

import contextlib
import dataclasses
import gc
import weakref

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.data import Data

import pyg_ugrapher as ug
from pyg_ugrapher import graph as graph_module
from pyg_ugrapher import reference
from pyg_ugrapher import structure as structure_module
from pyg_ugrapher.graph import GraphTensor
from pyg_ugrapher.structure import GraphStructure, in_user_order, index_dtype_for, split_chunk_slots, split_rows
from triton_kernels import csr_pair


def _edge_set(src, dst):
    return sorted(zip(src.tolist(), dst.tolist()))


def test_from_edge_index_infers_sizes():
    edge_index = torch.tensor([[0, 2, 3], [1, 1, 0]])
    g = GraphTensor.from_edge_index(edge_index)
    assert (g.num_src, g.num_dst, g.num_edges) == (4, 4, 3)
    assert torch.equal(g.edge_index, edge_index)
    assert not g.is_bipartite and "num_nodes=4" in repr(g)


def test_from_edge_index_sizes_and_int32_input():
    edge_index = torch.tensor([[0, 2, 3], [1, 1, 0]], dtype=torch.int32)
    assert GraphTensor.from_edge_index(edge_index, 6).num_dst == 6
    g = GraphTensor.from_edge_index(edge_index, (5, 2))
    assert (g.num_src, g.num_dst) == (5, 2) and g.is_bipartite
    assert g.src.dtype == torch.int64 and "num_src=5, num_dst=2" in repr(g)
    assert GraphTensor.from_edge_index(edge_index, [5, 2]).num_src == 5


def test_from_pyg_edge_index_and_data():
    edge_index = torch.tensor([[0, 2, 3], [1, 1, 0]])
    g = GraphTensor.from_edge_index(EdgeIndex(edge_index, sparse_size=(6, 3)))
    assert (g.num_src, g.num_dst) == (6, 3)
    assert type(g.src) is torch.Tensor
    unsized = GraphTensor.from_edge_index(EdgeIndex(edge_index))
    assert (unsized.num_src, unsized.num_dst) == (4, 4)
    data = GraphTensor.from_data(Data(edge_index=edge_index, num_nodes=7))
    assert (data.num_src, data.num_dst) == (7, 7)
    with pytest.raises(ValueError, match="^data:"):
        GraphTensor.from_data(Data(x=torch.zeros(3, 1)))


def test_structures_are_cached(graph_factory):
    g = graph_factory("mixed")
    assert g.csr() is g.csr() and g.csr("cpu") is g.csr()
    assert g.csc() is g.csc() and g.csc() is g.reverse().csr()
    assert g.reverse() is g.reverse() and g.reverse().reverse() is g
    assert g.reverse().csc() is g.csr()
    assert g.coo() is g.coo()
    assert g.stats() is g.stats()
    assert g.chunks(4) is g.chunks(4) and g.chunks(4) is not g.chunks(8)
    structure = g.structure()
    assert structure.csr is g.csr() and structure.csc is g.csc() and g.structure() is structure


def test_edges_changed_in_place_rebuild_the_structures(graph_factory):
    """A graph's structures follow its edge tensor's in-place changes (they were stale: the
    operators ran on the old edges), on the graph and on its reverse, whose CSR is the graph's CSC;
    an index changed out of range is refused as at construction."""
    edge_index = graph_factory("mixed").edge_index.clone()
    g = GraphTensor.from_edge_index(edge_index, 12)
    x = torch.randn(12, 3, dtype=torch.float64)
    ug.compute(g, "copy_u_sum", x)
    old_csr, old_csc = g.csr(), g.csc()
    with torch.no_grad():
        edge_index[1, :5] = torch.tensor([0, 0, 1, 1, 2])
        edge_index[0, -3:] = 4
    for graph in (g.reverse(), g):  # the reverse sees the change first: both must drop their caches
        expected = torch.zeros(12, 3, dtype=torch.float64).index_add_(0, graph.dst, x[graph.src])
        torch.testing.assert_close(ug.compute(graph, "copy_u_sum", x), expected, rtol=0, atol=1e-12)
    assert g.csr() is not old_csr and g.csc() is not old_csc and g.csc() is g.reverse().csr()
    assert _edge_set(*g.coo()) == _edge_set(edge_index[0], edge_index[1])
    with torch.no_grad():
        edge_index[0, 0] = 12
    with pytest.raises(ValueError, match="source index 12 out of range"):
        g.structure()


def test_identity_map_keys_by_identity_and_forgets_dead_keys():
    """Equal tensors are different keys; an entry goes with its key, and an id the allocator
    reuses for a new object does not find the old entry."""
    cache = structure_module.IdentityMap()
    a, b = torch.zeros(3), torch.zeros(3)
    cache[a] = "a"
    cache[b] = "b"
    cache[a] = "a again"
    assert cache.get(a) == "a again" and cache[b] == "b" and len(cache) == 2
    assert cache.get(torch.zeros(3)) is None and cache.get(torch.zeros(3), 7) == 7
    with pytest.raises(KeyError):
        cache[torch.ones(1)]
    ident = id(a)
    del a
    assert len(cache) == 1
    for _ in range(100):  # a new object at the dead key's address is not that key
        c = torch.zeros(3)
        if id(c) == ident:
            break
    assert cache.get(c) is None


def test_csr_round_trip(graph_case, graph_factory):
    g = graph_factory(graph_case)
    for graph in (g, g.reverse()):
        csr = graph.csr()
        rows = csr.rows.long()
        eid = csr.eid.long()
        assert csr.rowptr.numel() == graph.num_dst + 1 and csr.num_cols == graph.num_src
        assert torch.equal(torch.sort(eid).values, torch.arange(graph.num_edges))
        # Position p of the CSR is the user's edge eid[p]: same endpoints, rows sorted, and the
        # user's order kept among the edges of one row (a stable sort).
        assert torch.equal(csr.col.long(), graph.src[eid]) and torch.equal(rows, graph.dst[eid])
        assert torch.all(rows[1:] >= rows[:-1])
        same_row = rows[1:] == rows[:-1]
        assert torch.all(eid[1:][same_row] > eid[:-1][same_row])
        expanded = torch.repeat_interleave(torch.arange(graph.num_dst), csr.rowptr.diff().long())
        assert torch.equal(expanded, rows)
    assert _edge_set(g.csc().col.long(), g.csc().rows.long()) == _edge_set(g.dst, g.src)


@pytest.mark.parametrize("wide_keys", [False, True], ids=["int32-keys", "int64-keys"])
def test_csr_pair_matches_one_direction_builds(graph_case, graph_factory, wide_keys, monkeypatch):
    g = graph_factory(graph_case)
    src, dst = g.coo()
    if wide_keys:
        # Row keys past int32 (num_src + num_dst over 2^31 - 1) are sorted as int64.
        monkeypatch.setattr(csr_pair, "INT32_MAX", 0)
    pair = csr_pair.build_csr_pair(src, dst, g.num_src, g.num_dst, g.index_dtype)
    single = (
        structure_module.build_csr(dst, src, g.num_dst, g.num_src, g.index_dtype),
        structure_module.build_csr(src, dst, g.num_src, g.num_dst, g.index_dtype),
    )
    for built, expected in zip(pair, single):
        assert built.num_cols == expected.num_cols
        for field in ("rowptr", "col", "eid", "rows"):
            got, want = getattr(built, field), getattr(expected, field)
            assert got.dtype == want.dtype == g.index_dtype and torch.equal(got, want), field


def test_structure_op_outputs_share_no_memory(graph_case, graph_factory):
    """The ``graph_structure`` custom op returns both directions' arrays; torch refuses a custom op
    whose outputs alias one another (checked at every call), so each array has its own storage."""
    g = graph_factory(graph_case)
    src, dst = g.coo()
    structure = graph_module.graph_structure(src, dst, g.num_src, g.num_dst)
    expected = g.structure().flat()
    assert all(torch.equal(got, want) for got, want in zip(structure, expected, strict=True))
    filled = [t for t in structure if t.numel()]
    assert len({t.untyped_storage().data_ptr() for t in filled}) == len(filled)
    # Nor is any a view: caches find a structure by the identity of its arrays, which a view saved
    # for a compiled backward pass does not keep (see test_compile).
    assert all(t._base is None for t in g.structure().flat())


def test_structure_op_builds_a_graph_once(graph_factory, monkeypatch):
    """What a compiled graph calls for a structure not built before: kept with ``src`` (its
    arrays new, never the inputs), so the same edges are not sorted again; built again when either
    array changes in place or ``src`` comes with another ``dst``, and never kept where nothing may
    be. Every build is the graph's own sorted structure, in the index dtype asked for."""
    g = graph_factory("mixed")
    expected = g.structure(sort=True).flat()
    builds = []
    original = graph_module.build_csr_pair
    monkeypatch.setattr(graph_module, "build_csr_pair", lambda *args: builds.append(1) or original(*args))
    src, dst = g.src.clone(), g.dst.clone()

    def built(source=src, target=dst):
        return graph_module.graph_structure(source, target, g.num_src, g.num_dst, g.index_dtype)

    first = built()
    assert all(got.dtype == g.index_dtype and torch.equal(got, want) for got, want in zip(first, expected, strict=True))
    inputs = {src.untyped_storage().data_ptr(), dst.untyped_storage().data_ptr()}
    assert not inputs & {t.untyped_storage().data_ptr() for t in first if t.numel()}
    assert all(a is b for a, b in zip(built(), first, strict=True)) and len(builds) == 1
    dst[0] = (dst[0] + 1) % g.num_dst  # in place: the structure is stale
    changed = built()
    assert len(builds) == 2 and not torch.equal(changed[1], first[1])
    moved = GraphTensor(src, dst, g.num_src, g.num_dst, index_dtype=g.index_dtype).structure(sort=True).flat()
    assert all(torch.equal(a, b) for a, b in zip(changed, moved, strict=True)) and len(builds) == 3
    other = torch.flip(dst, [0])
    built(target=other)
    assert len(builds) == 4
    with structure_module.keeping_nothing():
        unkept = built()
    assert len(builds) == 5 and all(a is not b for a, b in zip(unkept, built(), strict=True))
    assert len(builds) == 6  # the entry of ``other`` replaced the first pair's


def test_structure_op_keeps_nothing_alive():
    """The structure kept with ``src`` holds its ``dst`` weakly: where ``dst`` is a view of ``src``
    (every edge a self loop), the entry dies with the arrays."""
    src = torch.tensor([0, 1, 2, 2])
    dst = src[:]
    built = graph_module.graph_structure(src, dst, 3, 3)
    assert torch.equal(built[1], torch.tensor([0, 1, 2, 2]))  # the CSR's sources
    alive = weakref.ref(src)
    del src, dst, built
    gc.collect()
    assert alive() is None


def test_compiled_calls_on_a_new_graph_sort_it_once(graph_factory, monkeypatch, check_close):
    """A compiled ``ug.compute`` on a graph whose structure no eager call built builds it inside the
    compiled graph on its first call only; the results are the reference's at every call."""
    torch._dynamo.reset()
    builds = []
    original = graph_module.build_csr_pair
    monkeypatch.setattr(graph_module, "build_csr_pair", lambda *args: builds.append(1) or original(*args))
    g = graph_factory("hub")
    compiled = torch.compile(lambda x: ug.compute(g, "copy_u_sum", x), fullgraph=True, backend="aot_eager")
    for seed in range(3):
        x = torch.randn(g.num_src, 5, generator=torch.Generator().manual_seed(seed))
        check_close(compiled(x), reference.execute(g, ug.OpInfo.from_name("copy_u_sum"), [x]), context=f"call {seed}")
    assert len(builds) == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("on", ["torch", "kernel"])
def test_user_order_structure(graph_case, graph_factory, on, request):
    """``structure(sort=False)``: both directions' edges stay in the user's order, with the sorted
    structures' row offsets, and are grouped by row, as the sorted build does, on demand. The row
    offsets come from torch operations on the CPU and from the degree-count kernel where kernels run."""
    if on == "kernel":
        request.getfixturevalue("interpret")
    g = graph_factory(graph_case)
    structure = g.structure(sort=False)
    sorted_structure = g.structure(sort=True)
    src, dst = g.coo()
    csr, csc = structure.csr, structure.csc
    assert csr.col is src and csr.rows is dst and csc.col is dst and csc.rows is src
    assert structure.src is src and structure.dst is dst
    assert csr.user_order and csc.user_order and (csr.num_cols, csc.num_cols) == (g.num_src, g.num_dst)
    for eid in (csr.eid, csc.eid):
        assert eid.dtype == g.index_dtype and torch.equal(eid.long(), torch.arange(g.num_edges))
    for got, want in ((csr.rowptr, g.csr().rowptr), (csc.rowptr, g.csc().rowptr)):
        assert got.dtype == g.index_dtype and torch.equal(got, want)
        assert in_user_order(got) and not in_user_order(want)
    assert sorted_structure.csr is g.csr()
    # Flattened for a custom op and read back, it is the same structure, still in the user's order.
    back = GraphStructure.from_flat(structure.flat())
    assert all(a is b for a, b in zip(back.flat(), structure.flat(), strict=True))
    assert back.csr.user_order and back.csc.user_order and (back.num_src, back.num_dst) == (g.num_src, g.num_dst)
    for user, expected in ((csr, g.csr()), (csc, g.csc())):
        grouped = csr_pair.grouped(user)
        assert grouped is csr_pair.grouped(user) and not grouped.user_order
        for field in ("rowptr", "col", "eid", "rows"):
            assert torch.equal(getattr(grouped, field), getattr(expected, field)), field
    assert csr_pair.grouped(g.csr()) is g.csr()


def test_default_structure_order(graph_factory, monkeypatch):
    """The default order is :func:`autotune.selection.reads_user_order`'s (a small GPU graph's
    kernels read the user's order), cached apart from an explicitly sorted one; a compiled caller
    gets a sorted one."""
    from autotune import selection

    g = graph_factory("mixed")
    assert not in_user_order(g.structure().csr.rowptr)
    monkeypatch.setattr(selection, "reads_user_order", lambda num_edges, device: num_edges == g.num_edges)
    fresh = graph_factory("mixed")
    default = fresh.structure()
    assert default.csr.user_order and in_user_order(default.csr.rowptr) and fresh.structure() is default
    assert not in_user_order(fresh.structure(sort=True).csr.rowptr)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not in_user_order(graph_factory("mixed").structure().csr.rowptr)
    assert not in_user_order(fresh.structure().csr.rowptr)


def _summed(graph, x):
    return torch.zeros(graph.num_dst, x.size(1), dtype=x.dtype).index_add_(0, graph.dst, x[graph.src])


def test_eager_calls_keep_the_user_order(graph_factory, user_order):
    """Eager steps on a small graph are bound by host time: however many calls a user-order
    structure serves, it stays (no sort, the small-graph rule), and results and gradients are the
    reference's."""
    g = graph_factory("mixed")
    x = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    first = g.structure()
    for _ in range(40):
        out = ug.compute(g, "copy_u_sum", x)
        (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
        torch.testing.assert_close(out, _summed(g, x.detach()), rtol=0, atol=1e-12)
        torch.testing.assert_close(grad, _summed(g.reverse(), torch.ones_like(out)), rtol=0, atol=1e-12)
    assert g.structure() is first and first.csr.user_order
    assert not structure_module.marked_reused(first.csr.rowptr)


def _count_builds(monkeypatch):
    """The calls of the user-order builder that :class:`GraphTensor` makes, and of the separate range check."""
    calls = {"build": 0, "check": 0}
    build, check = graph_module.build_user_order_pair, graph_module.validate_endpoints

    def counted_build(*args, **kwargs):
        calls["build"] += 1
        return build(*args, **kwargs)

    def counted_check(*args, **kwargs):
        calls["check"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(graph_module, "build_user_order_pair", counted_build)
    monkeypatch.setattr(graph_module, "validate_endpoints", counted_check)
    return calls


def test_a_small_graph_is_checked_by_the_build_of_its_structure(
    graph_case, graph_factory, interpret, user_order, monkeypatch
):
    """Where kernels run and a graph's structure keeps the user's order (a small GPU graph's), the
    graph is checked at construction by the kernel that builds that structure, which its first
    operator call then reads: one build, no separate check, the structures and results of a graph
    checked apart (every kind of graph: empty, isolated vertices, a hub, self loops, duplicates,
    bipartite)."""
    want = graph_factory(graph_case)
    reference_structure = want.structure(sort=False)
    calls = _count_builds(monkeypatch)
    g = GraphTensor(want.src, want.dst, want.num_src, want.num_dst)
    built_now = g.num_edges > 0
    assert calls == {"build": int(built_now), "check": int(not built_now)}
    structure = g.structure()
    assert calls["build"] == 1 and g.structure() is structure and structure.csr.user_order
    assert structure.src is g.coo()[0] and structure.csr.col is structure.src and structure.csc.col is structure.dst
    assert all(torch.equal(a, b) for a, b in zip(structure.flat(), reference_structure.flat(), strict=True))
    x = torch.randn(g.num_src, 8)
    torch.testing.assert_close(ug.compute(g, "copy_u_sum", x), _summed(want, x))
    assert calls["build"] == 1


def test_a_small_graph_made_in_inference_mode_builds_a_structure_training_can_read(interpret, user_order):
    """The structure built at construction is made outside inference mode, as a structure built at
    its first use in training would be: a step may save it for its backward pass."""
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    with torch.inference_mode():
        g = GraphTensor.from_edge_index(edge_index, 3)
    structure = g.structure()
    assert structure.csr.user_order and not any(t.is_inference() for t in structure.flat())
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(ug.compute(g, "copy_u_sum", x).sum(), x)
    torch.testing.assert_close(grad, _summed(g.reverse(), torch.ones(3, 4, dtype=torch.float64)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "src,dst,num_src,num_dst,message",
    [
        ([0, 5], [1, 0], 4, 4, "source index 5 out of range for num_src=4"),
        ([0, 1], [1, 4], 5, 4, "destination index 4 out of range for num_dst=4"),
        ([0, -1], [1, 0], 4, 4, "negative vertex index -1"),
        ([0, 1], [-7, 0], 4, 4, "negative vertex index -7"),
        ([0, 0], [0, 0], 0, 1, "source index 0 out of range for num_src=0"),
        ([0, 2**40], [1, 0], 4, 4, f"source index {2**40} out of range for num_src=4"),
        ([0, 1], [-(2**33), 0], 4, 4, f"negative vertex index {-(2**33)}"),
    ],
)
def test_the_build_that_checks_a_small_graph_refuses_bad_indices(
    src, dst, num_src, num_dst, message, interpret, user_order, monkeypatch
):
    """The range errors of a graph checked by its structure's build are the separate check's, with
    the exact index also where it lies beyond the index dtype (int32 here)."""
    calls = _count_builds(monkeypatch)
    with pytest.raises(ValueError, match=f"^edge_index: {message}$"):
        GraphTensor(torch.tensor(src), torch.tensor(dst), num_src, num_dst)
    # The exact check reads the edges again only to name an index beyond the index dtype; a side
    # of no vertex is refused by that check alone (nothing to clamp into).
    if min(num_src, num_dst) == 0:
        assert calls == {"build": 0, "check": 1}
    else:
        assert calls == {"build": 1, "check": int(max(abs(i) for i in src + dst) >= 2**31)}
    with pytest.raises(ValueError, match=f"^edge_index: {message}$"):
        graph_module.validate_endpoints(torch.tensor(src), torch.tensor(dst), num_src, num_dst)


@pytest.fixture
def answer_held_back(monkeypatch):
    """Range checks whose device answer has not arrived (as on a GPU that is still busy) until the
    test sets ``held[0] = False``; no check is left pending from an earlier test."""
    monkeypatch.setattr(graph_module, "_PENDING_CHECKS", [])
    held = [True]
    ready = graph_module.RangeCheck.ready
    monkeypatch.setattr(graph_module.RangeCheck, "ready", lambda check: not held[0] and ready(check))
    return held


def test_a_range_check_waits_for_no_answer_and_reports_later(interpret, user_order, answer_held_back):
    """Construction reads no answer that has not arrived: a bad index passes it, its structure holds
    the index clamped into range (nothing outside the tensors is read), and once the answer is
    there the graph's next call raises ValueError naming the index, as does every call after."""
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 9, 0])
    g = GraphTensor(src, dst, 4, 4)
    x = torch.randn(4, 8)
    structure = g.structure()  # the answer is still on its way
    for array, size in ((structure.src, 4), (structure.dst, 4)):
        assert int(array.min()) >= 0 and int(array.max()) < size
    assert structure.dst.tolist() == [1, 2, 3, 0]
    clamped = GraphTensor(src, torch.tensor([1, 2, 3, 0]), 4, 4)
    torch.testing.assert_close(ug.compute(g, "copy_u_sum", x), _summed(clamped, x))
    answer_held_back[0] = False
    for _ in range(2):
        with pytest.raises(ValueError, match="^edge_index: destination index 9 out of range for num_dst=4$"):
            ug.compute(g, "copy_u_sum", x)
    with pytest.raises(ValueError, match="destination index 9"):  # the reverse shares the check
        ug.compute(g.reverse(), "copy_u_sum", x)
    GraphTensor(torch.tensor([0]), torch.tensor([1]), 4, 4)  # reported already: not again


def test_a_bad_graph_is_reported_by_the_next_graph_built(interpret, user_order, answer_held_back):
    """A graph that is never used again (a sampler's last batch) has its failed check raised by the
    construction of the next graph, once, naming the earlier graph; a good graph's check passes
    silently; a sort (not a sampler's new graph's path) waits for the answer."""
    GraphTensor(torch.tensor([0, -2]), torch.tensor([1, 0]), 3, 3)
    good = GraphTensor(torch.tensor([0, 1]), torch.tensor([1, 2]), 3, 3)
    assert len(graph_module._PENDING_CHECKS) == 2
    answer_held_back[0] = False
    with pytest.raises(
        ValueError,
        match=r"^edge_index: negative vertex index -2, in a graph built earlier \(num_src=3, num_dst=3, 2 edges\)",
    ):
        GraphTensor(torch.tensor([0]), torch.tensor([1]), 3, 3)
    assert graph_module._PENDING_CHECKS == []
    GraphTensor(torch.tensor([0]), torch.tensor([1]), 3, 3)  # reported once
    assert good._range_check.passed  # in the same poll; its next use lets it go
    good.structure()
    assert good._range_check is None
    answer_held_back[0] = True
    waited = GraphTensor(torch.tensor([0, 1]), torch.tensor([2, 1]), 3, 3)
    assert waited._range_check is not None
    with pytest.raises(ValueError, match="^edge_index: destination index 2 out of range for num_dst=2$"):
        GraphTensor(torch.tensor([0, 1]), torch.tensor([2, 1]), 3, 2).csr()
    waited.csr()
    assert waited._range_check is None


def test_validate_checks_at_once(interpret, user_order, answer_held_back):
    """``validate()`` waits for a pending check's answer (or checks the whole graph) and returns the
    graph: a bad index raises there, not at a later call; a graph built unchecked is checked too."""
    bad = GraphTensor(torch.tensor([0, 1]), torch.tensor([1, 7]), 3, 3)
    with pytest.raises(ValueError, match="^edge_index: destination index 7 out of range for num_dst=3$"):
        bad.validate()
    good = GraphTensor(torch.tensor([0, 1]), torch.tensor([1, 2]), 3, 3)
    assert good.validate() is good and good._range_check is None and good.validate() is good
    unchecked = GraphTensor(torch.tensor([0, -1]), torch.tensor([1, 2]), 3, 3, validate=False)
    with pytest.raises(ValueError, match="^edge_index: negative vertex index -1$"):
        unchecked.validate()


def test_edges_fixed_in_place_clear_a_pending_failure(interpret, user_order, answer_held_back):
    """Edges changed in place are checked again at once (with a sync): a fixed index clears the
    failure the answer about the old edges would report."""
    dst = torch.tensor([1, 5])
    g = GraphTensor(torch.tensor([0, 1]), dst, 3, 3)
    dst[1] = 2
    x = torch.randn(3, 4)
    torch.testing.assert_close(ug.compute(g, "copy_u_sum", x), _summed(g, x))
    answer_held_back[0] = False
    torch.testing.assert_close(ug.compute(g, "copy_u_sum", x), _summed(g, x))
    GraphTensor(torch.tensor([0]), torch.tensor([1]), 3, 3)  # the old answer raises nothing


@pytest.mark.cuda
def test_new_gpu_graphs_are_built_and_checked_without_a_sync(user_order):
    """A sampler's new graph every step: SAGE training calls on new small GPU graphs wait for the
    GPU nowhere (``torch.cuda.set_sync_debug_mode("error")``), and a graph with an index out of
    range raises ValueError at a later call, its results meanwhile those of the clamped index."""
    gen = torch.Generator().manual_seed(0)
    layer = ug.nn.SAGEConv(16, 8).cuda()
    x = torch.randn(500, 16, generator=gen).cuda()

    def new_graph() -> torch.Tensor:
        return torch.randint(0, 500, (2, 3000), generator=gen).cuda()

    for _ in range(3):  # compiles the kernels
        layer(x, new_graph()).sum().backward()
    graphs = [new_graph() for _ in range(5)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for edge_index in graphs:
            layer(x, edge_index).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    bad = new_graph()
    clamped = bad.clone()
    bad[1, 7], clamped[1, 7] = 500, 499
    want = layer(x, clamped)
    torch.cuda._sleep(100_000_000)  # a busy GPU: the answer cannot come back within the call
    out = layer(x, bad)
    torch.testing.assert_close(out, want)
    with pytest.raises(
        ValueError, match="destination index 500 out of range for num_dst=500, in a graph built earlier"
    ):
        layer(x, new_graph())


def test_graph_read_while_a_step_is_recorded_is_sorted_at_once(graph_case, graph_factory, executor, user_order):
    """A whole step being recorded pays its host time once: a graph it reads gets the sorted
    structure, marked as read by a recorded step, at its first call, and a user-order one built
    before is replaced at its next call; results match the exact sum on every kind of graph
    (empty, isolated vertices, a hub, self loops, duplicates, bipartite)."""
    fresh = graph_factory(graph_case)
    seen_before = graph_factory(graph_case, seed=1)
    x = torch.randn(fresh.num_src, 8)
    assert seen_before.eager_structure(x.device).csr.user_order
    with structure_module.recording_steps():
        for g in (fresh, seen_before):
            torch.testing.assert_close(ug.compute(g, "copy_u_sum", x), _summed(g, x))
            built = g.eager_structure(x.device)
            assert not built.csr.user_order and structure_module.marked_reused(built.csr.rowptr)
    torch.testing.assert_close(ug.compute(fresh, "copy_u_sum", x), _summed(fresh, x))


def test_index_dtype():
    assert index_dtype_for(2**31 - 1, 2**31 - 1) == torch.int32
    assert index_dtype_for(2**31, 5) == torch.int64
    assert index_dtype_for(5, 2**31) == torch.int64
    g = GraphTensor.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    assert g.index_dtype == torch.int32
    assert all(t.dtype == torch.int32 for t in g.structure().flat())
    wide = GraphTensor.from_edge_index(torch.tensor([[0, 1], [1, 0]]), index_dtype=torch.int64)
    assert all(t.dtype == torch.int64 for t in wide.structure().flat())
    # Without building anything: a graph past int32 gets int64, and refuses a forced int32.
    empty = torch.empty(0, dtype=torch.int64)
    assert GraphTensor(empty, empty, 2**31, 4).index_dtype == torch.int64
    with pytest.raises(ValueError, match="^index_dtype:"):
        GraphTensor(empty, empty, 2**31, 4, index_dtype=torch.int32)
    with pytest.raises(TypeError, match="^index_dtype:"):
        GraphTensor(empty, empty, 3, 4, index_dtype=torch.float32)


def _numpy_stats(degree: np.ndarray, num_edges: int):
    d = degree.astype(np.float64)
    std = d.std()
    skew = ((d - d.mean()) ** 3).mean() / std**3 if std > 0 else 0.0
    k = max(1, int(np.ceil(0.01 * d.size)))
    top = np.sort(d)[::-1][:k].sum() / max(num_edges, 1)
    return [d.mean(), std, d.max(), skew, top, (degree == 0).mean()]


@pytest.mark.parametrize("host_max_degrees", [0, structure_module.HOST_STATS_MAX_DEGREES], ids=["device", "host"])
def test_stats_match_numpy(graph_case, graph_factory, host_max_degrees, monkeypatch):
    """Both ways of summarising the degrees: on their device, or copied to the host first."""
    monkeypatch.setattr(structure_module, "HOST_STATS_MAX_DEGREES", host_max_degrees)
    g = graph_factory(graph_case)
    stats = g.stats()
    assert (stats.num_rows, stats.num_cols, stats.num_edges) == (g.num_dst, g.num_src, g.num_edges)
    in_degree = np.bincount(g.dst.numpy(), minlength=g.num_dst)
    out_degree = np.bincount(g.src.numpy(), minlength=g.num_src)
    for side, degree in ((stats.rows, in_degree), (stats.cols, out_degree)):
        got = [side.mean, side.std, side.max, side.skew, side.top1_fraction, side.isolated_fraction]
        np.testing.assert_allclose(got, _numpy_stats(degree, g.num_edges), rtol=1e-12, atol=1e-12)
    assert torch.equal(g.in_degree(), torch.from_numpy(in_degree))
    assert torch.equal(g.out_degree(), torch.from_numpy(out_degree))


def _flat(stats) -> list:
    return [
        stats.num_rows,
        stats.num_cols,
        stats.num_edges,
        *dataclasses.astuple(stats.rows),
        *dataclasses.astuple(stats.cols),
    ]


@pytest.mark.cuda
@pytest.mark.parametrize("host_max_degrees", [0, structure_module.HOST_STATS_MAX_DEGREES], ids=["device", "host"])
def test_stats_on_the_gpu_match_the_cpu(graph_factory, host_max_degrees, monkeypatch):
    monkeypatch.setattr(structure_module, "HOST_STATS_MAX_DEGREES", host_max_degrees)
    g = graph_factory("hub")
    on_gpu = GraphTensor.from_edge_index(torch.stack([g.src, g.dst]).cuda(), (g.num_src, g.num_dst)).stats()
    np.testing.assert_allclose(_flat(on_gpu), _flat(g.stats()), rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_graph_of_a_recorded_step_on_the_gpu(user_order):
    """On a GPU a small graph runs the small-graph rule in the user's order in eager calls, then,
    read while a whole step is recorded, the cost model's schedules on the sorted structure: every
    call, before and after, matches the reference (outputs and gradients), for sums, weighted sums,
    max and GAT's softmax aggregation."""
    from autotune import selection

    gen = torch.Generator().manual_seed(0)
    num_nodes = 3000
    edge_index = torch.randint(0, num_nodes, (2, 30_000), generator=gen)
    edge_index[1, :2000] = 7  # a hub among rows of ten
    g = GraphTensor.from_edge_index(edge_index.cuda(), num_nodes)
    x = torch.randn(num_nodes, 32, generator=gen).cuda().requires_grad_()
    w = torch.rand(edge_index.size(1), 1, generator=gen).cuda().requires_grad_()
    ours = ug.nn.GATConv(32, 8, heads=4).cuda()
    theirs = pyg_nn.GATConv(32, 8, heads=4).cuda()
    theirs.load_state_dict(ours.state_dict())
    cpu_graph = GraphTensor.from_edge_index(edge_index, num_nodes)
    for call in range(8):
        recording = structure_module.recording_steps() if call >= 4 else contextlib.nullcontext()
        with recording:
            _check_calls(g, cpu_graph, x, w, ours, theirs)
    built = g.eager_structure(x.device)
    assert not built.csr.user_order and structure_module.marked_reused(built.csr.rowptr)
    assert selection.chooser(built.csr, x.device) != "small-graph rule"


def _check_calls(g, cpu_graph, x, w, ours, theirs):
    """One call of each op and of both GATConvs on ``g``, against the reference on ``cpu_graph``
    and PyG."""

    def rel_err(a, b):
        return float((a.double().cpu() - b.double().cpu()).abs().max() / b.double().abs().max().clamp_min(1e-30))

    for op, operands in (("copy_u_sum", [x]), ("u_mul_e_sum", [x, w]), ("copy_u_max", [x])):
        out = ug.compute(g, op, *operands)
        grads = torch.autograd.grad(out, operands, torch.ones_like(out))
        cpu = [t.detach().double().cpu().requires_grad_() for t in operands]
        expected = ug.compute(cpu_graph, op, *cpu)
        expected_grads = torch.autograd.grad(expected, cpu, torch.ones_like(expected))
        assert rel_err(out, expected) < 1e-5, op
        assert all(rel_err(a, b) < 1e-5 for a, b in zip(grads, expected_grads)), op
    out, expected = ours(x, g.edge_index), theirs(x, g.edge_index)
    assert rel_err(out, expected) < 1e-5
    got = torch.autograd.grad(out.square().sum(), [x, ours.att_src])
    want = torch.autograd.grad(expected.square().sum(), [x, theirs.att_src])
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(got, want))


def test_stats_of_empty_vertex_set():
    g = GraphTensor.from_edge_index(torch.empty(2, 0, dtype=torch.int64), 0)
    assert g.stats().rows.mean == 0.0 and g.stats().num_edges == 0


def test_chunk_table(graph_factory):
    g = graph_factory("hub")
    rowptr = g.csr().rowptr.long()
    rows, starts = (t.long() for t in g.chunks(4))
    ends = torch.minimum(starts + 4, rowptr[rows + 1])
    lengths = ends - starts
    # Every row has a chunk, the chunks of a row tile its edges, and chunks come longest first.
    assert set(rows.tolist()) == set(range(g.num_dst))
    covered = torch.zeros(g.num_edges, dtype=torch.int64)
    for start, end in zip(starts.tolist(), ends.tolist()):
        covered[start:end] += 1
    assert torch.equal(covered, torch.ones_like(covered))
    assert torch.all(lengths[1:] <= lengths[:-1]) and lengths.max() <= 4
    with pytest.raises(ValueError, match="^group_size:"):
        g.chunks(0)


@pytest.mark.parametrize("case", ["hub", "empty", "isolated", "mixed"])
@pytest.mark.parametrize("group_size", [1, 4, 1000])
def test_split_rows(case, group_size, graph_factory):
    g = graph_factory(case)
    csr = g.csr()
    degree = csr.rowptr[1:].long() - csr.rowptr[:-1].long()
    split = split_rows(csr, group_size)
    assert split.dtype == torch.int64
    assert torch.equal(split, torch.nonzero(degree > group_size).view(-1))
    rows, _ = g.chunks(group_size)
    assert torch.equal(
        torch.bincount(rows.long(), minlength=g.num_dst)[split] > 1, torch.ones_like(split, dtype=torch.bool)
    )


@pytest.mark.parametrize("case", ["hub", "empty", "isolated", "mixed"])
@pytest.mark.parametrize("group_size", [1, 4, 1000])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_split_chunk_slots(case, group_size, index_dtype, graph_factory):
    """Each chunk of a split row owns one slot, a row's slots run from its first on in the order of
    its chunks, and rows of one chunk own none."""
    g = graph_factory(case, index_dtype=index_dtype)
    csr = g.csr()
    rowptr = csr.rowptr.long()
    rows, starts = (t.long() for t in g.chunks(group_size))
    slot, slot_start, num_slots = split_chunk_slots(csr, group_size)
    assert slot.dtype == slot_start.dtype == index_dtype and slot.shape == rows.shape
    split = split_rows(csr, group_size)
    assert slot_start.shape == split.shape
    within = (starts - rowptr[rows]) // group_size
    is_split = torch.isin(rows, split)
    assert torch.all(slot[~is_split] == -1)
    first = torch.full((g.num_dst,), -1, dtype=torch.int64)
    first[split] = slot_start.long()
    assert torch.equal(slot[is_split].long(), first[rows[is_split]] + within[is_split])
    assert torch.equal(torch.sort(slot[is_split].long()).values, torch.arange(num_slots))
    assert num_slots == int(is_split.sum())


@pytest.mark.parametrize("method", ["rcm", "degree"])
def test_reorder(method, graph_factory):
    g = graph_factory("mixed")
    new, perm = g.reorder(method)
    n = g.num_src
    assert torch.equal(torch.sort(perm).values, torch.arange(n))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    # Same edges in the same order, relabelled.
    assert torch.equal(perm[new.src], g.src) and torch.equal(perm[new.dst], g.dst)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    w = torch.randn(g.num_edges, 3, generator=torch.Generator().manual_seed(1))
    for name in ("u_mul_e_sum", "copy_u_max", "u_sub_v"):
        op = ug.OpInfo.from_name(name)
        args = [x if kind == "src_v" else w if kind == "edge" else x for kind in op.inputs]
        moved = [x[perm] if kind != "edge" else w for kind in op.inputs]
        out = reference.execute(g, op, args)
        out_new = reference.execute(new, op, moved)
        expected = out_new if op.gather_op is None else out_new[inverse]
        assert torch.allclose(expected, out, atol=1e-6)


def test_degree_reorder_puts_hub_first(graph_factory):
    g = graph_factory("hub")
    _, perm = g.reorder("degree")
    degree = (g.in_degree() + g.out_degree())[perm]
    assert perm[0] == 0 and torch.all(degree[1:] <= degree[:-1])


def test_rcm_narrows_a_shuffled_path():
    # A path whose labels were shuffled: RCM must give it back bandwidth 1.
    n = 30
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    src, dst = order[:-1], order[1:]
    g = GraphTensor.from_edge_index(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), n)
    new, _ = g.reorder("rcm")
    assert (new.src - new.dst).abs().max() == 1


def test_reorder_errors(graph_factory):
    with pytest.raises(ValueError, match="^method:.*bipartite"):
        graph_factory("bipartite").reorder()
    with pytest.raises(ValueError, match="^method:"):
        graph_factory("mixed").reorder("metis")


@pytest.mark.parametrize(
    "build,error,field",
    [
        (lambda: GraphTensor.from_edge_index([[0, 1], [1, 0]]), TypeError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.zeros(3, 4, dtype=torch.int64)), ValueError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.zeros(2, 3, 1, dtype=torch.int64)), ValueError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.zeros(2, 3)), TypeError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.zeros(2, 3, dtype=torch.bool)), TypeError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0, 5], [1, 0]]), 4), ValueError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0, 1], [1, 4]]), (5, 4)), ValueError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0, -1], [1, 0]]), 4), ValueError, "edge_index"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0], [1]]), -2), ValueError, "num_nodes"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0], [1]]), True), TypeError, "num_nodes"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0], [1]]), 2.0), TypeError, "num_nodes"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0], [1]]), (2, 2, 2)), ValueError, "num_nodes"),
        (lambda: GraphTensor.from_edge_index(torch.tensor([[0], [1]]), (2, None)), TypeError, "num_nodes"),
        (lambda: GraphTensor(torch.tensor([0, 1]), torch.tensor([1]), 2, 2), ValueError, "edge_index"),
        (lambda: GraphTensor(torch.tensor([[0, 1]]), torch.tensor([[1, 0]]), 2, 2), ValueError, "edge_index"),
        (lambda: GraphTensor([0, 1], torch.tensor([1, 0]), 2, 2), TypeError, "edge_index"),
        (
            lambda: GraphTensor(torch.tensor([0, 1]), torch.tensor([1, 0], device="meta"), 2, 2),
            ValueError,
            "edge_index",
        ),
    ],
)
def test_validation_errors(build, error, field):
    with pytest.raises(error, match=f"^{field}:"):
        build()


def test_as_graph_passes_graphs_through():
    from pyg_ugrapher.graph import as_graph

    g = GraphTensor.from_edge_index(torch.tensor([[0], [1]]))
    assert as_graph(g) is g
    assert as_graph(torch.tensor([[0], [1]]), (3, 2)).num_src == 3


def test_validate_endpoints_reads_extra_counts_in_its_check():
    src, dst = torch.tensor([0, 4, 2]), torch.tensor([1, 1, 3])
    assert graph_module.validate_endpoints(src, dst, 5, 4, [(src == 2).sum(), dst.sum()]) == [1, 5]
    assert graph_module.validate_endpoints(src[:0], dst[:0], 5, 4, [src.sum()]) == [6]
    with pytest.raises(ValueError, match="destination index 3 out of range for num_dst=3"):
        graph_module.validate_endpoints(src, dst, 5, 3, [src.sum()])


def test_a_graph_and_its_reverse_form_no_reference_cycle():
    """The graph holds its reverse, which refers back weakly: both are freed without the garbage
    collector, and a reverse whose graph is gone makes a new twin with the same edges."""
    edges = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    gc.disable()
    try:
        graph = ug.GraphTensor.from_edge_index(edges, 3)
        reverse = graph.reverse()
        assert reverse.reverse() is graph and graph.reverse() is reverse
        graph_ref, reverse_ref = weakref.ref(graph), weakref.ref(reverse)
        del reverse
        assert reverse_ref() is graph.reverse()  # the graph holds it
        del graph
        assert graph_ref() is None and reverse_ref() is None  # freed by reference counts alone

        reverse = ug.GraphTensor.from_edge_index(edges, 3).reverse()  # its graph is gone at once
        twin = reverse.reverse()
        assert torch.equal(twin.src, edges[0]) and torch.equal(twin.dst, edges[1])
        assert twin.reverse() is reverse and twin.csr().num_edges == 4
    finally:
        gc.enable()
