# trialbus — the README's commands. `make demo` and `make test` work on a fresh machine:
# they install what they need (uv from PyPI; bubblewrap, slirp4netns, tmux, iproute2 and chromium from Debian) first.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(PYTHON) -m uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast check up bench bench-quick chaos clean

$(VENV)/.installed: pyproject.toml uv.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"trialbus needs Python >= 3.12, {sys.executable} is {sys.version.split()[0]}"'
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	@{ command -v bwrap && command -v slirp4netns && command -v tmux && command -v ip && command -v chromium; } >/dev/null || { \
	  echo "installing bubblewrap, slirp4netns, tmux, iproute2 and chromium (Debian packages, for the local environment; terminus-2 drives tmux; the multi-host tests use ip netns; the dashboard's browser test drives chromium) ..."; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap slirp4netns tmux iproute2 chromium >/dev/null; }
	$(UV) sync --frozen --quiet
	@touch $@

setup: $(VENV)/.installed  ## install dependencies into .venv

demo: setup  ## run examples/experiment.yaml end to end on the embedded stack
	$(BIN)/trialbus demo examples/experiment.yaml

test: setup  ## the whole test suite (unit, integration, end to end)
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-fast: setup  ## unit tests only
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

check: setup  ## lint, format and type checks
	$(BIN)/ruff check schemas services infra tests benchmarks
	$(BIN)/ruff format --check schemas services infra tests benchmarks
	$(BIN)/mypy

up: setup  ## start the embedded stack until Ctrl-C
	$(BIN)/trialbus up

bench: setup  ## benchmarks; writes docs/performance.md and benchmarks/results.json
	$(BIN)/python -m benchmarks

bench-quick: setup
	$(BIN)/python -m benchmarks --quick

chaos: setup  ## the long fault-injection run
	rm -f .trialbus/chaos-result.txt
	$(BIN)/python -m pytest -q -s -p no:cacheprovider -m chaos tests/chaos
	@cat .trialbus/chaos-result.txt

clean:
	rm -rf $(VENV) .trialbus .pytest_cache .mypy_cache .ruff_cache
