# The two commands that matter: `make run` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.steptp-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export OPENBLAS_NUM_THREADS := 1
export DVC_SITE_CACHE_DIR := $(CURDIR)/.dvc/tmp/site-cache
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup run test test-all bench lint docs docs-serve clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changed; torch first (its CPU build: see pyproject.toml).
# --no-compile: Python writes the bytecode of the modules a run imports when it first imports them;
# compiling every installed file up front took 90 of the 190 s of setup on 2 cores.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --no-compile "torch==2.13.0"
	$(PY) -m pip install -qq --no-compile -e ".[dev]"
	@touch $(STAMP)

# The main job: dvc repro of the whole pipeline on the default profile (params.yaml), then dvc push.
run: setup
	$(VENV)/bin/steptp repro

# Two test processes, each module's tests in one of them (its module fixtures built once): half the
# suite waits on subprocesses, servers and compilers, so 2 processes on 2 cores took 7.9 min where
# one took 15.5 (Intel Xeon VM). `make test TEST_WORKERS=0` runs it in this process, as `pytest` does.
# Tests marked `timing` compare wall-clock times, so they run after, alone: beside the other process a
# parallel state's OpenMP barriers wait for a descheduled thread (CI timed a 167 us state at 3,427 us).
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope -m "not slow and not timing"
	$(PY) -m pytest -m "timing and not slow"
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir $(CURDIR)/site

test-all: setup
	$(PY) -m pytest -m ""

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The documentation site (docs/, mkdocs.yml) under site/; docs-serve serves it at http://127.0.0.1:8000
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir $(CURDIR)/site

docs-serve: setup
	$(VENV)/bin/mkdocs serve

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
