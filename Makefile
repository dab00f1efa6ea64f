# One command for each job; each sets itself up from a fresh clone (Python >= 3.10 needed).
#   make demo   train a small Transformer-XL on the embedded WikiText-2 (400 steps, about 2 minutes of training)
#   make test   lint + the documentation site + the test suite (CPU, a few minutes)
#   make test-hf4   the tests checked against Hugging Face's TransfoXL of transformers 4 (their own environment)
#   make test-tf   the tests checked against the official TensorFlow code (TensorFlow in an environment of its own)
#   make test-avx2   the test suite again with PyTorch's CPU kernels held to AVX2 (what an AVX2-only CPU runs)
#   make docs   build the documentation site into site/ (mkdocs --strict); make docs-serve serves it
#   make mutate MODULE=src/transformer_xl/train/resume.py   mutation testing of one module (minutes; not in `make test`)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
# Stamps: the demo needs the runtime dependencies only; the tests add the test extra, the docs the docs extra.
RUNTIME := $(VENV)/.txl-runtime
TESTDEPS := $(VENV)/.txl-test
DOCSDEPS := $(VENV)/.txl-docs
MUTATEDEPS := $(VENV)/.txl-mutation
# The demo's thread count is pinned: CPU float results depend on it (and on the torch build), not on the speed.
DEMO_THREADS ?= 1

.PHONY: install test test-slow test-avx2 test-hf4 test-tf test-all lint docs docs-serve figures demo clean mutate gpu-check gpu-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	touch $@

$(TESTDEPS): $(RUNTIME)
	$(PIP) -e ".[test]"
	touch $@

$(DOCSDEPS): $(RUNTIME)
	$(PIP) -e ".[docs]"
	touch $@

$(MUTATEDEPS): $(TESTDEPS)
	$(PIP) -e ".[test,mutation]"
	touch $@

install: $(RUNTIME)

lint: $(TESTDEPS)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

