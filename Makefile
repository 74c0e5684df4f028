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
$(STAMP): pyproject.toml setup.py client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	! $(BIN)/python -m pip show --quiet lifeboat 2>/dev/null || \
	  $(BIN)/python -m pip uninstall --quiet --yes lifeboat
	$(BIN)/python -m pip install --quiet -e ./client -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python scripts/run_stack.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests that need no server, worker, object store, browser or Slurm (-m "not stack").
test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not stack" -q $(PYTEST_ARGS)

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
