# The book: `make book` builds it from the recorded runs; `make test` runs the tests.
# On a GPU box: `make live` measures and records new runs (see README.md).

VENV       ?= .venv
BOOTSTRAP  ?= python3
PY          = $(VENV)/bin/python
# `make live` runs with the GPU box's own Python (its torch), not the venv's.
PYTHON     ?= python3
CHAPTERS   ?=
# `make test-tier TIER=...`: unit, book or live.
TIER       ?= unit
# Test processes (pytest-xdist): one per CPU by default; TEST_JOBS=0 runs them in this process.
# --dist loadfile keeps a file's tests in one process, so its module fixtures are made once.
# --durations=10 ends the report with the ten slowest tests, to see where the time goes.
TEST_JOBS  ?= auto
PYTEST      = $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=10
# Wheelhouse for an air-gapped GPU box: its Python version and platform.
WHEEL_PYTHON   ?= 3.12
WHEEL_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any
WHEELHOUSE ?= wheelhouse

export PYTHONPATH := $(CURDIR)
# Python writes the byte code of what it imports (make venv leaves that to it, below): where
# PYTHONDONTWRITEBYTECODE is set, as on the machine the targets are timed on, every notebook
# kernel and test process would compile pandas' and torch's modules again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: book test test-fast test-tier lint live smoke nightly recover venv wheelhouse clean

# pip would byte-compile every module of torch and transformers as it installs them, one file at a
# time (about 55 s of a 90 s install on two CPUs); --no-compile leaves it to Python, which
# compiles the few modules the book and tests import, once, when they first import them.
$(VENV)/.installed: requirements.txt pyproject.toml
	$(BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

venv: $(VENV)/.installed

# Checks the runs first; on failure the last line says why (the full log is build/book.log).
book: $(VENV)/.installed
	@$(PY) -m labsupport book

# Lint and format checks first (ruff, configured in pyproject.toml; notebooks included), then the tests:
# every tier in one session (unit, book, live: each test carries its mark; tests/conftest.py checks them), so the book is built once.
test: lint
	$(PYTEST) tests

# The unit tier only: small committed fixtures, no notebook executed, no book built (minutes).
test-fast: lint
	$(PYTEST) -m unit tests

# One tier after the lint: `make test-tier TIER=book` (or live).
test-tier: lint
	$(PYTEST) -m $(TIER) tests

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

live:
	$(PYTHON) -m labsupport live $(CHAPTERS)

# Every chapter (or CHAPTERS) live with its smallest parameters into build/smoke/; nothing published.
smoke:
	$(PYTHON) -m labsupport live --smoke $(CHAPTERS) $(SMOKE_FLAGS)

# Every chapter live, validated, compared with the published runs, promoted, book rebuilt.
# NIGHTLY_FLAGS=--no-book on a box without jupyter-book.
nightly:
	$(PYTHON) -m labsupport nightly $(CHAPTERS) $(NIGHTLY_FLAGS)

# Finish a publication, or set aside the runs, of a nightly or live command that was killed.
recover:
	$(PYTHON) -m labsupport recover

wheelhouse:
	$(BOOTSTRAP) -m pip download --only-binary=:all: --python-version $(WHEEL_PYTHON) --implementation cp \
	    $(foreach p,$(WHEEL_PLATFORMS),--platform $(p)) -d $(WHEELHOUSE) -r requirements-gpubox.txt
	@echo "Wheels for Python $(WHEEL_PYTHON) in $(WHEELHOUSE)/; on the box: pip install --no-index --find-links $(WHEELHOUSE) -r requirements-gpubox.txt"

clean:
	rm -rf _build build
