"""The PyG-tests runner on a synthetic test module: a plain pytest run and one whose plugin swaps the
class the module imports in ``pytest_configure``, as :mod:`benchmarks.pyg_tests_plugin` does with
PyG's layers; no PyG checkout needed."""

import sys
import textwrap
import types
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a plain folder at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import pyg_tests  # noqa: E402
from benchmarks.pyg_tests import Outcome  # noqa: E402
from benchmarks.pyg_tests_plugin import replace, restore  # noqa: E402

LIBRARY = """
class Layer:
    def value(self):
        return 1
"""
TESTS = """
import pytest
from fakelib import Layer


def test_value():
    assert Layer().value() == 1


@pytest.mark.parametrize("n", [1, 2])
def test_scaled(n):
    assert Layer().value() * n == n


def test_needs_package():
    pytest.skip("torch_sparse is not installed")


def test_script():
    Layer().script()


def test_broken_everywhere():
    assert Layer.__name__ == "Conv", "not a Conv"
"""
PLUGIN = """
import fakelib


class Ours:
    def value(self):
        return 2.0 / 2

    def script(self):
        raise RuntimeError("\\nCould not script Ours")


def pytest_configure(config):
    fakelib.Layer = Ours
"""


@pytest.fixture
def synthetic(tmp_path):
    (tmp_path / "fakelib.py").write_text(LIBRARY)
    (tmp_path / "fake_plugin.py").write_text(PLUGIN)
    test_file = tmp_path / "test_fake.py"
    test_file.write_text(textwrap.dedent(TESTS))
    return test_file


def test_plain_and_patched_runs(synthetic):
    env = {"PYTHONPATH": str(synthetic.parent)}
    baseline, returncode, _ = pyg_tests.run_pytest(synthetic, synthetic.parent, env=env, timeout=120)
    assert returncode == 1
    assert {test: o.outcome for test, o in baseline.items()} == {
        "test_value": "passed",
        "test_scaled[1]": "passed",
        "test_scaled[2]": "passed",
        "test_needs_package": "skipped",
        "test_script": "failed",
        "test_broken_everywhere": "failed",
    }
    assert baseline["test_needs_package"].message == "torch_sparse is not installed"
    assert baseline["test_script"].message == "AttributeError: 'Layer' object has no attribute 'script'"
    assert baseline["test_script"].where == "test_fake.py:20: Layer().script()"

    ours, returncode, output = pyg_tests.run_pytest(synthetic, synthetic.parent, "fake_plugin", env, timeout=120)
    rows = pd.DataFrame(pyg_tests.compare(baseline, ours, returncode, output)).set_index("test")
    assert list(rows.index) == list(baseline)
    assert list(rows.pyg) == ["passed"] * 3 + ["skipped", "failed", "failed"]
    assert list(rows.ours) == ["passed"] * 3 + ["skipped", "failed", "failed"]
    script = rows.loc["test_script"]
    assert script.message == "RuntimeError: Could not script Ours"  # the text past the bare "RuntimeError:"
    assert script.reason == "TorchScript (torch.jit.script)" and script["where"] == "test_fake.py:20: Layer().script()"
    broken = rows.loc["test_broken_everywhere"]
    assert broken.message == "AssertionError: not a Conv" and broken.pyg_message == broken.message
    assert rows.loc["test_needs_package", "pyg_message"] == "torch_sparse is not installed"
    assert (rows.loc[["test_value", "test_scaled[1]"], "reason"] == "").all()

    frame = rows.reset_index().assign(module="test_fake.py", suite="default", executor="reference")
    counts, total = pyg_tests.summary(frame).itertuples(index=False)
    assert (counts.module, total.module) == ("test_fake.py", "all") and counts[3:] == total[3:]
    assert (counts.tests, counts.pyg_passed, counts.ours_passed, counts.skipped_both) == (6, 3, 3, 1)
    assert (counts.ours_failed, counts.both_failed) == (0, 2)
    table = pyg_tests.markdown(frame.assign(**{column: "-" for column in pyg_tests.COLUMNS if column not in frame}))
    assert "| default | reference | all | 6 | 3 | 3 | 1 | 0 | 2 |" in table
    assert "| TorchScript (torch.jit.script) | 1 | 1 |" in table and "### other" in table


def test_tests_the_run_did_not_report():
    baseline = {"test_a": Outcome("passed"), "test_b": Outcome("skipped", "no pyg_lib")}
    module_error = {"": Outcome("error", "ImportError: cannot import name 'Conv'", "")}
    rows = pyg_tests.compare(baseline, module_error, 2, "")
    assert [(r["test"], r["pyg"], r["ours"]) for r in rows] == [
        ("test_a", "passed", "error"),
        ("test_b", "skipped", "error"),
    ]
    assert rows[0]["message"] == "ImportError: cannot import name 'Conv'" and rows[0]["reason"] == "other"
    crashed = pyg_tests.compare(baseline, {"test_a": Outcome("passed")}, -11, "collected 2 items\nFatal Python error\n")
    assert [r["ours"] for r in crashed] == ["passed", "crashed"]
    assert crashed[1]["message"] == "exit status -11: Fatal Python error"
    timed_out = pyg_tests.compare(baseline, {}, -1, "")
    assert [r["ours"] for r in timed_out] == ["timeout", "timeout"]


def test_parse_report_of_errors_and_classes():
    report = textwrap.dedent(
        """\
        ==================================== ERRORS ====================================
        ___________________________ ERROR at setup of TestA.test_b[x] ___________________________
        test/nn/test_m.py:7: in graph
            return make()
        E   ValueError: x: expected shape [num_nodes, channels]
        =========================== short test summary info ============================
        XFAIL test/nn/test_m.py::test_c - known
        ERROR test/nn/test_m.py::TestA::test_b[x] - ValueError: x: expected shape [num_nodes, channels]
        ERROR test/nn/test_n.py - ImportError: no module named torch_sparse
        """
    )
    outcomes = pyg_tests.parse_report(report)
    assert outcomes["test_c"] == Outcome("xfailed", "known")
    assert outcomes["TestA::test_b[x]"] == Outcome(
        "error", "ValueError: x: expected shape [num_nodes, channels]", "test_m.py:7: return make()"
    )
    assert outcomes[""].message == "ImportError: no module named torch_sparse"
    assert pyg_tests.classify(outcomes[""]) == "torch_sparse SparseTensor"


def test_replace_and_restore():
    module = types.ModuleType("fake_nn")
    module.GCNConv = original = type("GCNConv", (), {})
    ours = type("GCNConv", (), {})
    saved = replace([module], {"GCNConv": ours})
    assert module.GCNConv is ours
    restore([module], saved)
    assert module.GCNConv is original
    with pytest.raises(AttributeError, match="GATConv"):
        replace([module], {"GATConv": ours})


def test_test_files_of_each_group(tmp_path):
    for relative in (
        "nn/conv/test_gcn_conv.py",
        "explain/test_explainer.py",
        "explain/algorithm/test_gnn_explainer.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    (tmp_path / "explain" / "conftest.py").write_text("")
    assert pyg_tests.test_files(tmp_path, "conv", ["gcn"]) == [tmp_path / "nn/conv/test_gcn_conv.py"]
    assert pyg_tests.test_files(tmp_path, "explain") == [
        tmp_path / "explain/algorithm/test_gnn_explainer.py",
        tmp_path / "explain/test_explainer.py",
    ]
    with pytest.raises(SystemExit):
        pyg_tests.main(["--pyg-tests", str(tmp_path / "missing"), "--group", "explain"])
