# trialbus — the README's commands. `make demo` and `make test` work on a fresh machine:
# they install what they need (uv from PyPI; bubblewrap, slirp4netns, libseccomp2, tmux, iproute2 and chromium from Debian) first.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(PYTHON) -m uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast test-parity test-harbor-latest check api-docs up bench bench-quick bench-scale bench-scheduling chaos clean

$(VENV)/.installed: pyproject.toml uv.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"trialbus needs Python >= 3.12, {sys.executable} is {sys.version.split()[0]}"'
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	@{ command -v bwrap && command -v slirp4netns && command -v tmux && command -v ip && command -v chromium && /sbin/ldconfig -p | grep -q 'libseccomp\.so\.2 '; } >/dev/null || { \
	  echo "installing bubblewrap, slirp4netns, libseccomp2, tmux, iproute2 and chromium (Debian packages, for the local environment and its seccomp filter; terminus-2 drives tmux; the multi-host tests use ip netns; the dashboard's browser test drives chromium) ..."; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap slirp4netns libseccomp2 tmux iproute2 chromium >/dev/null; }
	$(UV) sync --frozen --quiet
	@touch $@

setup: $(VENV)/.installed  ## install dependencies into .venv

demo: setup  ## run examples/experiment.yaml end to end on the embedded stack
	$(BIN)/trialbus demo examples/experiment.yaml

# Two pytest-xdist workers (the suite waits on subprocesses and servers more than it
# computes: 9.5 min instead of 17 serial on this 2-core machine). Module-scoped servers
# stay on one worker (--dist loadgroup, tests/conftest.py); the short basetemp keeps
# the runners' unix sockets under the 108-byte limit. TEST_WORKERS=0 runs serially.
# The 25 slowest tests are listed at the end: where the suite's 15 minutes go.
TEST_WORKERS ?= 2
test: setup  ## the whole test suite (unit, integration, end to end)
	tmp=$$(mktemp -d /tmp/tb-test.XXXXXX) && \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=25 --basetemp=$$tmp; \
	  rc=$$?; rm -rf $$tmp; exit $$rc

test-fast: setup  ## unit tests only
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# Needs a Docker engine (DOCKER_HOST or /var/run/docker.sock); without one every test is
# skipped and the summary says why. docs/operations.md, "Production parity".
test-parity: setup  ## ledger contract + pipeline e2e on MongoDB and a 3-node NATS cluster (official images)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/parity

# The tests that pin what trialbus takes from Harbor: its error policy table (failure
# classes, agent stops), result.json and job folders (records, scoring, agreement with
# Harbor's own means and pass@k), the Trial API in a forked process, the local
# environment (a BaseEnvironment), live logs, and terminus-2 + litellm through the stack.
HARBOR_CONTRACT_TESTS := tests/unit/test_failures.py tests/unit/test_scoring_rule.py \
	tests/unit/test_harbor_agreement.py tests/unit/test_records.py tests/unit/test_jobdir.py \
	tests/unit/test_job_folder_agents.py tests/unit/test_trial_isolation.py \
	tests/unit/test_runner_guards.py tests/integration/test_localenv.py \
	tests/integration/test_live_logs_harbor.py tests/e2e/test_agent_stops.py
HARBOR_LATEST := .trialbus/harbor-latest

# Every `uv pip` call names the throwaway interpreter: run as `python3 -m uv`, uv would
# otherwise install into the python3 that runs it.
test-harbor-latest: setup  ## Harbor contract tests against the newest Harbor on PyPI (throwaway venv; the pin stays)
	rm -rf $(HARBOR_LATEST)
	$(UV) venv --quiet --python $(BIN)/python $(HARBOR_LATEST)
	$(UV) export --frozen --quiet --no-hashes --no-emit-project --all-groups \
	  | grep -v '^harbor==' > $(HARBOR_LATEST)/locked.txt
	$(UV) pip install --quiet --python $(HARBOR_LATEST)/bin/python -r $(HARBOR_LATEST)/locked.txt
	$(UV) pip install --quiet --python $(HARBOR_LATEST)/bin/python --upgrade-package harbor harbor
	$(UV) pip install --quiet --python $(HARBOR_LATEST)/bin/python --no-deps -e .
	@$(HARBOR_LATEST)/bin/python -c 'import importlib.metadata as m; print("harbor", m.version("harbor"), "(the project pins", [r for r in m.requires("trialbus") if r.startswith("harbor")][0] + ")")'
	$(HARBOR_LATEST)/bin/python -m pytest -q -p no:cacheprovider $(HARBOR_CONTRACT_TESTS)

check: setup  ## lint, format and type checks
	$(BIN)/ruff check schemas services infra tests benchmarks
	$(BIN)/ruff format --check schemas services infra tests benchmarks
	$(BIN)/mypy

api-docs: setup  ## regenerate docs/openapi.json and docs/asyncapi.json from the code (tests fail when stale)
	$(BIN)/trialbus api-docs

up: setup  ## start the embedded stack until Ctrl-C
	$(BIN)/trialbus up

bench: setup  ## benchmarks; writes docs/performance.md and benchmarks/results.json
	$(BIN)/python -m benchmarks

bench-quick: setup
	$(BIN)/python -m benchmarks --quick

bench-scale: setup  ## the issue's sizes: 10,000 waiting trials on 1/2/4/8 runners, 1M ledger records (long)
	TRIALBUS_BENCH_CAPACITY=10000:30:1,2,4,8 TRIALBUS_BENCH_LEDGER=100:10000 \
		$(BIN)/python -m benchmarks --only capacity,ledger --runs 1 --merge

bench-scheduling: setup  ## issue 14's scheduling simulation: 10,000 batch + 100 urgent trials, two teams' shares (a few minutes)
	$(BIN)/python -m benchmarks --only scheduling --runs 1 --merge

chaos: setup  ## the long fault-injection run
	rm -f .trialbus/chaos-result.txt
	$(BIN)/python -m pytest -q -s -p no:cacheprovider -m chaos tests/chaos
	@cat .trialbus/chaos-result.txt

clean:
	rm -rf $(VENV) .trialbus .pytest_cache .mypy_cache .ruff_cache
