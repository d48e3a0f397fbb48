"""Probe 34: host time of one graph operator call through each way of calling it.

``u_mul_e_sum`` on the power-law 4e6-edge graph, F = 128, while the GPU is held busy (so no call
waits for it): ``run_graph_op`` directly (what eager layers reach), the ``pyg_ugrapher::graph_op``
custom op without and with autograd (what compiled graphs call), and the custom op's own wrapper
pieces timed one by one. Prints the torch version's ``backend_impl`` source for reference. Run from
the repository root: ``python benchmarks/results/h100-refine/probes/gpu_probe34.py``.
"""
import inspect
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher import GraphTensor  # noqa: E402
from pyg_ugrapher.ops import graph_op, run_graph_op  # noqa: E402

out = open(os.path.join(os.environ.get("OUT", "."), "probe34.txt"), "w")


def say(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    out.write(text + "\n")


def host_us(call, n=200):
    torch.cuda.synchronize()
    torch.cuda._sleep(3_000_000_000)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


cuda = torch.device("cuda")
say(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
import torch._library.custom_ops as custom_ops  # noqa: E402
source = inspect.getsource(custom_ops)
start = source.find("def backend_impl")
say(source[start:start + 2500])
spec = layer_graphs()[1]
loaded = spec.load(cuda)
graph = GraphTensor.from_edge_index(loaded.edge_index, loaded.num_nodes)
structure = graph.structure(cuda)
x = torch.randn(loaded.num_nodes, 128, device=cuda)
w = torch.rand(loaded.edge_index.shape[1], device=cuda)
xg = x.clone().requires_grad_()
op, schedule = "u_mul_e_sum", "auto"
for _ in range(3):
    run_graph_op(structure, [x, w], op, schedule)
    graph_op(structure, [x, w], op, schedule)
    graph_op(structure, [xg, w], op, schedule)
torch.cuda.synchronize()
say(f"run_graph_op directly        {host_us(lambda: run_graph_op(structure, [x, w], op, schedule)):8.1f} us")
say(f"custom op, no grad           {host_us(lambda: graph_op(structure, [x, w], op, schedule)):8.1f} us")
say(f"custom op, input needs grad  {host_us(lambda: graph_op(structure, [xg, w], op, schedule)):8.1f} us")
say(f"torch.ops...default, no grad {host_us(lambda: torch.ops.pyg_ugrapher.graph_op.default(structure, [x, w], op, schedule)):8.1f} us")
with torch.no_grad():
    say(f"custom op under no_grad      {host_us(lambda: graph_op(structure, [xg, w], op, schedule)):8.1f} us")
import torch._library.utils as library_utils  # noqa: E402
for name in ("_c_check_aliasing_constraint", "check_aliasing_constraint"):
    fn = getattr(library_utils, name, None)
    if fn is None:
        continue
    result = run_graph_op(structure, [x, w], op, schedule)
    args = (structure, [x, w], op, schedule)
    try:
        say(f"{name:28s} {host_us(lambda: fn('pyg_ugrapher::graph_op', args, {}, result, lambda: None)):8.1f} us")
    except TypeError as error:
        say(f"{name}: {error}")
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
torch.cuda.synchronize()
torch.cuda._sleep(3_000_000_000)
profiler = cProfile.Profile()
profiler.enable()
for _ in range(50):
    graph_op(structure, [x, w], op, schedule)
profiler.disable()
torch.cuda.synchronize()
text = io.StringIO()
pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
say(text.getvalue())
out.close()
