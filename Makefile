# safestop — the two commands are `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS ?= redis://127.0.0.1:6379/0
PYTEST_ARGS ?=

.PHONY: install run test test-fast lint migrations-check bench services chromium clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

run: install
	$(PY) manage.py serve

services:
	bash scripts/ensure-services.sh

chromium:
	bash scripts/ensure-chromium.sh

# The full suite: PostgreSQL, Redis, a real Celery worker, real websockets, real Chromium.
test: install services chromium
	$(PY) manage.py makemigrations --check --dry-run
	DATABASE_URL=$(PG_URL) SAFESTOP_TEST_REDIS_URL=$(REDIS) $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy console runs handoff safestop_agent

migrations-check: install
	$(PY) manage.py makemigrations --check --dry-run

bench: install services
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) safestop.sqlite3* staticfiles .pytest_cache
