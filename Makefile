# Every target installs what it needs into .venv first (torch as the CPU build 2.13.0).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH=$(BIN):$$PATH bash scripts/demo.sh

# two pytest-xdist workers (the suite's 2 cores), a test file's tests on one worker so that its
# module fixtures are built once, the files with slow tests first (tests/conftest.py orders them;
# --no-loadscope-reorder keeps that order); TEST_WORKERS=0 runs in one process. Each worker, and
# every command its tests start, gets its share of the cores this process may use (OMP_NUM_THREADS,
# which torch's default follows), so that the workers' thread pools do not take turns on the same
# cores. Both are expanded when the recipe runs, after $(STAMP) has installed bertforge.
TEST_WORKERS ?= 2
TEST_THREADS ?= $(shell $(BIN)/python -c "from bertforge.runtime import usable_cpus; \
	print(max(1, usable_cpus() // max(1, $(TEST_WORKERS))))")
PYTEST = OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -n $(TEST_WORKERS) \
	--dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_all.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
