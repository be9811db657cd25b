# Context Memory Service — developer entry points.
# Every target bootstraps .venv itself, so a fresh clone needs only python3 (>= 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
IDP := tests/identity_provider
IDP_STAMP := $(IDP)/node_modules/.installed
TS_CLIENT := clients/typescript
TS_STAMP := $(TS_CLIENT)/node_modules/.installed
AXE := tests/browser/axe
AXE_STAMP := $(AXE)/node_modules/.installed

.PHONY: run test test-citus test-long test-browser lint fmt openapi migrate token bench demo demo-ts eval clean

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e './client[langchain]'
	touch $(STAMP)

# The OpenID Provider the identity tests start (oidc-provider on Node): its pinned packages,
# installed again when package-lock.json changes. Without npm the rest of the tests still run;
# those that need the provider fail and say what is missing.
$(IDP_STAMP): $(IDP)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(IDP) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm not found: tests/identity needs Node.js >= 20.19 and npm"; \
	fi

# The TypeScript client's pinned development packages (TypeScript, openapi-typescript, the AI SDK
# and the Node.js 22 its tests run on), installed again when package-lock.json changes. Without
# npm its tests (tests/client/test_typescript_client.py) are skipped and say why.
$(TS_STAMP): $(TS_CLIENT)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm not found: the TypeScript client's tests need Node.js and npm"; \
	fi

# axe-core, pinned, which the browser tests inject into the pages to scan them for accessibility
# violations; installed again when package-lock.json changes. Without npm the scans fail and say
# what is missing (the browser tests themselves skip without Chromium).
$(AXE_STAMP): $(AXE)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(AXE) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm not found: the browser tests' accessibility scans need npm"; \
	fi

run: $(STAMP)
	$(BIN)/python -m app serve --host 127.0.0.1 --port 8000

# Five scripted turns through examples/ against the service `make run` serves (CMS_URL), or one
# it starts itself; prints the profile diff, the injected section and the version after each.
demo: $(STAMP)
	$(BIN)/python -m examples.demo

# The same five turns through the TypeScript client (examples/typescript/) against the service
# `make run` serves (CMS_URL); needs Node.js >= 20 and npm.
demo-ts: $(STAMP) $(TS_STAMP)
	cd $(TS_CLIENT) && npm run --silent build
	cd examples/typescript && npm install --no-audit --no-fund --loglevel=error \
		&& ../../$(TS_CLIENT)/node_modules/.bin/tsc -p . && node build/demo.js

# The scripted corpus in eval/ replayed through the service, scored, with model calls and tokens
# per turn (docs/eval.md): the offline engine by default; EVAL_ARGS="--engine stub" for the model
# path against a local recording stub, "--engine endpoint" for OPENAI_BASE_URL / OPENAI_API_KEY.
eval: $(STAMP)
	$(BIN)/python -m eval $(EVAL_ARGS)

# On every core (pytest-xdist): one worker process per core, each with a database of its own
# (tests/conftest.py), a test file's tests on one worker (`loadfile`: a module's fixtures are
# built once), the files handed out longest first (tests/conftest.py's LONGEST_FILES).
# `make test XDIST=` runs in one process; PYTEST_ARGS comes last and wins.
# Then `test-citus`.
XDIST ?= -n auto --dist loadfile --no-loadscope-reorder
test: $(STAMP) $(IDP_STAMP) $(TS_STAMP) $(AXE_STAMP)
	$(BIN)/python -m pytest -q -m "not long" $(XDIST) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-citus

# The domain suites again on a Citus cluster (TEST_CITUS=1, tests/conftest.py), their tests
# that use the database only (~600): each worker process starts a coordinator and two workers
# of its own, and the service connects as a role that turns any statement reaching more than
# one shard into an error (docs/scaling.md, "What the tests prove"). About 6 minutes on 2
# cores. Without Citus built (`.ci/install-citus`) it says why and passes; `make test
# CITUS_SUITES=` leaves it out, `make test-citus CITUS_SUITES=tests/jobs` runs one suite.
CITUS_SUITES ?= tests/turns tests/profiles tests/jobs tests/consolidation tests/enablement \
	tests/portability tests/erasure tests/usage tests/rate_limits
test-citus: $(STAMP)
	@missing=$$($(BIN)/python -c 'from tests.helpers.citus import citus_missing as m; print(m() or "")'); \
	if [ -z "$(strip $(CITUS_SUITES))" ]; then echo "test-citus: no suites (CITUS_SUITES is empty)"; \
	elif [ -n "$$missing" ]; then echo "test-citus: the suites on Citus do not run: $$missing"; \
	else TEST_CITUS=1 $(BIN)/python -m pytest -q -m "not long" $(XDIST) $(CITUS_SUITES); fi

# The pages (/ui/memory, /ui/admin, /docs, /redoc) in headless Chromium, installed from Debian's packages
# when missing (`make test` runs them too, and skips them without Chromium); screenshots of
# every step in var/artifacts/browser/.
test-browser: $(STAMP) $(IDP_STAMP) $(AXE_STAMP)
	.ci/install-chromium
	$(BIN)/python -m pytest -q -m browser $(PYTEST_ARGS)

# The soak variants of the fault tests (marker `long`), about a minute each; the failovers
# under pg_auto_failover, installed from Debian's packages when missing (skipped without it).
test-long: $(STAMP)
	.ci/install-pg-auto-failover
	$(BIN)/python -m pytest -q -m long $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app tests migrations bench client examples eval scripts
	$(BIN)/lint-imports --no-cache

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Not part of `test`: ~8 minutes, needs wrk and a PostgreSQL (DATABASE_URL, default local postgres).
bench: $(STAMP)
	$(BIN)/python bench/run_bench.py $(BENCH_ARGS)

openapi: $(STAMP)
	$(BIN)/python -m app openapi

migrate: $(STAMP)
	$(BIN)/python -m app migrate

clean:
	rm -rf $(VENV) var
