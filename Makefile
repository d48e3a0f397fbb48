# The two entry points of the README. Each one builds the local virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and pinned: on the project's CPU machines torch==2.13.0 is a local CPU
# wheel, while an unpinned torch would pull several GB of CUDA packages. GPU users override it.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

# Without a GPU the kernels run through Triton's interpreter, which must be on before Triton loads.
INTERPRET := $(if $(shell command -v nvidia-smi 2>/dev/null),,TRITON_INTERPRET=1)

demo: $(VENV)/.installed
	$(INTERPRET) $(PY) -m pyg_ugrapher.demo

test: $(VENV)/.installed
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV)
