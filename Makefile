# One command for each job; each sets itself up from a fresh clone (Python >= 3.10 needed).
#   make demo   train a small Transformer-XL on the embedded WikiText-2 for a few minutes
#   make test   lint + the test suite (CPU, a few minutes)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.txl-installed
DEMO_MINUTES ?= 4

.PHONY: install test test-all lint demo clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

test: lint
	bash .ci/pytest.sh -m "not slow"

test-all: lint
	bash .ci/pytest.sh

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/txl train --preset wt2-cpu --max-minutes $(DEMO_MINUTES) --out-dir runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
