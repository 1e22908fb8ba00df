# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install lint bench bench-peers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,ray,video]'
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
	$(PY) benchmarks/policy_scale.py --in-situ
	$(PY) benchmarks/sim_hour.py --quiet

# Peers (Cosmos-Xenna; tqdm is a dependency it does not declare) are installed here only,
# never by `make test`. On Python 3.11 pip picks cosmos-xenna 0.3.0 (0.4+ needs 3.12).
bench-peers: $(STAMP)
	$(PY) -m pip install --quiet cosmos-xenna tqdm
	$(PY) benchmarks/peers.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
