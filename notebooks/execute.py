"""Execute the notebooks top to bottom and save them with their outputs (no Jupyter CLI needed).

.. code-block:: bash

    python notebooks/execute.py                    # every notebook in this folder, in order
    python notebooks/execute.py 02_design_space    # only the ones named (with or without .ipynb)

The kernel is the interpreter that runs this script (``sys.executable``), whatever kernels Jupyter
has registered: a kernelspec pointing at it is written to a temporary folder and used from there,
so nothing is installed into the user's Jupyter configuration. Cells run with the notebooks' folder
as working directory. A cell that raises stops the run and leaves the notebook file untouched.
The test suite (``tests/notebooks``) runs the same :func:`execute`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parent
#: Name of the kernelspec written for this interpreter.
KERNEL_NAME = "pyg-ugrapher-python"
#: Seconds one cell may run before the execution fails (a GPU sweep cell takes minutes).
CELL_TIMEOUT = 1800


def notebooks(names: Sequence[str] = ()) -> List[Path]:
    """The notebooks of this folder (sorted), or those named (``"01_quickstart"`` or its file name)."""
    found = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    if not names:
        return found
    by_name = {path.stem: path for path in found}
    paths = []
    for name in names:
        stem = Path(name).stem
        if stem not in by_name:
            raise ValueError(f"names: no notebook {name!r} in {NOTEBOOKS_DIR} (have {', '.join(sorted(by_name))})")
        paths.append(by_name[stem])
    return paths


def _kernel_manager(kernels_dir: Path) -> KernelManager:
    """A kernel manager whose only kernel is ``sys.executable`` running ipykernel."""
    spec_dir = kernels_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(kernels_dir)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def execute(path: Path, *, timeout: Optional[int] = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` in a fresh kernel of this interpreter; return it with its outputs.

    Raises :class:`nbclient.exceptions.CellExecutionError` for the first cell that raises and
    :class:`nbclient.exceptions.CellTimeoutError` for one that runs past ``timeout`` seconds.
    The file itself is not written.
    """
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="pyg-ugrapher-kernels-") as kernels_dir:
        client = NotebookClient(
            nb,
            km=_kernel_manager(Path(kernels_dir)),
            timeout=timeout,
            # Per-cell timestamps would make every run a diff of the file.
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        )
        # nbclient shuts down only kernels of a manager it made itself; without this each kernel
        # (hundreds of MB, with torch's threads) outlived its notebook until this process ended.
        client.execute(cleanup_kc=True)
    return nb


def main(argv: Optional[Iterable[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds per cell")
    args = parser.parse_args(argv)
    try:
        paths = notebooks(args.names)
    except ValueError as error:
        parser.error(str(error))
    for path in paths:
        start = time.perf_counter()
        print(f"executing {path.name} ...", flush=True)
        nb = execute(path, timeout=args.timeout)
        nbformat.write(nb, path)
        print(f"  wrote {path.name} with its outputs in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
