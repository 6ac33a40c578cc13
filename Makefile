# The two promises of the README: `make demo` and `make test`, on a fresh machine
# with Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bytecode demo test lint docs tools benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test,lint,docs]"
	touch $(STAMP)

# The package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (this machine's environment
# sets it), no process writes it, and each of the hundreds of Ray workers a run or the suite starts would
# compile the raymodel modules it imports (`import raymodel, raymodel.jobs`: 0.23-0.26 s without, 0.16-0.18 s with).
bytecode: install
	$(BIN)/python -m compileall -q raymodel tests examples benchmarks

demo: install bytecode
	PYTHONUNBUFFERED=1 $(BIN)/python examples/demo.py

# The full check, as CI runs it: lint (style and the import layers), the manual, then the suite.
test: install tools lint docs bytecode
	PYTHONUNBUFFERED=1 $(BIN)/python -m pytest -ra --durations=15 tests

# ruff (lint and format check), import-linter (the layers of docs/architecture.md) and mypy (the
# package's types, as a user's type checker reads them), each configured in pyproject.toml.
LINTED := raymodel tests examples benchmarks
lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports
	$(BIN)/mypy

# The manual in docs/ (MkDocs Material + mkdocstrings); --strict: a broken link or reference fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

# System tools the tests drive: Debian's chromium (the dashboard's browser test, headless), wrk (an
# outside HTTP load generator for the serving tests and benchmarks) and iproute2's `ip` (a network
# namespace for the client off the cluster). Installed here when missing (as root, with apt-get); a
# machine where they cannot be installed fails here, naming them, rather than let the tests that need
# them pass untested.
TOOLS := chromium:chromium wrk:wrk ip:iproute2
tools:
	@missing=""; for pair in $(TOOLS); do command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) || \
	    { echo "error: could not install$$missing with apt-get; the tests need them" >&2; exit 1; }; \
	  else echo "error: missing$$missing: install them (apt-get install$$missing) and run again" >&2; exit 1; fi; \
	fi

benchmark: install tools
	PYTHONUNBUFFERED=1 $(BIN)/python benchmarks/train_overhead.py

clean:
	rm -rf $(VENV) build site *.egg-info
