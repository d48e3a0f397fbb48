"""``DirectKernel``: compiled binaries are reused only for the specialisation they were built for.

The CPU tests drive it with a stand-in JIT function and driver (the logic is pure Python); the
``cuda`` test launches real kernels with operands whose alignment changes between calls.
"""

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg

import pyg_ugrapher as ug
from pyg_ugrapher.ir import OpInfo
from triton_kernels import launch
from triton_kernels.launch import DirectKernel


class Binary:
    """A compiled kernel as Triton 3.6 returns it: ``run`` is its launcher."""

    def __init__(self, log):
        self.function, self.packed_metadata, self.log = object(), object(), log

    def run(self, *args):
        self.log.append(("binary", self, args))


class JitFunction:
    """``kernel(a_ptr, n, m, BLOCK: constexpr)`` with ``m`` not specialised on its value."""

    arg_names = ["a_ptr", "n", "m", "BLOCK"]
    params = [SimpleNamespace(do_not_specialize=name == "m") for name in arg_names]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch_and_compile(*args, **kwargs):
            binary = Binary(self.log)
            self.log.append(("jit", grid, args, kwargs))
            return binary

        return launch_and_compile


@pytest.fixture
def driver(monkeypatch):
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 1234)
    monkeypatch.setattr(launch, "driver", SimpleNamespace(active=active))


def launches(fn, calls):
    """Run ``(args, kwargs)`` calls through one DirectKernel; the kinds of launch, in order."""
    kernel = DirectKernel(fn)
    for args, kwargs in calls:
        kernel[(3, 2)](*args, **kwargs)
    return [entry[0] for entry in fn.log], kernel


def test_a_binary_is_reused_for_the_same_specialisation(driver):
    fn = JitFunction()
    a, b = torch.zeros(64), torch.ones(64)
    kinds, kernel = launches(fn, [((a, 32, 7), dict(BLOCK=16, num_warps=4)), ((b, 48, 9), dict(BLOCK=16, num_warps=4))])
    assert kinds == ["jit", "binary"]
    _, binary, args = fn.log[1]
    # grid padded to three axes, the driver's stream, no launch metadata or hooks, then every
    # parameter in signature order, the constexpr included
    assert args == (3, 2, 1, 1234, binary.function, binary.packed_metadata, None, None, None, b, 48, 9, 16)
    assert len(kernel.binaries) == 1


class OnTheGpu(torch.Tensor):
    """A host tensor that says it is on the GPU: what the launch passes for a CUDA tensor."""

    @property
    def is_cuda(self):
        return True


def test_gpu_tensors_are_launched_by_address(driver):
    """Triton's launcher takes an integer pointer as it is; for a tensor it calls ``data_ptr()`` and
    asks the driver about the pointer. A tensor not on the GPU stays itself, for the launcher's error."""
    fn = JitFunction()
    gpu, host = torch.zeros(64).as_subclass(OnTheGpu), torch.zeros(64)
    launches(fn, [((gpu, 32, 7), dict(BLOCK=16))] * 2 + [((host, 32, 7), dict(BLOCK=16))])
    (_, _, first), (_, _, second) = fn.log[1], fn.log[2]
    assert first[9] == gpu.data_ptr() and type(first[9]) is int
    assert second[9] is host


@pytest.mark.parametrize(
    "first,second",
    [
        ((0, 7), (1, 7)),  # divisible by 16 -> not
        ((2, 7), (1, 7)),  # an integer equal to 1 is a constant of its binary
        ((3, 7), (2**31, 7)),  # i32 -> i64
        ((3, 7), (3, 2**31)),  # even an unspecialised integer changes type
    ],
    ids=["divisibility", "equal-to-one", "int64", "unspecialised-int64"],
)
def test_a_new_specialisation_compiles_again(driver, first, second):
    fn = JitFunction()
    a = torch.zeros(64)
    kinds, kernel = launches(
        fn, [((a, *first), dict(BLOCK=16)), ((a, *second), dict(BLOCK=16)), ((a, *second), dict(BLOCK=16))]
    )
    assert kinds == ["jit", "jit", "binary"]
    assert len(kernel.binaries) == 2


