# Two commands for a fresh machine (README): `make run` trains on the embedded default model,
# `make test` runs the test suite. Both set up .venv first (idempotent, ~5 min the first time).
VENV ?= .venv
PY := $(VENV)/bin/python
ESSA := $(VENV)/bin/essa
ARGS ?=
# make run's wall-clock limit (s, from the start of `essa train`, warm start included): a generation
# starts only when it and the final paired validation fit (engine/commands/train_schedule.py::deadline_allows;
# periodic validations and the sampled pass yield to generations), so the demo ends within 30 minutes on a
# slow CPU too (fp32 on AVX2). DEADLINE_S=null (or empty) runs every generation.
DEADLINE_S ?= 1680
PYTEST_ARGS ?=

.PHONY: setup run test test-all test-unit bench clean

setup:
	@bash tools/setup_env.sh
	@$(ESSA) prepare-model >/dev/null

run: setup
	$(ESSA) train deadline_s=$(or $(DEADLINE_S),null) $(ARGS)

# make test: unit and integration tests, the slow tier left out (CI); make test-all: every test
test: setup
	$(PY) -m pytest -q -rs -m "not slow" $(PYTEST_ARGS) tests

test-all: setup
	$(PY) -m pytest -q -rs $(PYTEST_ARGS) tests

test-unit: setup
	$(PY) -m pytest -q -m "not integration" $(PYTEST_ARGS) tests

bench: setup
	$(ESSA) bench $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
