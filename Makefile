# Harness: every command a developer or CI needs. See README.md.
SHELL := /bin/bash
PYTHON ?= python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The machine's PostgreSQL and Redis, used by `make test` (override to point elsewhere).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# Tests keep compiled modules (a shell may set PYTHONDONTWRITEBYTECODE): without them each
# pytest process rewrites every test module's assertions again (a collection took 18 s
# instead of 8) and each daphne, worker and manage.py a test starts compiles Harness again.
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE HARNESS_SECRET_KEY=test-secret-key-not-for-production

.PHONY: venv demo screenshots test test-fast test-pg test-embedded test-all lint typecheck bench bench-quick browser sandbox claude-code codex gemini-cli coding-agents mcp-servers clean battery xmlsec nanoidp langchain-client

$(STAMP): pyproject.toml | xmlsec
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Debian's xmlsec for SAML sign-in (python3-saml's xmlsec binding signs and checks
# assertions with it; pip builds the binding against it where no wheel fits).
xmlsec:
	@{ pkg-config --exists xmlsec1-openssl && ldconfig -p | grep -q libxmlsec1-openssl.so; } 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libxmlsec1-dev libxmlsec1-openssl libxml2-dev pkg-config >/dev/null; \
	  else echo "SAML sign-in needs Debian's xmlsec: sudo apt-get install libxmlsec1-dev libxmlsec1-openssl libxml2-dev pkg-config"; fi; }

# nanoidp, a real SAML 2.0 (and OIDC) identity provider for tests/identity, in a
# virtualenv of its own under var/ (a program the tests start, never imported: its
# pins stay its own).
NANOIDP_VERSION := 3.4.0
NANOIDP_DIR := var/nanoidp
NANOIDP_STAMP := $(NANOIDP_DIR)/.installed-$(NANOIDP_VERSION)

$(NANOIDP_STAMP):
	$(PYTHON) -m venv $(NANOIDP_DIR)
	$(NANOIDP_DIR)/bin/python -m pip install -q 'nanoidp==$(NANOIDP_VERSION)' && touch $@

nanoidp: $(NANOIDP_STAMP)

# LangChain's MCP adapters for tests/mcp/test_runs_live.py (a new MCP session per tool
# call, their default), in a virtualenv of their own under var/: they need the MCP SDK's
# v1 line, Harness runs on v2. The test runs tests/support/langchain_client.py with it.
LANGCHAIN_MCP_ADAPTERS_VERSION := 0.3.2
LANGCHAIN_CLIENT_DIR := var/langchain-client
LANGCHAIN_CLIENT_STAMP := $(LANGCHAIN_CLIENT_DIR)/.installed-$(LANGCHAIN_MCP_ADAPTERS_VERSION)

$(LANGCHAIN_CLIENT_STAMP):
	$(PYTHON) -m venv $(LANGCHAIN_CLIENT_DIR)
	$(LANGCHAIN_CLIENT_DIR)/bin/python -m pip install -q \
	  'langchain-mcp-adapters==$(LANGCHAIN_MCP_ADAPTERS_VERSION)' && touch $@

langchain-client: $(LANGCHAIN_CLIENT_STAMP)

# Debian's chromium for the browser tests (never a browser download).
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "Browser tests need Debian's chromium: sudo apt-get install chromium"; fi; }

# Debian's bubblewrap: every program a tool starts runs in it (HARNESS_SANDBOX=bwrap),
# with util-linux's prlimit and setpriv, and libseccomp for its seccomp filter; as root,
# programs run as the system user harness-sandbox (HARNESS_SANDBOX_USER), made here.
sandbox:
	@{ command -v bwrap && command -v setpriv && ldconfig -p | grep -q libseccomp.so.2; } >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap util-linux libseccomp2 >/dev/null; \
	  else echo "The sandbox needs Debian's bubblewrap, util-linux and libseccomp2: sudo apt-get install bubblewrap util-linux libseccomp2"; fi; }
	@if [ "$$(id -u)" = 0 ] && ! id -u harness-sandbox >/dev/null 2>&1; then \
	  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin harness-sandbox; fi
	@# acl: tests/redteam grants write by an ACL to show a read-only entry's way is refused.
	@command -v setfacl >/dev/null || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null; } || true
	@# ripgrep: tests/policy runs the real rg to show what `rg --pre` runs.
	@command -v rg >/dev/null || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ripgrep >/dev/null; } || true
	@# exfatprogs, exfat-fuse: tests/redteam shows the git guard on a case-insensitive file system.
	@command -v mount.exfat-fuse >/dev/null && command -v mkfs.exfat >/dev/null || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq exfatprogs exfat-fuse >/dev/null; } || true