def test_unspecialised_integers_share_a_binary(driver):
    fn = JitFunction()
    a = torch.zeros(64)
    kinds, _ = launches(fn, [((a, 5, 16), dict(BLOCK=16)), ((a, 5, 1), dict(BLOCK=16)), ((a, 5, 3), dict(BLOCK=16))])
    assert kinds == ["jit", "binary", "binary"]


def test_pointer_alignment_dtype_and_keywords_are_part_of_the_key(driver):
    fn = JitFunction()
    base = torch.zeros(64)
    misaligned = base[1:]  # 4 bytes past a 16-byte boundary
    assert base.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 != 0
    kinds, kernel = launches(
        fn,
        [
            ((base, 3, 3), dict(BLOCK=16)),
            ((misaligned, 3, 3), dict(BLOCK=16)),
            ((base.half(), 3, 3), dict(BLOCK=16)),
            ((base, 3, 3), dict(BLOCK=32)),
            ((base, 3, 3), dict(BLOCK=16, num_warps=8)),
            ((misaligned, 3, 3), dict(BLOCK=16)),
        ],
    )
    assert kinds == ["jit"] * 5 + ["binary"]
    assert len(kernel.binaries) == 5


def test_floats_share_a_binary_whatever_their_value(driver):
    """Triton passes a float as fp32 and never specialises on its value; an integer of the same
    value is another specialisation."""
    fn = JitFunction()
    a = torch.zeros(64)
    calls = [((a, value, 3), dict(BLOCK=16)) for value in (2.5, 0.0, 1.0, 1)]
    kinds, kernel = launches(fn, calls)
    assert kinds == ["jit", "binary", "binary", "jit"] and len(kernel.binaries) == 2
    assert fn.log[2][2][-3:] == (1.0, 3, 16)


def test_other_argument_types_always_go_through_triton(driver):
    fn = JitFunction()
    kinds, kernel = launches(fn, [((torch.zeros(4), None, 3), dict(BLOCK=16))] * 2)
    assert kinds == ["jit", "jit"] and not kernel.binaries


def test_a_bool_argument_always_goes_through_triton(driver):
    """A bool is an int subclass, which Triton specialises as ``i1``: never keyed as an integer."""
    fn = JitFunction()
    kinds, kernel = launches(fn, [((torch.zeros(4), True, 3), dict(BLOCK=16))] * 2)
    assert kinds == ["jit", "jit"] and not kernel.binaries


@pytest.mark.parametrize("value,kind", [(-(2**31), "i32"), (2**31 - 1, "i32"), (-(2**31) - 1, "i64"), (2**63, "u64")])
def test_integer_types_at_their_bounds(driver, value, kind):
    kernel = DirectKernel(JitFunction())
    key = kernel._key(0, (torch.zeros(4), value, 3), dict(BLOCK=16))
    assert key[3][0] == kind and key[3][0] == launch._int_type(value)


@pytest.mark.parametrize("numerator,denominator", [(0, 4), (1, 4), (4, 4), (5, 4), (2**40 + 1, 128), (7, 1)])
def test_cdiv_is_the_ceiling_of_the_quotient(numerator, denominator):
    expected = numerator // denominator + (numerator % denominator > 0)
    assert launch.cdiv(numerator, denominator) == expected
    assert type(launch.cdiv(numerator, denominator)) is int


def test_a_parameter_left_to_its_default_is_never_launched_directly(driver):
    fn = JitFunction()
    kinds, kernel = launches(fn, [((torch.zeros(4), 2, 3), {})] * 2)
    assert kinds == ["jit", "jit"] and not kernel.binaries


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_launch_hooks_see_every_launch(driver, monkeypatch, hook):
    """Profilers (proton) register launch hooks: with one set, every launch goes through Triton."""
    chain = SimpleNamespace(calls=[lambda metadata: None])
    monkeypatch.setattr(launch.knobs.runtime, hook, chain)
    fn = JitFunction()
    kinds, _ = launches(fn, [((torch.zeros(4), 2, 3), dict(BLOCK=16))] * 3)
    assert kinds == ["jit"] * 3


def test_an_unexpected_compiled_kernel_turns_direct_launches_off(driver):
    class OldJit(JitFunction):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.log.append(("jit",)) or SimpleNamespace()

    fn = OldJit()
    kinds, kernel = launches(fn, [((torch.zeros(4), 2, 3), dict(BLOCK=16))] * 3)
    assert kinds == ["jit"] * 3 and not kernel.direct


