"""Test-only vLLM plugin (entry point group ``vllm.general_plugins``): a REAL deadlock in the
engine core, for engine-watchdog's end-to-end tests.

vLLM calls ``register()`` in every process it starts (API server, engine core, workers). When
``ENGINE_WATCHDOG_TEST_DEADLOCK_TRIGGER`` names a file, ``register()`` wraps the busy loop's
step, ``vllm.v1.engine.core.EngineCoreProc._process_engine_step``: at the start of every engine
step, if that file exists, the step calls ``_engine_watchdog_test_deadlock()``, which takes a
non-reentrant ``threading.Lock`` twice and so never returns. The engine core's busy loop then
blocks in the middle of serving, as a real lock-ordering bug would: its process sleeps (no CPU),
its metrics freeze, the API server keeps answering /health. The file is checked only when a step
starts, so removing it does not free a step already blocked (only ending the process does), and
an engine started after its removal runs normally. Without the variable the plugin does nothing.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

TRIGGER_ENV = "ENGINE_WATCHDOG_TEST_DEADLOCK_TRIGGER"
DEADLOCK_FUNCTION = "_engine_watchdog_test_deadlock"
_WRAPPED = "_engine_watchdog_wrapped"
_LOCK = threading.Lock()


def _engine_watchdog_test_deadlock() -> None:
    """Acquire a lock this thread already holds: blocks forever (the frame stacks must show)."""
    with _LOCK:
        _LOCK.acquire()  # never returns


def _wrap_step(step: Callable[..., Any], trigger: str) -> Callable[..., Any]:
    @functools.wraps(step)
    def _process_engine_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(trigger):
            _engine_watchdog_test_deadlock()
        return step(self, *args, **kwargs)

    setattr(_process_engine_step, _WRAPPED, True)
    return _process_engine_step


def register() -> None:
    """vLLM's plugin hook; idempotent (vLLM may call it more than once per process). Never
    raises: an exception here would stop vLLM from starting at all."""
    trigger = os.environ.get(TRIGGER_ENV)
    if not trigger:
        return
    try:
        core = importlib.import_module("vllm.v1.engine.core")
        proc_class = core.EngineCoreProc
        step = proc_class._process_engine_step
    except (ImportError, AttributeError) as exc:
        _say(f"not armed: {type(exc).__name__}: {exc}")
        return
    if getattr(step, _WRAPPED, False):
        return
    proc_class._process_engine_step = _wrap_step(step, trigger)
    _say(f"deadlock armed in pid {os.getpid()}: trigger {trigger}")


def _say(message: str) -> None:
    print(f"[engine-watchdog test plugin] {message}", file=sys.stderr, flush=True)
