# safestop — the two commands are `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS ?= redis://127.0.0.1:6379/0
PYTEST_ARGS ?=
# Two pytest workers (pytest-xdist), one per core: most of the suite waits on live servers, a
# Celery worker, Chromium and PostgreSQL, so two sessions in parallel nearly halve the wall time
# (1,142 s → 561 s here). Whole files go to one worker (`loadfile`) in collection order
# (`--no-loadscope-reorder`), so the browser tests, sorted last, still run after every async test
# of their worker (tests/browser/conftest.py). `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The .mo files are built here from the committed .po files (never committed themselves).
.PHONY: messages messages-update install run test test-fast lint migrations-check bench soak services chromium nginx clean ts-client node axe mcp-servers mcp-clients adapter-matrix vendor

install: $(VENV)/.installed
	bash scripts/messages.sh compile >/dev/null

# Compile the message catalogs (locale/); `messages-update` re-extracts the strings from the code
# (then translate the new entries: tests/i18n fails on any left empty or fuzzy).
messages: $(VENV)/.installed
	bash scripts/messages.sh compile

messages-update: $(VENV)/.installed
	bash scripts/messages.sh update

$(VENV)/.installed: pyproject.toml agent/pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ./agent -e '.[dev]'
	touch $@

run: install
	$(PY) manage.py serve

services:
	bash scripts/ensure-services.sh

chromium:
	bash scripts/ensure-chromium.sh

# Debian's nginx, for the scale-out bench (N daphne behind it) and tests/deploy's `nginx -t`;
# always run as our own foreground process with a generated config, never as the system service.
nginx:
	bash scripts/ensure-nginx.sh

node:
	bash scripts/ensure-node.sh

# axe-core for the browser tests' accessibility check (tests/browser/test_accessibility.py),
# from the committed lockfile; served to the page from node_modules, never from a CDN.
axe: node
	cd tests/browser && npm ci --no-audit --no-fund --loglevel=error

# MCP servers nobody here wrote (`@modelcontextprotocol/server-everything`), the MCP gateway's
# upstreams in tests/mcp, `make bench` and the demo: from the committed lockfile, never fetched
# at run time.
mcp-servers: node
	cd tests/mcp && npm ci --no-audit --no-fund --loglevel=error

# `langchain-mcp-adapters` (a LangGraph agent's MCP client) in a small venv of its own: every
# release so far requires mcp<2 and the repository runs the 2.x SDK. The wire protocol is the
# same: tests/mcp/test_gateway_langchain.py runs tests/mcp/langchain_client.py with this
# interpreter against the live gateway over HTTP. Move the pins when a release takes mcp 2.
MCP_LANGCHAIN := .venv-mcp-langchain
MCP_LANGCHAIN_PINS := langchain-mcp-adapters==0.3.2 mcp==1.30.0 langgraph==1.2.24 \
	langgraph-prebuilt==1.1.3
mcp-clients: $(MCP_LANGCHAIN)/.installed

$(MCP_LANGCHAIN)/.installed: Makefile
	rm -rf $(MCP_LANGCHAIN)
	$(PYTHON) -m venv $(MCP_LANGCHAIN)
	$(MCP_LANGCHAIN)/bin/pip install -q --upgrade pip
	$(MCP_LANGCHAIN)/bin/pip install -q $(MCP_LANGCHAIN_PINS)
	touch $@

# Browser libraries the console serves itself (no CDN), from the committed lockfile in
# static/console/vendor/. The copies are committed too, so `make run` needs no npm;
# tests/console/test_vendor.py checks the copy against the version and digest it records.
VENDOR_DIR := static/console/vendor
vendor: node
	cd $(VENDOR_DIR) && npm ci --no-audit --no-fund --loglevel=error
	cp $(VENDOR_DIR)/node_modules/idiomorph/dist/idiomorph-ext.min.js $(VENDOR_DIR)/idiomorph-ext.min.js