# The pinned Claude Code CLI for tests/coding_agents (npm registry), cached under var/.
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CODE_DIR := var/claude-code
CLAUDE_CODE_STAMP := $(CLAUDE_CODE_DIR)/.installed-$(CLAUDE_CODE_VERSION)

$(CLAUDE_CODE_STAMP):
	@if command -v npm >/dev/null; then \
	  npm install --prefix $(CLAUDE_CODE_DIR) --no-audit --no-fund --loglevel=error \
	    @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) && \
	  $(CLAUDE_CODE_DIR)/node_modules/.bin/claude --version && touch $@; \
	else echo "The Claude Code tests need node and npm (apt-get install nodejs npm)."; fi

claude-code: $(CLAUDE_CODE_STAMP)

# The pinned Codex CLI and Gemini CLI for tests/coding_agents (npm registry), under var/.
CODEX_VERSION := 0.171.0
CODEX_DIR := var/codex
CODEX_STAMP := $(CODEX_DIR)/.installed-$(CODEX_VERSION)
GEMINI_CLI_VERSION := 0.61.0
GEMINI_CLI_DIR := var/gemini-cli
GEMINI_CLI_STAMP := $(GEMINI_CLI_DIR)/.installed-$(GEMINI_CLI_VERSION)

$(CODEX_STAMP):
	@if command -v npm >/dev/null; then \
	  npm install --prefix $(CODEX_DIR) --no-audit --no-fund --loglevel=error \
	    @openai/codex@$(CODEX_VERSION) && \
	  $(CODEX_DIR)/node_modules/.bin/codex --version && touch $@; \
	else echo "The Codex tests need node and npm (apt-get install nodejs npm)."; fi

$(GEMINI_CLI_STAMP):
	@if command -v npm >/dev/null; then \
	  npm install --prefix $(GEMINI_CLI_DIR) --no-audit --no-fund --loglevel=error \
	    @google/gemini-cli@$(GEMINI_CLI_VERSION) && \
	  $(GEMINI_CLI_DIR)/node_modules/.bin/gemini --version && touch $@; \
	else echo "The Gemini CLI tests need node and npm (apt-get install nodejs npm)."; fi

codex: $(CODEX_STAMP)
gemini-cli: $(GEMINI_CLI_STAMP)
coding-agents: claude-code codex gemini-cli

# A real MCP server nobody here wrote, for the MCP tests: from the npm registry into var/npm
# (gitignored). Without npm the tests that need it skip (and fail under CI=true).
MCP_FILESYSTEM_VERSION := 2026.8.31
MCP_FILESYSTEM := var/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js

# mcp-remote (a stdio bridge to a remote MCP server, with its own OAuth sign-in) for
# tests/agentauth: pinned, from the npm registry, under var/.
MCP_REMOTE_VERSION := 0.15.1
MCP_REMOTE_DIR := var/mcp-remote
MCP_REMOTE_STAMP := $(MCP_REMOTE_DIR)/.installed-$(MCP_REMOTE_VERSION)

$(MCP_REMOTE_STAMP):
	@if command -v npm >/dev/null; then \
	  npm install --prefix $(MCP_REMOTE_DIR) --no-audit --no-fund --loglevel=error \
	    mcp-remote@$(MCP_REMOTE_VERSION) && touch $@; \
	else echo "The mcp-remote test needs node and npm (apt-get install nodejs npm)."; fi

# The MCP Inspector's CLI (a new MCP session per call): tests/mcp/test_runs_live.py.
MCP_INSPECTOR_VERSION := 2.12.0
MCP_INSPECTOR := var/mcp-inspector/.installed-$(MCP_INSPECTOR_VERSION)

mcp-servers: $(MCP_FILESYSTEM) $(MCP_INSPECTOR) $(MCP_REMOTE_STAMP)

$(MCP_INSPECTOR):
	@command -v npm >/dev/null || { echo "The MCP Inspector test needs npm (apt-get install npm)."; exit 0; }
	npm install --prefix var/mcp-inspector --no-audit --no-fund --loglevel=error @modelcontextprotocol/inspector@$(MCP_INSPECTOR_VERSION) && touch $@

$(MCP_FILESYSTEM):
	@command -v npm >/dev/null || { echo "The MCP tests need npm (apt-get install npm) for @modelcontextprotocol/server-filesystem."; exit 0; }
	npm install --prefix var/npm --no-audit --no-fund --loglevel=error @modelcontextprotocol/server-filesystem@$(MCP_FILESYSTEM_VERSION)

demo: $(STAMP) sandbox
	$(BIN)/python manage.py run_demo

# docs/dashboard.md's timeline pictures, from a real demo run in Debian's chromium.
screenshots: $(STAMP) sandbox browser
	$(BIN)/python -m tests.dashboard.screenshots docs/img

