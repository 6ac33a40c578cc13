# The two promises of the README: `make demo` and `make test`, on a fresh machine
# with Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test browser benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test]"
	touch $(STAMP)

demo: install
	PYTHONUNBUFFERED=1 $(BIN)/python examples/demo.py

test: install browser
	PYTHONUNBUFFERED=1 $(BIN)/python -m pytest -ra --durations=15 tests

# The dashboard's browser test drives Debian's chromium, headless. Installed here when missing and
# the machine allows (root, apt); otherwise that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	      echo "warning: could not install chromium; the dashboard's browser test will be skipped"; \
	    else echo "warning: no chromium (apt-get install chromium); the dashboard's browser test will be skipped"; fi; }

benchmark: install
	PYTHONUNBUFFERED=1 $(BIN)/python benchmarks/train_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
