# Two commands for a fresh machine (README): `make run` trains on the embedded default model,
# `make test` runs the test suite. Both set up .venv first (idempotent, ~5 min the first time).
VENV ?= .venv
PY := $(VENV)/bin/python
ESSA := $(VENV)/bin/essa
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-unit bench clean

setup:
	@bash tools/setup_env.sh
	@$(ESSA) prepare-model >/dev/null

run: setup
	$(ESSA) train $(ARGS)

test: setup
	$(PY) -m pytest -q -rs $(PYTEST_ARGS) tests

test-unit: setup
	$(PY) -m pytest -q -m "not integration" $(PYTEST_ARGS) tests

bench: setup
	$(ESSA) bench $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