# --strict: a broken link, a missing page or an unresolved API reference fails the build.
docs: $(DOCSDEPS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(DOCSDEPS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The tables of figures in README.md and docs/*.md, rendered again from benchmarks/results/*.json.
figures: $(RUNTIME)
	$(BIN)/python benchmarks/render_docs.py

test: lint docs
	bash .ci/pytest.sh -m "not slow and not hf4 and not tf"

# The tests marked slow (subprocess-heavy and long runs: torchrun and kill-and-resume, the fuzz campaign at its full
# size, the serve soak, compiled graphs, trained experiments, the whole GPU check on tiny CPU sizes), in parallel
# workers, each within its budget (tests/conftest.py); CI runs them after `make test`.
test-slow: $(TESTDEPS)
	bash .ci/pytest.sh -m "slow and not hf4 and not tf"

# The suite with PyTorch's CPU kernels held to AVX2 (no AVX-512, no bf16 or AMX instructions: a bf16 product ~100x
# slower than fp32), as on most laptops and AMD Zen 2/3 servers; CI runs it after `make test` on an AVX-512 machine.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
test-avx2: $(TESTDEPS)
	$(AVX2_ENV) bash .ci/pytest.sh -m "not slow and not hf4 and not tf"

# The tests whose oracle is Hugging Face's deprecated TransfoXL (transformers 4.35-4.57; the test extra has
# transformers 5, which removed it), in their own environment (.venv-hf4, pinned by constraints-hf4.txt): every one
# of them runs (TXL_REQUIRE_HF4: none may skip for want of the oracle).
HF4 := .venv-hf4
HF4DEPS := $(HF4)/.txl-oracle
$(HF4)/bin/python:
	$(PYTHON) -m venv $(HF4)

$(HF4DEPS): pyproject.toml constraints-hf4.txt | $(HF4)/bin/python
	$(HF4)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-hf4.txt -e ".[oracle]"
	touch $@

HF4_TESTS = $(shell grep -rlE 'mark\.hf4' tests | sort)
test-hf4: $(HF4DEPS)
	TXL_REQUIRE_HF4=1 PYTEST_VENV=$(HF4) bash .ci/pytest.sh -m hf4 $(HF4_TESTS)

# The tests whose oracle is the official TensorFlow code (tf/model.py of kimiyoung/transformer-xl, run as it is by
# tests/equivalence/tf_oracle.py under TensorFlow 2's v1 layer): TensorFlow in an environment of its own (.venv-tf,
# pinned by constraints-tf.txt, no torch), called as a subprocess by the tests, which run in .venv
# (TXL_REQUIRE_TF: none may skip for want of the oracle).
TFENV := .venv-tf
TFDEPS := $(TFENV)/.txl-tf-oracle
$(TFENV)/bin/python:
	$(PYTHON) -m venv $(TFENV)

$(TFDEPS): constraints-tf.txt | $(TFENV)/bin/python
	$(TFENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-tf.txt tensorflow-cpu tf-keras
	touch $@

test-tf: $(TESTDEPS) $(TFDEPS)
	TXL_REQUIRE_TF=1 bash .ci/pytest.sh -m tf tests/equivalence/test_tf.py

test-all: lint docs
	bash .ci/pytest.sh

# Mutation testing of MODULE (a file or a package folder) against its mirror tests and related ones (or TESTS="...");
# writes benchmarks/results/mutation/<module>.json under LABEL (after; REF=main LABEL=before measures main's code)
# and the table of docs/mutation-testing.md; RECHECK=1 runs the last run's survivors again against the current tests;
# CHILDREN=1 tests one mutant at a time (leaves a core free).
MODULE ?=
TESTS ?=
LABEL ?= after
REF ?=
RECHECK ?=
CHILDREN ?= 2
mutate: $(MUTATEDEPS)
	@test -n "$(MODULE)" || { echo "make mutate: give MODULE=src/transformer_xl/... (a file or a folder)" >&2; exit 2; }
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python benchmarks/mutate.py $(MODULE) --label $(LABEL) \
		$(if $(TESTS),--tests "$(TESTS)") $(if $(REF),--ref $(REF)) $(if $(RECHECK),--recheck) --max-children $(CHILDREN)
	$(BIN)/python benchmarks/mutate.py --docs

# Never deletes a run: trains into runs/demo, or runs/demo-2, -3, ... when it exists (resume one with
# `txl train --resume runs/demo`). Capped by steps, not time, so every machine computes the same numbers.
demo: $(RUNTIME)
	@out=runs/demo; n=1; while [ -e "$$out" ]; do n=$$((n + 1)); out=runs/demo-$$n; done; \
	echo "make demo: training into $$out with $(DEMO_THREADS) thread(s)"; \
	echo "OMP_NUM_THREADS=$(DEMO_THREADS) $(BIN)/txl train --preset demo --out-dir $$out"; \
	OMP_NUM_THREADS=$(DEMO_THREADS) MKL_NUM_THREADS=$(DEMO_THREADS) $(BIN)/txl train --preset demo --out-dir "$$out"

# The prepared GPU check (one GPU, under 8 minutes; no venv: txl from src/): OUT=DIR, ARGS="--device cpu --tiny".
# The project's venv where there is one (here), else $(PYTHON) (a GPU machine's own torch).
CHECK_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(CHECK_PYTHON) benchmarks/gpu_check.py --out $(or $(OUT),gpu-check-out) $(ARGS)

# The wheels `txl serve` needs beyond a GPU machine's usual image (fastapi, uvicorn, pydantic; the versions of
# constraints.txt), for CPython 3.12 on x86-64, into .whl/: carry them there and install them with --target.
GPU_WHEELS := fastapi starlette pydantic pydantic_core annotated-types annotated-doc typing-inspection typing_extensions \
	opentelemetry-api importlib_metadata zipp uvicorn
gpu-wheels: $(BIN)/python
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl \
		$$(for w in $(GPU_WHEELS); do grep -i -m1 "^$$w==" constraints.txt || { echo "$$w not pinned" >&2; exit 1; }; done)

clean:
	rm -rf $(VENV) $(HF4) $(TFENV) .pytest_cache .ruff_cache site .mutation  # never runs/
