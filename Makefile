# Two commands for a newcomer: `make demo` (the main job) and `make test` (everything CI runs).
# Both bootstrap their own virtual environment from uv.lock; only python3 (3.11+) is needed.
PYTHON ?= python3
VENV := .venv
UV := $(VENV)/bin/uv
RUN := $(VENV)/bin/

.PHONY: demo test lint typecheck unit bench scenarios clean

$(VENV)/.synced: pyproject.toml uv.lock
	@test -x $(UV) || ($(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q --disable-pip-version-check "uv>=0.13,<0.14")
	@$(UV) sync --frozen --quiet --python $(VENV)/bin/python
	@touch $@

demo: $(VENV)/.synced
	$(RUN)fairlane demo

lint: $(VENV)/.synced
	$(RUN)ruff check .
	$(RUN)ruff format --check .

typecheck: $(VENV)/.synced
	$(RUN)mypy

# Two workers or more (one a core, at most four): most of a test's time is servers starting and
# clusters settling, which another test can use. A file stays on one worker (its module fixtures).
unit: $(VENV)/.synced
	$(RUN)pytest -q -n auto --maxprocesses 4 --dist loadfile

test: lint typecheck unit

scenarios: $(VENV)/.synced
	$(RUN)fairlane scenario run scenarios/*.yaml --engine core

bench: $(VENV)/.synced
	$(RUN)python -m bench.policy_cycle

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
