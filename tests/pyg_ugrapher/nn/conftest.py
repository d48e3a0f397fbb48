"""Fixtures of the drop-in layer tests: graphs, datasets, and the comparison of a layer of ours with
its PyG namesake (outputs and every gradient). The Triton interpreter (``interpret``) and the
reference-executor default come from ``tests/conftest.py``."""

import copy
from typing import Callable, List, Optional, Sequence, Tuple

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend


def make_graph(num_nodes: int, num_edges: int, seed: int, num_dst: Optional[int] = None) -> torch.Tensor:
    """A random edge index with what trips kernels up: an isolated vertex (the last one on both
    sides), self loops, duplicate edges and a hub (vertex 0, a third of the edges)."""
    generator = torch.Generator().manual_seed(seed)
    num_dst = num_nodes if num_dst is None else num_dst
    src = torch.randint(0, num_nodes - 1, (num_edges,), generator=generator)
    dst = torch.randint(0, num_dst - 1, (num_edges,), generator=generator)
    dst[: num_edges // 3] = 0
    if num_dst == num_nodes:
        src[-4:] = dst[-4:]  # self loops
    edge_index = torch.stack([src, dst])
    return torch.cat([edge_index, edge_index[:, 1:4]], dim=1)  # duplicates


def config_id(kwargs: dict) -> str:
    """A test id for a layer's constructor arguments: ``name=value`` pairs, or ``default``."""
    return ",".join(f"{a}={b}" for a, b in kwargs.items()) or "default"


@pytest.fixture(scope="session")
def small_graph():
    """``(x, edge_index)``: 12 vertices, 43 edges."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(12, 6, generator=generator), make_graph(12, 40, seed=1)


@pytest.fixture(scope="session")
def tiny_graph():
    """``(x, edge_index)`` small enough for the Triton interpreter: 6 vertices, 15 edges."""
    generator = torch.Generator().manual_seed(2)
    return torch.randn(6, 4, generator=generator), make_graph(6, 12, seed=2)


@pytest.fixture(scope="session")
def static_graph():
    """``(x, edge_index, edge_attr)``: a static graph, one graph of 12 vertices and 43 edges
    with a batch of 3 feature matrices ``x`` of ``[3, 12, 6]``, and edge features of ``[43, 6]``
    shared by the batch."""
    generator = torch.Generator().manual_seed(4)
    edge_index = make_graph(12, 40, seed=1)
    x = torch.randn(3, 12, 6, generator=generator)
    return x, edge_index, torch.randn(edge_index.size(1), 6, generator=generator)


@pytest.fixture(scope="session")
def bipartite_graph():
    """``(x_src, x_dst, edge_index)``: 10 source and 7 destination vertices."""
    generator = torch.Generator().manual_seed(3)
    edge_index = make_graph(10, 30, seed=3, num_dst=7)
    return torch.randn(10, 6, generator=generator), torch.randn(7, 5, generator=generator), edge_index


def _load(name: str):
    from pyg_ugrapher.datasets import load_dataset

    return load_dataset(name)


@pytest.fixture(scope="session", params=["cora", "citeseer", "pubmed"])
def dataset(request):
    try:
        return _load(request.param)
    except FileNotFoundError as error:
        pytest.skip(str(error))


def _outputs_and_grads(
    layer: torch.nn.Module, forward: Callable, inputs: Sequence[torch.Tensor], dtype: torch.dtype
) -> List[torch.Tensor]:
    """``forward(layer, *inputs)`` and the gradients of a fixed random projection of it with
    respect to every floating input and parameter."""
    inputs = [
        t.detach().to(dtype).requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in inputs
    ]
    out = forward(layer, *inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    head = outs[0]
    probe = torch.randn(head.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad] + list(layer.parameters())
    loss = (head * probe.to(head.dtype)).sum()
    grads = torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True)
    return [t.detach() for t in outs] + [g.detach() for g in grads]


@pytest.fixture
def compare(check_refereed):
    """``compare(ours, theirs, forward, inputs)``: load PyG's weights into our layer (strictly),
    then check outputs and gradients (inputs and parameters) against PyG's in float32, refereed by
    PyG in float64 where float32 rounding alone differs (see :func:`tests.conftest.assert_refereed`).
    """

    def run(
        ours: torch.nn.Module,
        theirs: torch.nn.Module,
        forward: Callable,
        inputs: Sequence[torch.Tensor],
        train: bool = False,
    ) -> List[torch.Tensor]:
        ours.load_state_dict(theirs.state_dict(), strict=True)
        ours.train(train)
        theirs.train(train)
        mine = _outputs_and_grads(ours, forward, inputs, torch.float32)
        ref = _outputs_and_grads(theirs, forward, inputs, torch.float32)
        assert len(mine) == len(ref)
        exact: List[torch.Tensor] = []

        def exact_result(index: int) -> torch.Tensor:
            if not exact:
                exact.extend(_outputs_and_grads(copy.deepcopy(theirs).double(), forward, inputs, torch.float64))
            return exact[index]

        for index, (a, b) in enumerate(zip(mine, ref)):
            if not b.is_floating_point():
                assert torch.equal(a, b), f"tensor {index} differs from PyG's"
                continue
            check_refereed(a, b, lambda: exact_result(index), f"tensor {index}")
        return mine

    return run


@pytest.fixture
def compile_ours():
    """``compile_ours(forward, ours) -> (forward', counter)``: ``forward'`` runs ``forward``
    compiled as users compile a model (no ``fullgraph``, ``aot_eager``: Dynamo and AOTAutograd
    without code generation) for the layer ``ours``, eager for any other (PyG's, in
    ``compare``); ``counter.frame_count`` is the number of graphs Dynamo made."""

    def build(forward: Callable, ours: torch.nn.Module) -> Tuple[Callable, CompileCounterWithBackend]:
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(forward, backend=counter)
        return (lambda layer, *args: (compiled if layer is ours else forward)(layer, *args)), counter

    torch._dynamo.reset()
    yield build
    torch._dynamo.reset()
