"""Every notebook runs top to bottom in a fresh kernel and produces what it is about.

The notebooks are run by ``notebooks/execute.py`` (the script that refreshes their committed
outputs), in a kernel of this interpreter: a kernelspec for ``sys.executable`` is written to a
temporary folder, so nothing has to be registered with Jupyter. On a machine without a GPU the
notebooks pick tiny graphs and run the kernels through Triton's interpreter.
"""

import importlib.util
import re
from pathlib import Path
from typing import List

import pytest
import torch

# The notebooks run in a Jupyter kernel: without the test extra's Jupyter packages there is none.
_JUPYTER = "running the notebooks needs Jupyter (pip install -e '.[test]')"
nbformat = pytest.importorskip("nbformat", reason=_JUPYTER)
for _package in ("nbclient", "jupyter_client", "ipykernel"):
    pytest.importorskip(_package, reason=_JUPYTER)

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: Seconds one cell may run: a cell stuck this long is a broken notebook, not a slow one.
CELL_TIMEOUT = 600
#: On a CPU each notebook takes about a minute (tiny graphs); on a GPU they time full-size graphs.
MARKS = [pytest.mark.slow] if torch.cuda.is_available() else []


def _load_execute():
    spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute = _load_execute()


def _outputs(nb: nbformat.NotebookNode) -> List[dict]:
    return [output for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs]


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(o["text"] for o in _outputs(nb) if o["output_type"] == "stream" and o["name"] == "stdout")


def _count(nb: nbformat.NotebookNode, mime: str) -> int:
    return sum(mime in o.get("data", {}) for o in _outputs(nb))


def _numbers(pattern: str, text: str) -> List[float]:
    found = [float(value) for value in re.findall(pattern, text)]
    assert found, f"no output matches {pattern!r}"
    return found


def _check_common(nb: nbformat.NotebookNode) -> None:
    """No cell failed, every code cell ran, and the run states its device and date."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None, f"cell {cell.id} did not run"
    assert not [o for o in _outputs(nb) if o["output_type"] == "error"]
    stderr = "".join(o["text"] for o in _outputs(nb) if o["output_type"] == "stream" and o["name"] == "stderr")
    assert "Traceback" not in stderr
    run_info = [o["data"]["text/markdown"] for o in _outputs(nb) if "text/markdown" in o.get("data", {})]
    assert len(run_info) == 1 and run_info[0].startswith("**Executed on**")
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", run_info[0])


def check_quickstart(nb: nbformat.NotebookNode) -> None:
    text = _stdout(nb)
    # GCN, GAT and the custom layer: ours against PyG, float32 rounding only.
    differences = _numbers(r"max \|ours - PyG\| = ([0-9.e+-]+)", text)
    assert len(differences) == 3 and max(differences) < 1e-4
    assert "Plan: 2 operator(s), 0 PyG fallback(s)" in text  # GCN: one aggregation per layer
    assert "Plan: 1 operator(s), 0 PyG fallback(s)" in text  # the custom layer, captured
    assert "fallback reason: None" in text
    assert "= linear(x_i, nn.weight" in text  # the concatenating layer: products of the node rows
    assert "split by linearity" in text and "MLP" in text  # the MLP's layer runs staged
    assert "@triton.jit" in text and "tl.program_id" in text  # the generated Triton source is shown
    # Tables: accuracy, GAT's plan, speed (data frames render as HTML).
    assert _count(nb, "text/html") >= 3
    accuracy = next(
        o["data"]["text/plain"]
        for o in _outputs(nb)
        if "text/plain" in o.get("data", {}) and "test acc" in o["data"]["text/plain"]
    )
    # Rows "GCN  PyG  <val acc>  <test acc>  <seconds>": both models learn Cora, to the same accuracy.
    test_acc = {
        (model, library): float(test)
        for model, library, _, test in re.findall(r"(GCN|GAT)\s+(PyG|pyg_ugrapher)\s+([0-9.]+)\s+([0-9.]+)", accuracy)
    }
    assert len(test_acc) == 4
    for model in ("GCN", "GAT"):
        assert test_acc[model, "PyG"] > 0.7
        assert abs(test_acc[model, "pyg_ugrapher"] - test_acc[model, "PyG"]) <= 0.02
    speed = next(
        o["data"]["text/plain"]
        for o in _outputs(nb)
        if "text/plain" in o.get("data", {}) and "PyG compiled ms" in o["data"]["text/plain"]
    )
    assert "ours ms" in speed


def check_design_space(nb: nbformat.NotebookNode) -> None:
    text = _stdout(nb)
    # Every timed schedule computed the operator: relative error to torch.sparse at float32 level.
    assert max(_numbers(r"worst relative error(?: of a schedule)? ([0-9.e+-]+)", text)) < 1e-4
    for strategy in ("vertex", "edge", "group"):
        assert re.search(rf"{strategy} (wins|x\d)", text), f"no result for the {strategy} strategy"
    assert _count(nb, "image/png") >= 3  # strategy lines, slowdown heatmap, knob grids


def check_cost_model(nb: nbformat.NotebookNode) -> None:
    text = _stdout(nb)
    assert re.search(r"\d+ rows x \d+ features, trained", text)
    assert "leave-graphs-out cross-validation" in text
    assert min(_numbers(r"of it in \d+% of (\d+) cases", text)) > 0  # held-out cases were scored
    assert _count(nb, "image/png") >= 3  # predicted vs measured, chosen vs oracle, importances


CHECKS = {
    "01_quickstart": check_quickstart,
    "02_design_space": check_design_space,
    "03_cost_model": check_cost_model,
}


def test_every_notebook_is_checked():
    assert sorted(path.stem for path in execute.notebooks()) == sorted(CHECKS)


@pytest.mark.parametrize("name", [pytest.param(name, marks=MARKS) for name in sorted(CHECKS)])
def test_notebook_runs(name):
    (path,) = execute.notebooks([name])
    nb = execute.execute(path, timeout=CELL_TIMEOUT)
    _check_common(nb)
    CHECKS[name](nb)


def test_committed_notebooks_are_clean():
    """Committed notebooks are valid nbformat 4, name the generic ``python3`` kernel and carry no
    per-run metadata (cell timings, widget state) that would make every run a diff."""
    for path in execute.notebooks():
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["kernelspec"]["name"] == "python3"
        assert "widgets" not in nb.metadata
        for cell in nb.cells:
            assert "execution" not in cell.get("metadata", {}), f"{path.name}: cell {cell.id} has timings"


def test_unknown_notebook_name():
    with pytest.raises(ValueError, match="names: no notebook"):
        execute.notebooks(["no_such_notebook"])
