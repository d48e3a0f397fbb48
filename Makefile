# The two entry points of the README. Each one builds the local virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and pinned: on the project's CPU machines torch==2.13.0 is a local CPU
# wheel, while an unpinned torch would pull several GB of CUDA packages. GPU users override it.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test lint clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	touch $@

# The demo needs the run-time requirements, plus numpy<2.4 for Triton's interpreter (no GPU).
$(VENV)/.demo: $(VENV)/.torch setup.cfg pyproject.toml
	$(PY) -m pip install --quiet -e ".[interpreter]"
	touch $@

$(VENV)/.test: $(VENV)/.torch setup.cfg pyproject.toml
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

# Without a GPU the kernels run through Triton's interpreter, which must be on before Triton loads.
INTERPRET := $(if $(shell command -v nvidia-smi 2>/dev/null),,TRITON_INTERPRET=1)

demo: $(VENV)/.demo
	$(INTERPRET) $(PY) -m pyg_ugrapher.demo

test: $(VENV)/.test
	$(PY) -m pytest tests

lint: $(VENV)/.test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV)
