# Orrery — every habit is a target. `make run` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.runtime
DATA_DIR ?= ./orrery-data
export ORRERY_SERVERS_DIR ?= /tmp/orrery-servers
SCIFACT ?= ../shared/data/scifact

.PHONY: help venv runtime browser run test test-unit check lint format typecheck typecheck-311 typecheck-313 imports resolve-pythons bench bench-quality bench-servers bench-chonkydb schemas ui-screenshots servers-up servers-down clean

help:
	@echo "make run        embedded stack with the sample corpus on http://127.0.0.1:8080"
	@echo "make test       venv + local servers + the whole test suite"
	@echo "make check      ruff, mypy (strict) and import-linter (for 3.11 and 3.13)"
	@echo "make resolve-pythons  the pinned dependency set resolves to wheels on 3.12 and 3.13"
	@echo "make bench      benchmarks (writes docs/bench/)"
	@echo "make ui-screenshots  the browser tests, photographing into docs/ui/"
	@echo "make bench-quality  nDCG@10 / Recall@100 on SciFact over HTTP (SCIFACT=dir)"
	@echo "make bench-servers  ingest, freshness and top-k: embedded vs servers at 100k"
	@echo "make bench-chonkydb  the ChonkyDB dialect's p50 overhead over native topk_records"

# The test venv has the optional `otlp` extra too: tests/e2e/test_otlp_export.py exports
# over OTLP/HTTP, so CI covers the exporter an operator installs.
$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,otlp]"
	touch $(STAMP)

venv: $(STAMP)

# `make run` needs the runtime dependencies only (no test or lint tools).
$(RUNTIME_STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

runtime: $(RUNTIME_STAMP)

# The browser tests (tests/browser) drive Debian's chromium with its chromedriver;
# nothing is downloaded at test time. Installed here when missing (apt, as root).
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "install chromium and chromium-driver (apt, as root) for tests/browser"; exit 1; fi

# Refreshes the README's pictures (docs/ui/*.png); `make test` photographs into a tmp dir.
ui-screenshots: venv browser
	ORRERY_UI_SCREENSHOTS=docs $(VENV)/bin/pytest -q tests/browser

run: runtime
	$(VENV)/bin/orrery serve --sample --data-dir $(DATA_DIR)

servers-up: venv
	$(PY) tests/harness/servers.py up

servers-down:
	$(PY) tests/harness/servers.py down

# The suite runs in PYTEST_WORKERS processes (pytest-xdist; 0 = one process). Each test
# file stays on one worker (`--dist loadfile`): module-scoped servers are started once.
# Files go out in collection order (`--no-loadscope-reorder`), which tests/conftest.py
# makes the files with slow tests first: xdist's own order (most tests first) left the
# long files of few tests to the end, one worker busy for minutes while the other idled.
# Workers share the harness servers; every test names its topics, databases, indexes,
# collections, key prefixes and data dirs uniquely (tests/conftest.py).
# Session 30: the two workers were never without a file (the durations add up to both
# workers' wall time, collection aside) and ended within 10 s, so the order leaves nobody
# idle; the time is in the tests. Read-only tests share a loaded fixture instead of making
# one each (tests/conformance/test_vector_index.py, `loaded_shared`). Whether a third
# worker would find idle CPU (tests waiting on servers) was not measurable that day (the
# machine was shared with a 1M-record benchmark).
PYTEST_WORKERS ?= 2
# check and resolve-pythons run beside servers-up: the JVMs start while mypy runs.
SETUP_JOBS ?= 4

test: venv browser
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target check resolve-pythons servers-up
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests -m "not measurement" --durations=30

test-unit: venv
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/unit tests/conformance -m "not servers"

check: lint typecheck imports

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	# The same code read as 3.13 (syntax, deprecations); UP is left out: its fixes would
	# need 3.12+ syntax, and 3.11 stays supported.
	$(VENV)/bin/ruff check --target-version py313 --extend-ignore UP .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Two targets, so that `make -j` (as `make test` runs `check`) types the code for 3.11 and
# 3.13 side by side: on a fresh clone each is a cold mypy of a minute or more, the longest
# step before the tests (session 30, a loaded 2-core machine: 165 s one after the other,
# 77 s side by side). 3.13 keeps its own cache directory: neither writes the other's.
typecheck: typecheck-311 typecheck-313

typecheck-311: venv
	$(VENV)/bin/mypy

typecheck-313: venv
	$(VENV)/bin/mypy --python-version 3.13 --cache-dir .mypy_cache/py313

# CI runs 3.11 only (the one interpreter of the machine). For 3.12 and 3.13 it proves what
# a packager would: every pinned dependency (and what it pulls in) has a wheel and the set
# resolves, with pip's resolver for that interpreter version (`--dry-run`: nothing is
# installed). Needs the package index; about a minute per version.
RESOLVE_PYTHONS ?= 3.12 3.13
resolve-pythons: venv
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; o = p["optional-dependencies"]; print("\n".join(p["dependencies"] + o["dev"] + o["otlp"]))' > $(VENV)/pinned-requirements.txt
	@for v in $(RESOLVE_PYTHONS); do \
	  echo "resolving the pinned dependency set for Python $$v (wheels only)"; \
	  $(PY) -m pip install --quiet --dry-run --only-binary=:all: --python-version $$v \
	    --ignore-installed --target $(VENV)/resolve-$$v \
	    --report $(VENV)/resolve-$$v.json -r $(VENV)/pinned-requirements.txt || exit 1; \
	  $(PY) -c 'import json, sys; r = json.load(open(sys.argv[1])); print("Python %s: %d wheels resolved" % (sys.argv[2], len(r["install"])))' $(VENV)/resolve-$$v.json $$v; \
	done

imports: venv
	$(VENV)/bin/lint-imports

bench-quality: venv
	$(PY) bench/quality.py $(SCIFACT)

bench-servers: venv servers-up
	flock /tmp/orrery-bench.lock $(PY) bench/servers.py

bench-chonkydb: venv
	cat /proc/loadavg
	$(PY) bench/chonkydb.py

schemas: venv
	$(PY) -m contracts.export_schemas docs/schemas

bench: venv
	$(VENV)/bin/pytest -q -s tests -m measurement
	$(PY) bench/topk.py
	$(PY) bench/generations.py --size 100000
	ORRERY_TENANCY_EXAMPLES=2000 $(VENV)/bin/pytest -q tests/e2e/test_tenancy_properties.py

clean:
	rm -rf $(DATA_DIR) .pytest_cache .mypy_cache .ruff_cache
