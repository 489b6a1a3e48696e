# Two commands from a fresh clone: `make demo` and `make test`. Each creates its venv and installs
# what it needs: .venv-demo the runtime package only, .venv the package and the dev tools.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint unit install clean tools sanitize

# The guard's compiled path (guard/scan.py) is built by the install: a changed source installs
# again.
GUARD_C := $(wildcard engine_watchdog/guard/*.c engine_watchdog/guard/*.h)
$(STAMP): pyproject.toml $(GUARD_C)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $@

# The demo's own venv: what a user installs (no test tools); editable, so it runs this tree.
$(DEMO_STAMP): pyproject.toml $(GUARD_C)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q -e .
	rm -f $(DEMO_VENV)/.installed-*; touch $@

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/python -m engine_watchdog demo

# The prose checks (tests/lint: the docs' map, no internal issue numbers, self-contained, the
# licence) are lint, not behaviour: here, not in pytest's own run.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/lint

tools:
	bash deploy/ensure-tools.sh

# uv alone, in a venv of its own (seconds): the vLLM venvs' build (tests/tools/vllm_env.py, stdlib
# and uv) starts with it, beside the project's own install instead of after it.
UV_VENV := .cache/uv-venv
$(UV_VENV)/bin/uv:
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -q uv

# The real-vLLM tests' venvs and model are built beside the install, lint and the tools (minutes
# in a fresh clone, the head of the suite's critical path); pytest waits on the same lock if not
# done. So is llama.cpp's llama-server (tests/tools/llama_server_build.py: stdlib and pip,
# niced; once per machine, outside the clone; its tests run last in the e2e chain).
# compileall: where PYTHONDONTWRITEBYTECODE is set, each of the suite's hundreds of
# watchdog, simulator and stub processes would compile this tree's sources again (0.3 s each).
# `make sanitize` runs beside lint and pytest (its log: .cache/sanitize.log); either failing
# fails the target.
test:
	@mkdir -p .cache; ( $(MAKE) --no-print-directory $(UV_VENV)/bin/uv >.cache/prebuild.log 2>&1 && \
	exec setsid $(UV_VENV)/bin/python tests/tools/vllm_env.py --all >>.cache/prebuild.log 2>&1 ) & \
	prebuild=$$!; sanitize=; \
	( exec setsid $(PYTHON) tests/tools/llama_server_build.py >.cache/llama-server-build.log 2>&1 ) & \
	llama=$$!; \
	trap 'kill -TERM $$prebuild $$llama 2>/dev/null; [ -z "$$sanitize" ] || kill -TERM -- -$$sanitize 2>/dev/null; \
	wait $$prebuild $$llama $$sanitize 2>/dev/null' EXIT; \
	$(MAKE) --no-print-directory install && \
	$(PY) -m compileall -q -j 0 engine_watchdog tests benchmarks >/dev/null && \
	{ setsid $(MAKE) --no-print-directory sanitize >.cache/sanitize.log 2>&1 & sanitize=$$!; } && \
	$(MAKE) --no-print-directory lint tools && \
	$(PY) -m pytest -q -ra -n 3 --dist loadgroup; rc=$$?; \
	if [ -n "$$sanitize" ]; then wait $$sanitize; src=$$?; sanitize=; \
	grep -E '^sanitize (asan|tsan|refleak)' .cache/sanitize.log; \
	[ $$src -eq 0 ] || { tail -n 60 .cache/sanitize.log; rc=1; }; fi; exit $$rc

# The guard's C under ASan+UBSan and under TSan: the tests that reach it, a fuzz of the scan
# against its Python twin, a stress of the relay (tests/tools/sanitize.py).
sanitize: $(STAMP)
	$(PY) -m tests.tools.sanitize

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) $(DEMO_VENV) .cache .mypy_cache .ruff_cache .pytest_cache
