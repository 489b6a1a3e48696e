# Two commands from a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint unit install clean tools

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m engine_watchdog demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

tools:
	bash deploy/ensure-tools.sh

# The real-vLLM tests' venvs and model are built beside lint and the tools (minutes in a fresh
# clone, the head of the suite's critical path); pytest waits on the same lock if not done.
test: $(STAMP)
	@mkdir -p .cache; setsid $(PY) tests/tools/vllm_env.py --all >.cache/prebuild.log 2>&1 & \
	prebuild=$$!; trap 'kill -TERM $$prebuild 2>/dev/null; wait $$prebuild 2>/dev/null' EXIT; \
	$(MAKE) --no-print-directory lint tools && \
	$(PY) -m pytest -q -ra -n 2 --dist loadgroup

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