# The TypeScript client (clients/typescript, `@safestop/agent`): dependencies from its lockfile,
# a strict `tsc` build, then Node's test runner against a live server the tests start (about
# 20 s). The runner's summary lines (`# tests`, `# pass`, `# fail`, ...) end the output.
TS_DIR := clients/typescript
ts-client: install node
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	cd $(TS_DIR) && rm -rf dist && npx tsc -p .
	cd $(TS_DIR) && node --test --test-concurrency=1 dist/test/*.test.js

# The framework adapters against the oldest and the newest release of each framework that
# agent/pyproject.toml declares (its `langgraph` and `openai-agents` extras): one small venv per
# end, holding safestop-agent, those pins and pytest only (no Django, no database), running the
# adapter tests alone (tests/agent/matrix.ini; about a minute once the venvs exist). Move a pin
# here and the range in agent/pyproject.toml together. openai==2.9.0 is the oldest SDK's own
# floor: openai-agents 0.8.0 builds usage records that later openai releases reject (a field they
# made required), so that end runs with an openai of its time.
ADAPTER_OLDEST := langgraph==1.0.0 langgraph-prebuilt==1.0.2 openai-agents==0.8.0 openai==2.9.0
ADAPTER_NEWEST := langgraph==1.2.24 langgraph-prebuilt==1.1.3 openai-agents==0.24.0
ADAPTER_TESTS := tests/agent/test_langgraph.py tests/agent/test_langgraph_toolnode.py \
	tests/agent/test_langgraph_async.py tests/agent/test_langgraph_usage.py \
	tests/agent/test_openai_agents.py tests/agent/test_openai_agents_graph.py \
	tests/agent/test_openai_agents_usage.py tests/agent/test_openai_agents_suspend.py
MATRIX := .venv-matrix

$(MATRIX)/%/.installed: agent/pyproject.toml Makefile
	rm -rf $(MATRIX)/$*
	$(PYTHON) -m venv $(MATRIX)/$*
	$(MATRIX)/$*/bin/pip install -q --upgrade pip
	$(MATRIX)/$*/bin/pip install -q ./agent pytest pytest-timeout \
		$(if $(filter oldest,$*),$(ADAPTER_OLDEST),$(ADAPTER_NEWEST))
	rm -rf agent/build
	touch $@

adapter-matrix: $(MATRIX)/oldest/.installed $(MATRIX)/newest/.installed
	@for end in oldest newest; do \
		echo "adapters on the $$end supported frameworks:"; \
		$(MATRIX)/$$end/bin/pip list 2>/dev/null | grep -E '^(langgraph|langgraph-prebuilt|openai-agents) '; \
		$(MATRIX)/$$end/bin/python -m pytest -c tests/agent/matrix.ini --rootdir=. -q \
			$(ADAPTER_TESTS) || exit 1; \
	done

# Every pytest session has its own test database (test_safestop_<pid>, console/settings.py) and
# its own Redis database (claimed among 1-15 by tests/support/isolation.py), so two suites on one
# machine never collide; SAFESTOP_TEST_DB_NAME and SAFESTOP_TEST_REDIS_URL choose them instead.
PYTEST := DATABASE_URL=$(PG_URL) $(PY) -m pytest

# The full suite: PostgreSQL, Redis, a real Celery worker, real websockets, real Chromium.
# `--durations`: the slowest tests are printed at the end of every run, so the next cut of the
# suite's time starts from figures.
test: install services chromium nginx axe mcp-servers mcp-clients vendor
	$(PY) manage.py makemigrations --check --dry-run
	$(PYTEST) $(XDIST) --durations=25 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory ts-client
	$(MAKE) --no-print-directory adapter-matrix

# What a developer runs while working (under two minutes): no browser, no live servers, no other
# processes, no races (tests/conftest.py says what counts as slow).
test-fast: install services mcp-servers
	$(PYTEST) $(XDIST) -m "not browser and not slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy console accounts gateway policies api runs handoff notifications safestop_agent
	$(VENV)/bin/lint-imports

migrations-check: install
	$(PY) manage.py makemigrations --check --dry-run

bench: install services nginx mcp-servers
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(PY) bench/run_all.py

# The stop/dispatch leakage race for a long time (CI runs its short version in
# tests/dispatch/test_leakage_race.py): 10,000 stops against 8 dispatcher processes on a database
# of its own, bounded by SOAK_SECONDS; prints leaks, duplicates and throughput and fails on any
# leak or duplicate. SOAK_CELERY=1 adds a real Celery worker and samples its RSS (bench/soak.py).
soak: install services
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(PY) bench/soak.py

clean:
	rm -rf $(VENV) $(MATRIX) safestop.sqlite3* var/ledger-anchors staticfiles .pytest_cache
