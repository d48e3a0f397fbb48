"""The kernel cache: kernels are compiled from the generated text in memory, never from the file in
the cache folder, which is private, checked, and written atomically."""

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from triton.runtime.jit import JITFunction

from pyg_ugrapher.paths import CACHE_ENV
from triton_kernels import codegen

SOURCE = """import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)
"""
#: What an attacker would put in the cache file: it fails loudly if imported, and its kernel
#: computes something else if Triton took its source from the file.
MALICIOUS = SOURCE.replace("+ 1.0", "+ 100.0") + 'raise RuntimeError("the file on disk was executed")\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


def kernel_file(cache, source: str):
    return cache / "kernels" / f"ug_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"


def run_add_one(kernel, device) -> torch.Tensor:
    x = torch.arange(5, dtype=torch.float32, device=device)
    kernel[(1,)](x, 5, BLOCK=8)
    return x.cpu()


def test_writes_private_cache(cache):
    codegen.load_kernel(SOURCE, "add_one")
    path = kernel_file(cache, SOURCE)
    assert path.read_text() == SOURCE
    assert os.stat(cache / "kernels").st_mode & 0o777 == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_refuses_writable_cache(cache):
    codegen.cache_dir()
    os.chmod(cache / "kernels", 0o777)
    with pytest.raises(PermissionError, match=CACHE_ENV):
        codegen.load_kernel(SOURCE, "add_one")


@pytest.mark.parametrize("when", ["planted", "swapped"])
def test_file_on_disk_is_never_executed(when, cache, monkeypatch, device):
    """A cache file changed before the kernel is generated (planted) or right after it is written
    (swapped) neither runs nor changes what the kernel computes."""
    path = kernel_file(cache, SOURCE)
    if when == "planted":
        path.parent.mkdir(parents=True, mode=0o700)
        path.write_text(MALICIOUS)
    else:
        write = codegen._write_atomically

        def write_then_swap(target, text):
            write(target, text)
            target.write_text(MALICIOUS)

        monkeypatch.setattr(codegen, "_write_atomically", write_then_swap)
    kernel = codegen.load_kernel(SOURCE, "add_one")
    assert torch.equal(run_add_one(kernel, device), torch.arange(5, dtype=torch.float32) + 1)
    assert (path.read_text() == SOURCE) == (when == "planted")  # a planted file is rewritten
    # What Triton's compiler reads of the kernel (the interpreter above read the same).
    assert "+ 1.0" in JITFunction(kernel.fn).src


CONCURRENT = textwrap.dedent("""
    import torch
    import pyg_ugrapher as ug

    gen = torch.Generator().manual_seed(0)
    # On a GPU the kernels run compiled; on the CPU through the interpreter (set by the test).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    edges = torch.randint(0, 40, (2, 200), generator=gen).to(device)
    x = torch.randn(40, 8, generator=gen).to(device)
    w = torch.rand(200, generator=gen).to(device)
    graph = ug.GraphTensor.from_edge_index(edges, 40)
    info = ug.ParallelInfo("vertex", block_v=8, block_e=4, block_f=8)
    for name, operands, gather in [("copy_u_sum", (x,), "sum"), ("copy_u_max", (x,), "amax"),
                                   ("u_mul_e_sum", (x, w), "sum")]:
        out = ug.compute(graph, name, *operands, parallel_info=info)
        message = x[edges[0]] * (w[:, None] if len(operands) == 2 else 1)
        want = torch.zeros(40, 8, device=device).scatter_reduce(0, edges[1, :, None].expand(-1, 8), message, gather,
                                                 include_self=False)
        assert (out - want).abs().max() <= 1e-5 * want.abs().max(), name
    print("ok")
""")


def test_concurrent_processes_fill_one_cache(cache):
    """Two processes generating the same kernels into one new cache both compute correctly, and
    every file left holds the text its name hashes."""
    env = {**os.environ, CACHE_ENV: str(cache)}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0 and out.strip() == "ok", err[-3000:]
    files = sorted((cache / "kernels").iterdir())
    assert len(files) >= 3  # one kernel per operator at least, and no temporary file left
    for path in files:
        assert path.name == kernel_file(cache, path.read_text()).name
