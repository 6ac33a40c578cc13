# The two promises of the README: `make demo` and `make test`, on a fresh machine
# with Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[all,test]"
	touch $(STAMP)

demo: install
	PYTHONUNBUFFERED=1 $(BIN)/python examples/demo.py

test: install
	PYTHONUNBUFFERED=1 $(BIN)/python -m pytest -ra tests

benchmark: install
	PYTHONUNBUFFERED=1 $(BIN)/python benchmarks/train_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