def test_a_launch_on_tensors_of_another_device_switches_to_it(monkeypatch):
    """Tensors of a device that is not the current one: the launch (compiling first, then the
    binary) runs with their device current, and the current device is restored after."""
    current = [0]
    switches = []

    @contextlib.contextmanager
    def device(index):
        switches.append(index)
        previous, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = previous

    active = SimpleNamespace(get_current_device=lambda: current[0], get_current_stream=lambda index: 100 + index)
    monkeypatch.setattr(launch, "driver", SimpleNamespace(active=active))
    monkeypatch.setattr(launch.torch.cuda, "device", device)
    monkeypatch.setattr(launch, "_home_device", lambda args: 1)
    fn = JitFunction()
    kinds, kernel = launches(fn, [((torch.zeros(4), 2, 3), dict(BLOCK=16))] * 2)
    assert kinds == ["jit", "binary"] and switches == [1, 1] and current == [0]
    assert fn.log[1][2][3] == 101  # the stream of the tensors' device
    assert all(key[0] == 1 for key in kernel.binaries)


def test_cpu_tensors_and_integers_have_no_home_device():
    assert launch._home_device((3, torch.zeros(2), 5)) == -1  # a CPU tensor: nothing to switch
    assert launch._home_device((3, 4)) == -1


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_misaligned_operands_after_aligned_ones(strategy, device, graph_factory, check_close):
    """The same kernel on an aligned operand, then a view 4 bytes off (a binary built for 16-byte
    alignment would read it wrongly or fault), then the aligned one again."""
    graph = graph_factory("mixed")
    op = OpInfo.from_name("u_mul_e_sum")
    wide = torch.randn(graph.num_src, 65, device=device)
    weight = torch.randn(graph.num_edges, device=device)
    info = ug.ParallelInfo(strategy, block_f=64)
    for x in (wide[:, :64], wide[:, 1:], wide[:, :64].contiguous()):
        expected = ug.reference.execute(graph, op, [x.double(), weight.double()]).float()
        check_close(ug.compute(graph, op, x, weight, parallel_info=info), expected)


@pytest.mark.cuda
@pytest.mark.two_gpus
@pytest.mark.parametrize("strategy", ["vertex", "edge", "group"])
def test_operands_on_another_gpu_run_on_that_gpu(strategy, graph_factory, check_close):
    """With the first GPU current, operands on the second: each kernel (the structure's build
    included) runs on the operands' GPU, as torch's own operations do."""
    second = torch.device("cuda", 1)
    op = OpInfo.from_name("u_mul_e_sum")
    with torch.cuda.device(0):
        graph = graph_factory("mixed")
        x = torch.randn(graph.num_src, 32, device=second)
        weight = torch.randn(graph.num_edges, device=second)
        expected = ug.reference.execute(graph, op, [x.double().cpu(), weight.double().cpu()]).float()
        out = ug.compute(graph, op, x, weight, parallel_info=ug.ParallelInfo(strategy))
        assert out.device == second
        check_close(out.cpu(), expected)


@pytest.mark.cuda
@pytest.mark.two_gpus
@pytest.mark.parametrize("layer", ["GCNConv", "GATConv", "SAGEConv"])
def test_a_layer_on_another_gpu_trains_there(layer, graph_factory, check_close):
    """A drop-in layer moved to the second GPU while the first is current (a new graph: the
    structure is built and checked there too) gives PyG's output and gradients on the CPU."""
    graph = graph_factory("mixed")
    edge_index = torch.stack([graph.src, graph.dst]).long()
    x = torch.randn(graph.num_src, 16)
    theirs = getattr(pyg, layer)(16, 8)
    ours = getattr(ug.nn, layer)(16, 8)
    ours.load_state_dict(theirs.state_dict())
    second = torch.device("cuda", 1)
    ours = ours.to(second)
    with torch.cuda.device(0):
        x_ours = x.to(second).requires_grad_()
        out = ours(x_ours, edge_index.to(second))
        out.square().sum().backward()
    x_theirs = x.clone().requires_grad_()
    expected = theirs(x_theirs, edge_index)
    expected.square().sum().backward()
    assert out.device == second
    check_close(out.cpu(), expected.detach())
    check_close(x_ours.grad.cpu(), x_theirs.grad)
