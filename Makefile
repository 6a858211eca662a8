# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := .demo
# nodemailer for tests/test_foreign_clients.py, from tests/node/package-lock.json, into .node/;
# `make test` installs it only where Node.js is present.
NODE_DIR := .node
NODE_STAMP := $(NODE_DIR)/.installed
NODE_DEPS := $(if $(shell command -v node 2>/dev/null),$(NODE_STAMP))

# Other Pythons, where this machine has them (on PATH or from pyenv): the lowest that
# pyproject.toml allows (else $(PYTHON)), and the newest there is.
LOWEST_PYTHON := $(or $(shell bash .ci/python-of 3.10),$(PYTHON))
NEWEST_PYTHON := $(shell bash .ci/python-of 3.14 3.13 3.12)

# The lowest versions pyproject.toml allows (.ci/min-versions.txt), in a venv of their own.
MIN_VENV := .venv-min
MIN_STAMP := $(MIN_VENV)/.installed
MIN_TESTS := examples tests/test_plugin.py tests/test_xdist.py tests/test_misuse.py \
	tests/test_frozen_time.py tests/test_packaging.py

# The newest releases of everything, on the newest Python: Django 6.1, for one, needs 3.12.
NEW_VENV := .venv-newest
NEW_STAMP := $(NEW_VENV)/.installed

.PHONY: bootstrap demo test lint typecheck docs unit mindeps newest node-deps bench clean

bootstrap: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/python -m pytest examples/signup -n auto -p no:cacheprovider \
		--junitxml=$(DEMO)/junit.xml --mailbox-receipts=$(DEMO)/receipts.jsonl
	$(BIN)/python -m pytest_mailbox receipts $(DEMO)/junit.xml --timeline

# Every file the plugin opens names its encoding (a receipts file is UTF-8 under LC_ALL=C
# too): ruff has that rule (PLW1514) in preview only, so it is asked for alone, on src.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff check --preview --select PLW1514 src
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

node-deps: $(NODE_STAMP)

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	mkdir -p $(NODE_DIR)
	cp tests/node/package.json tests/node/package-lock.json $(NODE_DIR)/
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

unit: $(STAMP) $(NODE_DEPS)
	$(BIN)/coverage erase
	$(BIN)/python -m pytest -W error -n 2 --cov --cov-report=term-missing:skip-covered

# Made anew when a pin changes: a pin removed must not leave its old version behind.
$(MIN_STAMP): pyproject.toml .ci/min-versions.txt
	rm -rf $(MIN_VENV)
	$(LOWEST_PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MIN_VENV)/bin/python -m pip install --quiet -c .ci/min-versions.txt -e . \
		pytest-xdist pytest-html aiosmtplib hypothesis freezegun pytest-freezer time-machine \
		hatchling
	touch $@

# The plugin's tests through pytester, and the example suite, on those lowest versions.
mindeps: $(MIN_STAMP)
	$(MIN_VENV)/bin/python -m pytest -c .ci/pytest-min.ini --rootdir . -p no:cacheprovider \
		-n 2 $(MIN_TESTS)

# Every test again, on the newest Python and the newest release of every dependency (a
# venv made anew when pyproject.toml changes; `make clean` for releases since).
$(NEW_STAMP): pyproject.toml
	rm -rf $(NEW_VENV)
	$(NEWEST_PYTHON) -m venv $(NEW_VENV)
	$(NEW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(NEW_VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

ifeq ($(NEWEST_PYTHON),)
newest:
	@echo "make newest: NOT RUN: no python3.12, python3.13 or python3.14 on this machine," \
		"so the newest releases (Django 6.1 among them) are not tested here" >&2
else
newest: $(NEW_STAMP) $(NODE_DEPS)
	$(NEW_VENV)/bin/python -m pytest -W error -n 2 -p no:cacheprovider
endif

test: lint typecheck docs unit mindeps newest

# Benchmarks beside what we compare against (installed here): prints a table and writes
# docs/performance.md. The full run takes a while; `make bench ARGS=--quick` under a minute.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet smtpdfix
	$(BIN)/python benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) $(MIN_VENV) $(NEW_VENV) $(DEMO) $(NODE_DIR) .coverage .coverage.* .pytest_cache .mypy_cache .ruff_cache
