"""Launch generated kernels through their compiled binaries, without Triton's per-call binding.

``kernel[grid](...)`` binds the arguments, works out their specialisation (types, 16-byte
alignment of pointers, divisibility by 16 of integers, integers equal to 1), builds a cache key
from it and the options, finds the binary and launches it, several times the host time of the bare
launch. On graphs up to ~1e6 edges that host time is the operator's time. The generated kernels
take only tensors, integers and floats (everything else is a ``constexpr`` keyword), so the same
specialisation is a short tuple computed here; the first call of each one goes through Triton
(which compiles), later calls launch its ``CompiledKernel``.

Triton compiles for and launches on the current CUDA device; a launch on tensors of another GPU
makes theirs current for its duration, as torch's operations run on their tensors' device.

Anything this does not recognise (other argument types, launch hooks set by a profiler, a Triton
whose compiled kernels lack the attributes used here) goes through Triton's own path.

Triton's own path runs under one process-wide lock (:data:`TRITON_LOCK`): its binder and compiler
keep per-function caches that several threads must not fill at once, and its CPU interpreter runs
a kernel by patching ``triton.language`` module-wide and keeps the program id in one global
builder, so two interpreted launches at once would see each other's. Launches of compiled binaries
take no lock. The caches of the package and how each is guarded: ``docs/caches.md``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import triton
from torch import Tensor
from triton import knobs
from triton.runtime.driver import driver

_I32 = 2**31
_I64 = 2**63
_FLOAT = ("fp32",)

#: Held while a kernel goes through Triton's own launch path: compiling, binding, interpreting.
TRITON_LOCK = threading.RLock()


def cdiv(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for a launch grid: ``triton.cdiv`` is a
    ``constexpr_function`` in recent Tritons, a wrapper of a dozen Python calls per use, and a
    launch computes one or two of these."""
    return -(-numerator // denominator)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook would run: Triton 3.6 keeps a (usually empty) ``HookChain`` there,
    older versions ``None`` or a function."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _home_device(args: Sequence[Any]) -> int:
    """The CUDA device of the first tensor argument (the kernels' tensors share one), -1 for a
    CPU tensor or none."""
    for arg in args:
        if isinstance(arg, Tensor):
            return arg.get_device()
    return -1


def _int_type(value: int) -> str:
    if -_I32 <= value < _I32:
        return "i32"
    return "i64" if value < _I64 else "u64"


class DirectKernel:
    """A ``@triton.jit`` function launched as ``kernel[grid](*args, **constexprs_and_options)``,
    like the function itself, through its compiled binary once Triton has built it."""

    def __init__(self, fn):
        self.fn = fn
        self.names: Tuple[str, ...] = tuple(fn.arg_names)
        #: Per parameter: whether Triton specialises an integer on its value (``% 16``, ``== 1``).
        self.specialised: Tuple[bool, ...] = tuple(not p.do_not_specialize for p in fn.params)
        self.binaries: Dict[Tuple, Any] = {}
        self.direct = True

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def _key(self, device: int, args: Sequence[Any], kwargs: Dict[str, Any], values: Optional[List[Any]] = None):
        """The specialisation key of a call (``None`` for an argument type not handled here). With
        ``values``, also the launch's argument values, appended: a CUDA tensor as its address, which
        Triton's launcher takes as it is, where for a tensor it calls ``data_ptr()`` and asks the
        driver for the pointer's attributes, per argument and launch (a host cost that grows with
        the kernel's many pointers); any other tensor as itself, for the launcher's own error."""
        key = [device, tuple(kwargs.items())]
        append = key.append
        keep = values.append if values is not None else None
        for arg, specialised in zip(args, self.specialised):
            # Integers first, by exact type (a bool is not one): the check costs no call.
            if type(arg) is int:
                kind = "i32" if -_I32 <= arg < _I32 else _int_type(arg)
                append((kind, specialised and arg % 16 == 0, specialised and arg == 1))
            elif isinstance(arg, Tensor):
                address = arg.data_ptr()
                append((arg.dtype, address % 16 == 0))
                if keep is not None:
                    keep(address if arg.is_cuda else arg)
                    continue
            elif type(arg) is float:
                append(_FLOAT)  # Triton passes every float as fp32, never specialised on its value
            else:
                return None
            if keep is not None:
                keep(arg)
        return tuple(key)

    def run(self, grid: Sequence[int], args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
        device = driver.active.get_current_device()
        home = _home_device(args)
        if home >= 0 and home != device:
            # Triton compiles for and launches on the current device, whose context cannot run
            # a kernel on another GPU's memory: a call on tensors of another GPU runs there.
            with torch.cuda.device(home):
                self._launch(grid, args, kwargs, home)
            return
        self._launch(grid, args, kwargs, device)

    def _launch(self, grid: Sequence[int], args: Sequence[Any], kwargs: Dict[str, Any], device: int) -> None:
        """The launch on ``device``, the current one."""
        runtime = knobs.runtime
        if not self.direct or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            with TRITON_LOCK:
                self.fn[grid](*args, **kwargs)
            return
        values: List[Any] = []
        key = self._key(device, args, kwargs, values)
        binary = self.binaries.get(key) if key is not None else None
        if binary is None:
            with TRITON_LOCK:
                compiled = self.fn[grid](*args, **kwargs)
            if key is not None:
                self._remember(key, compiled, len(args), kwargs)
            return
        tail = [kwargs[name] for name in self.names[len(args) :]]
        stream = driver.active.get_current_stream(device)
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        binary.run(
            grid[0], grid_y, grid_z, stream, binary.function, binary.packed_metadata, None, None, None, *values, *tail
        )

    def _remember(self, key: Tuple, compiled: Any, num_args: int, kwargs: Dict[str, Any]) -> None:
        if not all(name in kwargs for name in self.names[num_args:]):
            return  # a parameter left to its default: only Triton's binder knows its value
        if all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            self.binaries[key] = compiled
        else:
            self.direct = False


class InterpretedKernel:
    """A ``@triton.jit`` function run by Triton's interpreter, launched as
    ``kernel[grid](*args, **kwargs)`` under :data:`TRITON_LOCK`: one interpreted kernel at a time."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def run(self, grid: Sequence[int], args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
        with TRITON_LOCK:
            self.fn[grid](*args, **kwargs)


def launcher(kernel, interpreted: bool):
    """How the ``@triton.jit`` function ``kernel`` is launched: :class:`InterpretedKernel` or
    :class:`DirectKernel`."""
    return InterpretedKernel(kernel) if interpreted else DirectKernel(kernel)


@functools.lru_cache(maxsize=None)
def jit_kernel(fn: Callable, do_not_specialize: Tuple[str, ...], interpreted: bool):
    """The hand-written kernel ``fn`` (an undecorated function), decorated once per mode: Triton
    decides at decoration time whether a function is compiled or interpreted, and one process may
    run both (the tests). Launched through :func:`launcher`."""
    return launcher(triton.jit(do_not_specialize=list(do_not_specialize))(fn), interpreted)