# The whole suite on PostgreSQL + Redis, then on the embedded default (SQLite + own Redis).
test: $(STAMP) browser sandbox coding-agents mcp-servers nanoidp langchain-client
	$(MAKE) test-pg
	$(MAKE) test-embedded

# Tests marked backend_independent touch neither the database nor Redis (tests/conftest.py
# checks it): they prove the same on both backends, so only test-embedded runs them.
# Two pytest-xdist workers, each with its own test database, Celery queues, data directory
# and Redis database (tests/settings.py; the data directory only under a HARNESS_DATA_DIR
# given, so each target gives one: one worker's end removed the other's preview in flight). Tests go out in pytest-django's order (database
# tests, then transactional ones, then the live tests, whose committed rows stay), so not
# by file (`--dist loadfile` ran a file's live tests before other files' counting tests).
# The battery's rows measure the machine, so they run after, alone.
XDIST := -n 2

test-pg: $(STAMP)
	$(TEST_ENV) DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) HARNESS_DATA_DIR=$(CURDIR)/var/test-pg \
	  $(BIN)/pytest $(XDIST) -m "not slow and not backend_independent and not battery" --create-db -p no:cacheprovider --durations=25 $(PYTEST_ARGS)
	$(TEST_ENV) DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	  $(BIN)/pytest tests/battery -m "battery and not slow and not backend_independent" --create-db -p no:cacheprovider --durations=10 $(PYTEST_ARGS)

# Browser tests and tests marked client_program (a coding-agent CLI, an OAuth client
# driving a live stack) are about the outside program, not the storage: every page, hook
# and token endpoint they reach is tested on both backends without them, so they run on
# PostgreSQL only (issue 32: about three of the embedded run's minutes).
# The session stops the embedded Redis it started; the last line makes sure of it even
# when pytest itself was killed.
# The battery's reduced rows run on PostgreSQL (most are about its locks and connections);
# on the embedded default they run in `make battery`.
test-embedded: $(STAMP)
	env -u DATABASE_URL -u REDIS_URL $(TEST_ENV) HARNESS_DATA_DIR=$(CURDIR)/var/test-embedded \
	  $(BIN)/pytest $(XDIST) -m "not slow and not battery and not browser and not client_program" --create-db -p no:cacheprovider --durations=25 $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/python -c "import pathlib, harness_site.embedded_redis as r; [r.stop(d) for d in (pathlib.Path('$(CURDIR)/var/test-embedded'), *pathlib.Path('$(CURDIR)/var/test-embedded').glob('gw*'))]"; \
	  exit $$status

# The loop to run while editing (README, "Development"): every test not live, browser, slow,
# battery or heavy, on the embedded default with the sandbox off, so it needs no npm
# package, Chromium or bubblewrap (their tests skip). Compiled test modules are kept:
# without them pytest's assertion rewriting is most of the collection. The battery's
# plugins are not loaded. Two pytest-xdist workers, one per core, each with its own data
# directory (tests/settings.py): its own embedded Redis and SQLite files.
# `make test` runs everything this leaves out.
test-fast: $(STAMP)
	env -u DATABASE_URL -u REDIS_URL $(TEST_ENV) HARNESS_SANDBOX=off \
	  HARNESS_DATA_DIR=$(CURDIR)/var/test-fast \
	  $(BIN)/pytest -n 2 -m "not live and not browser and not slow and not battery and not heavy" \
	  --ignore=tests/battery -p no:schemathesis -p no:hypothesispytest \
	  -p no:cacheprovider -q --durations=5 $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/python -c "import pathlib, harness_site.embedded_redis as r; [r.stop(d) for d in (pathlib.Path('$(CURDIR)/var/test-fast'), *pathlib.Path('$(CURDIR)/var/test-fast').glob('gw*'))]"; \
	  exit $$status

test-all: $(STAMP) browser sandbox coding-agents mcp-servers nanoidp langchain-client
	$(TEST_ENV) DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest --create-db

# Benchmarks (never run by CI): ratios against baselines measured in the same run.
bench: $(STAMP)
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; } || { echo "bench needs wrk: apt-get install wrk"; exit 2; }
	$(BIN)/python -m bench.run

bench-quick: $(STAMP)
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; } || { echo "bench needs wrk: apt-get install wrk"; exit 2; }
	$(BIN)/python -m bench.run --quick

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy .

clean:
	rm -rf var .pytest_cache

# The reliability and security battery at the sizes of docs/reliability.md (PostgreSQL +
# Redis; the processes it starts are its own), then the table of its figures.
battery: $(STAMP) browser
	$(TEST_ENV) DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) HARNESS_BATTERY_SCALE=full \
	  $(BIN)/pytest tests/battery -m battery --create-db -p no:cacheprovider -p no:logging -q -s --durations=30 $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/python -m tests.battery.report || status=1; exit $$status
