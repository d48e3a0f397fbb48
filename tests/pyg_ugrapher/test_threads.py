"""Models of :mod:`pyg_ugrapher.nn` run from several Python threads at once (two models, and one model
in two threads), through the Triton kernels (the interpreter on a CPU), with every cache the package
keeps starting empty: no exception, and every output and gradient equal to a sequential run. On a
GPU the same runs on two CUDA streams. ``docs/caches.md`` lists what the threads share."""

import sys
import threading
from typing import Callable, Dict, List, Tuple

import pytest
import torch
from torch_geometric.nn import MessagePassing as PyGMessagePassing

import pyg_ugrapher as ug
from pyg_ugrapher import nn as ug_nn
from triton_kernels import dispatch, launch

#: Steps each thread runs.
STEPS = 3
#: Seconds between the interpreter's thread switches while the threads run (default 5 ms): a
#: switch inside every few bytecodes of a cache lookup, as free-running threads would hit now and then.
SWITCH_INTERVAL = 1e-5

MODELS: Dict[str, Callable[[], torch.nn.Module]] = {
    "gcn": lambda: ug_nn.GCNConv(6, 4),
    "gat": lambda: ug_nn.GATConv(6, 4, heads=2),
}


def _graph(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x, edge_index)``: 12 vertices, 43 edges, among them a hub (vertex 0), an isolated vertex
    (11), self loops and duplicate edges."""
    gen = torch.Generator().manual_seed(5)
    edges = torch.randint(0, 11, (2, 32), generator=gen)
    edges[1, :10] = 0
    edges[1, 28:] = edges[0, 28:]
    edges = torch.cat([edges, edges[:, 2:13]], dim=1)
    return torch.randn(12, 6, generator=gen).to(device), edges.to(device)


def _step(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor) -> List[torch.Tensor]:
    """One training step's output and gradients (of the input and every parameter)."""
    x = x.detach().requires_grad_()
    out = model(x, edge_index)
    probe = torch.linspace(-1, 1, out.numel(), device=out.device).view(out.shape)
    grads = torch.autograd.grad((out * probe).sum(), [x] + list(model.parameters()))
    return [out.detach()] + [g.detach() for g in grads]


def _fresh_caches() -> None:
    """Every kernel generated and decorated afresh, so that the threads fill the kernel caches
    together (the graphs, their structures and decisions are new in each test)."""
    dispatch._kernel.cache_clear()
    launch.jit_kernel.cache_clear()


def _in_threads(jobs: List[Callable[[], List[List[torch.Tensor]]]]) -> List[List[List[torch.Tensor]]]:
    """Run the jobs in threads started together; their results, or the first exception raised."""
    results: List = [None] * len(jobs)
    errors: List[BaseException] = []
    start = threading.Barrier(len(jobs))

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = jobs[i]()
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]
    return results


def _check(results: List[List[torch.Tensor]], expected: List[torch.Tensor], check_close, context: str) -> None:
    for step, tensors in enumerate(results):
        assert len(tensors) == len(expected)
        for i, (actual, wanted) in enumerate(zip(tensors, expected)):
            check_close(actual, wanted, context=f"{context}, step {step}, tensor {i}")


@pytest.mark.parametrize(
    "names", [("gcn", "gat"), ("gcn", "gcn"), ("gat", "gat")], ids=["gcn-and-gat", "one-gcn", "one-gat"]
)
def test_models_in_two_threads(names, interpret, check_close):
    """Two models (or one model twice) in two threads, each thread on its own copy of one graph:
    the results of a sequential run on another copy of the graph."""
    torch.manual_seed(0)
    models = {name: MODELS[name]() for name in set(names)}
    x, edge_index = _graph(torch.device("cpu"))
    expected = {name: _step(model, x, edge_index.clone()) for name, model in models.items()}
    _fresh_caches()
    graphs = [edge_index.clone() for _ in names]

    def job(name: str, graph: torch.Tensor) -> Callable[[], List[List[torch.Tensor]]]:
        return lambda: [_step(models[name], x, graph) for _ in range(STEPS)]

    results = _in_threads([job(name, graph) for name, graph in zip(names, graphs)])
    for name, result in zip(names, results):
        _check(result, expected[name], check_close, f"{name} in a thread")


def test_one_graph_in_two_threads(interpret, check_close):
    """Both threads on the same graph tensor: they share its structures, statistics and decisions."""
    torch.manual_seed(0)
    model = MODELS["gat"]()
    x, edge_index = _graph(torch.device("cpu"))
    expected = _step(model, x, edge_index.clone())
    _fresh_caches()
    results = _in_threads([lambda: [_step(model, x, edge_index) for _ in range(STEPS)]] * 2)
    for result in results:
        _check(result, expected, check_close, "gat on a shared graph")


def test_a_fallback_leaves_the_module_to_other_threads():
    """While one thread runs PyG's own propagation of a module (``message()`` changes a tensor in
    place: no capture, no staged run), whose propagate pre-hook already ran once for that call, a
    second thread's call of the same module runs the pre-hook too: once per call, and the results
    are PyG's."""
    first_in_message, second_done = threading.Event(), threading.Event()

    def message(self, x_j, x_i):
        if type(x_j) is torch.Tensor and threading.current_thread().name == "first":  # not the trace
            first_in_message.set()
            assert second_done.wait(60)
        return torch.cat([x_j, x_i.sub_(x_j)], dim=-1)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    ours, theirs = (
        type("Concat", (base,), {"message": message, "forward": forward})(aggr="max")
        for base in (ug.MessagePassing, PyGMessagePassing)
    )
    calls = []
    ours.register_propagate_forward_pre_hook(lambda module, inputs: calls.append(threading.current_thread().name))
    x, edge_index = _graph(torch.device("cpu"))
    expected = theirs(x, edge_index)
    results = {}

    def call(name: str) -> None:
        results[name] = ours(x, edge_index)

    first = threading.Thread(target=call, args=("first",), name="first")
    first.start()
    try:
        assert first_in_message.wait(60)
        second = threading.Thread(target=call, args=("second",), name="second")
        second.start()
        second.join()
    finally:
        second_done.set()
        first.join()
    assert sorted(calls) == ["first", "second"]
    assert "in place" in ours.fallback_reason
    for name in ("first", "second"):
        assert torch.equal(results[name], expected), name


@pytest.mark.cuda
@pytest.mark.parametrize("names", [("gcn", "gat"), ("gcn", "gcn")], ids=["gcn-and-gat", "one-gcn"])
def test_models_on_two_streams(names, check_close):
    """Two threads, each on a CUDA stream of its own, over one graph: the results of a sequential
    run on the default stream. The sequential run builds the graph's structures and decisions
    first, on the default stream, and the side streams wait for it (``docs/caches.md``: cached
    device tensors are read by other streams only after the stream that built them)."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    models = {name: MODELS[name]().to(device) for name in set(names)}
    x, edge_index = _graph(device)
    expected = {name: [_step(model, x, edge_index) for _ in range(2)][-1] for name, model in models.items()}
    streams = [torch.cuda.Stream(device) for _ in names]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream(device))

    def job(name: str, stream: torch.cuda.Stream) -> Callable[[], List[List[torch.Tensor]]]:
        def run() -> List[List[torch.Tensor]]:
            with torch.cuda.stream(stream):
                steps = [_step(models[name], x, edge_index) for _ in range(STEPS)]
            stream.synchronize()
            return steps

        return run

    results = _in_threads([job(name, stream) for name, stream in zip(names, streams)])
    for name, result in zip(names, results):
        _check(result, expected[name], check_close, f"{name} on a side stream")
