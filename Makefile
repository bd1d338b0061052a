# Everything a fresh machine needs: `make run` to use the console, `make test` to test it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000
# The demo workflows' remotes are fakes the web process serves; honcho hands each process
# its own PORT, so the workers are told the web server's address explicitly.
demo run: export PUBLISH_URL ?= http://$(HOST):$(PORT)/fake/publish/
demo run: export MAIL_URL ?= http://$(HOST):$(PORT)/fake/mail/
# The approvals' mail links to the console where `make run` serves it (PORT=8270 included).
demo run: export CONSOLE_BASE_URL ?= http://$(HOST):$(PORT)
# Served by the demo even when DATABASE_URL points it at PostgreSQL.
demo run: export TASKS_FAKE_REMOTES ?= 1

.PHONY: help install run migrate demo test test-fast chaos lint format reset clean bench bench-quick docker-check

help:
	@echo "make run    set up (venv, install, migrate, demo data) and start web + worker + beat"
	@echo "make reset  start the demo afresh: remove the embedded database, broker and mail under var/ (keeps .venv)"
	@echo "make clean  remove var/ and the virtualenv (.venv) too"
	@echo "make test   run the whole suite but the fault drills against PostgreSQL and Redis"
	@echo "make test-fast  the same without the worker-process and browser tests (e2e, browser)"
	@echo "make chaos  the fault drills: workers, Redis and PostgreSQL killed and restarted"
	@echo "make lint   ruff and mypy"
	@echo "make docker-check  build the container image and run its processes (skips without Docker)"
	@echo "make bench  the full benchmark (about an hour); make bench-quick: every cell, small N"

$(PY):
	@python=$$(scripts/find-python.sh) && echo "Using $$python" && "$$python" -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) manage.py seed_demo

run: demo
	@echo ""
	@echo "  Console: http://$(HOST):$(PORT)/  (the users process prints the demo users and"
	@echo "  their passwords once it answers; again any time: $(PY) manage.py demo_users)"
	@echo ""
	PORT=$(PORT) WEB_PORT=$(PORT) HOST=$(HOST) $(PY) scripts/dev_processes.py -f Procfile.dev start

# The suite runs in TEST_PROCESSES processes side by side (pytest-xdist), each on a test
# database and Redis keys of its own, each taking whole files, so a module's worker process
# or browser starts once; the costliest files first (tests/parallel_runs.py).
# TEST_PROCESSES=0: one process. Three on two cores: the tests mostly wait on PostgreSQL,
# Redis, worker processes and browsers, and three finish the suite under ten minutes here.
TEST_PROCESSES ?= 3
PARALLEL := $(if $(filter-out 0,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder)

test: install
	@scripts/with-services.sh $(PY) -m pytest $(PARALLEL) -m "not chaos" $(PYTEST_ARGS)

# The quick loop: everything but the tests that start worker processes or a browser.
test-fast: install
	@scripts/with-services.sh $(PY) -m pytest $(PARALLEL) -m "not e2e and not browser and not chaos" $(PYTEST_ARGS)

# The fault drills (docs/reliability.md) kill and restart the servers they run on, so they
# get a PostgreSQL and a Redis of their own on spare ports, removed afterwards.
chaos: install
	@scripts/with-chaos-services.sh $(PY) -m pytest -m chaos tests/chaos $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# The container image (Dockerfile, docs/deployment.md), built and run when Docker is
# available; without it this says so and succeeds (tests/project/test_dockerfile.py lints the file).
docker-check:
	@scripts/docker-check.sh

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The benchmark has a virtualenv of its own: the project plus the comparators.
BENCH_VENV := bench/.venv
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp

$(BENCH_PY):
	@python=$$(scripts/find-python.sh) && "$$python" -m venv $(BENCH_VENV)

$(BENCH_STAMP): pyproject.toml bench/requirements.txt | $(BENCH_PY)
	$(BENCH_PY) -m pip install --quiet --upgrade pip
	$(BENCH_PY) -m pip install --quiet -e . -r bench/requirements.txt
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.run --mode full $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.run --mode quick $(BENCH_ARGS)

# The embedded mode's state (SQLite database, file broker, mail, beat's schedule) lives in
# TASKS_VAR_DIR, var/ unless set; a PostgreSQL or Redis named by DATABASE_URL or REDIS_URL
# is left alone. The virtualenv stays, so the next `make run` only migrates and seeds.
VAR_DIR := $(or $(TASKS_VAR_DIR),var)

reset:
	rm -rf $(VAR_DIR)
	@echo "Removed $(VAR_DIR)/ (embedded database, broker, mail); $(VENV) kept. \`make run\` starts afresh."

clean: reset
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
