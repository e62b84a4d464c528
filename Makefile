# bookkeeper-aio: every target sets itself up; on a fresh machine `make test` or `make run` is all.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test lint format run bench sim chaos clean
SEEDS    ?= 0-999
DURATION ?= 600

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

run: setup
	$(PY) -m bookkeeper_aio.demo

bench: setup
	$(PY) -m benchmarks all --short

sim: setup
	$(PY) -m bookkeeper_aio.sim --seeds $(SEEDS)

chaos: setup
	$(PY) -m bookkeeper_aio.chaos --duration $(DURATION)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
