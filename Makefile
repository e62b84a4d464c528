# bookkeeper-aio: every target sets itself up; on a fresh machine `make test` or `make run` is all.
# The venv's interpreter: the system's python3 when it is 3.11 or newer and can make a venv,
# else python3 on PATH; `make PYTHON=...` overrides. Why: how CPython was built matters as much
# as our code. Debian's python3 is built with PGO and LTO, and on this code it runs ~1.5x
# faster than a default pyenv build (-O3, no PGO; docs/performance.md at e27bdd3, thirteenth round).
# An existing .venv keeps its interpreter: `make clean` first to switch.
SYSTEM_PYTHON := $(shell for p in /usr/bin/python3 python3; do \
	$$p -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; exit; }; done; echo python3)
PYTHON ?= $(SYSTEM_PYTHON)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test lint format run bench sim chaos clean kcat
SEEDS    ?= 0-999
DURATION ?= 600

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: setup kcat
	$(PY) -m pytest $(PYTEST_ARGS)

# kcat (librdkafka's command-line client) for the Kafka gateway's tests: Debian's package,
# installed only by root without a terminal (CI); otherwise its tests are skipped, visibly.
kcat:
	@if command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && { [ -n "$$CI" ] || [ ! -t 0 ]; } && command -v apt-get >/dev/null 2>&1; then \
		echo "installing kcat (Debian package) for the Kafka gateway tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q kcat >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q kcat >/dev/null 2>&1; } \
		|| apt-get install -y -q kafkacat >/dev/null 2>&1 \
		|| echo "NOTICE: kcat could not be installed: the kcat tests will be skipped"; \
	else \
		echo "NOTICE: kcat is not installed (as root: apt-get install kcat): the kcat tests will be skipped"; \
	fi

# ruff (lint and format) and mypy (the package, engines/ and benchmarks/; [tool.mypy] in
# pyproject.toml): what CI runs before the tests.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

run: setup
	$(PY) -m bookkeeper_aio.demo

# Prints one table; bench-results/ gets a PNG and a JSON per phase (latency percentiles and
# throughput per second) and all.json (every figure of the run).
bench: setup
	$(PY) -m benchmarks all --short --plots bench-results --json bench-results/all.json

sim: setup
	$(PY) -m bookkeeper_aio.sim --seeds $(SEEDS)

chaos: setup
	$(PY) -m bookkeeper_aio.chaos --duration $(DURATION)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache build *.egg-info
