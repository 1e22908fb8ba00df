# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/conveyor demo

test: $(STAMP)
	$(VENV)/bin/ruff check conveyor tests benchmarks
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check conveyor tests benchmarks
	$(VENV)/bin/ruff format --check conveyor tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/unbalanced3.py --mode sleep
	$(PY) benchmarks/unbalanced3.py --mode cpu
	$(PY) benchmarks/tiny3.py
	$(PY) benchmarks/memory.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
