# scalerl-mega: every target sets up .venv first (idempotent; re-runs when pyproject.toml changes).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest
# Default suite: everything but slow / slurm / gpu tests, two workers (2-core CI).
TEST_ARGS ?= -n 2 --dist loadfile

.PHONY: setup test test-slow test-slurm demo demo-seeds bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, exactly pinned: the CPU wheel on this machine's disk (a looser pin pulls a CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PYTEST) -m "not slow and not slurm and not gpu" $(TEST_ARGS) tests

test-slow: setup
	$(PYTEST) -m "slow and not slurm" tests

test-slurm: setup
	$(PYTEST) -m slurm tests

demo: setup
	$(VENV)/bin/scalerl-train experiment=demo

demo-seeds: setup
	$(PYTEST) -m slow tests/integration/test_demo_seeds.py

bench: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
