# The two promises of the README: `make demo` and `make test`, on a fresh machine
# with Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test tools benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test]"
	touch $(STAMP)

demo: install
	PYTHONUNBUFFERED=1 $(BIN)/python examples/demo.py

test: install tools
	PYTHONUNBUFFERED=1 $(BIN)/python -m pytest -ra --durations=15 tests

# System tools the tests drive: Debian's chromium (the dashboard's browser test, headless) and wrk
# (an outside HTTP load generator for the serving tests and benchmarks). Installed here when missing
# and the machine allows (root, apt); otherwise the tests that need them are skipped and say why.
TOOLS := chromium wrk
tools:
	@missing=""; for tool in $(TOOLS); do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) || \
	    echo "warning: could not install$$missing; the tests that need them will be skipped"; \
	  else echo "warning: missing$$missing (apt-get install$$missing); the tests that need them will be skipped"; fi; \
	fi

benchmark: install tools
	PYTHONUNBUFFERED=1 $(BIN)/python benchmarks/train_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
