# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := .demo

.PHONY: bootstrap demo test lint typecheck docs unit clean

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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

unit: $(STAMP)
	$(BIN)/coverage erase
	$(BIN)/python -m pytest -W error -n 2 --cov --cov-report=term-missing:skip-covered

test: lint typecheck docs unit

clean:
	rm -rf $(VENV) $(DEMO) .coverage .coverage.* .pytest_cache .mypy_cache .ruff_cache
