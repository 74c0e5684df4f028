# The two commands of the README:
#   make run    start Lifeboat (web, workers, beat, Redis, S3) with data under var/
#   make test   run the test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-quick lint format bench-ingest clean

# Two distributions, both editable: the client (client/pyproject.toml, the lifeboat/
# package) and the server (pyproject.toml), which depends on the client at its version.
# The uninstall removes what a .venv made before the split installed as "lifeboat".
# --no-compile: Python compiles a module's bytecode when it is first imported (below, the
# caches are on); pip's compiling of every file of every package (torch's tests included)
# took 45 s of a fresh install's 94 s here, the first imports of the tests' packages 7 s.
$(STAMP): pyproject.toml setup.py client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	! $(BIN)/python -m pip show --quiet lifeboat 2>/dev/null || \
	  $(BIN)/python -m pip uninstall --quiet --yes lifeboat
	$(BIN)/python -m pip install --quiet --no-compile -e ./client -e '.[dev]'
	touch $(STAMP)

# Bytecode caches on, even where the environment turns them off: the tests start hundreds
# of Python processes (test processes, workers, inspection children), and without the cache
# each compiles the same modules again; this halves a test process's start (7.2 s to 3.6 s).
# Python reads an empty PYTHONDONTWRITEBYTECODE as unset.
export PYTHONDONTWRITEBYTECODE :=

run: $(STAMP)
	$(BIN)/python scripts/run_stack.py

# In parallel processes (pytest-xdist): one more than the cores, at most 8, since a test
# spends much of its time waiting for a server or worker process it started (TEST_JOBS=0:
# one process). Each takes whole test modules (--dist loadscope), so that a module's
# fixture (a trained checkpoint, a sharded save) is built once, the longest modules first
# (tests/support/module_order.py). In the quick tier --no-loadscope-reorder keeps that
# order: by default pytest-xdist sorts the modules by their number of tests instead, which
# sent its longest ones (few tests, each slow) to the end, where they ran on after the
# others had finished.
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(len(os.sched_getaffinity(0)) + 1, 8))")
XDIST := -n $(TEST_JOBS) --dist loadscope

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The tests that need no server, worker, object store, browser or Slurm (-m "not stack").
test-quick: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) --no-loadscope-reorder -m "not stack" -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo  # the layers: [tool.importlinter] in pyproject.toml
	$(BIN)/mypy  # the domain's types: [tool.mypy] in pyproject.toml

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-ingest: $(STAMP)
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) var/
