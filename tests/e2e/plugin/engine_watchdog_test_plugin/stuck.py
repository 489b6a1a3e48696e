"""Test-only vLLM plugin (entry point ``engine_watchdog_test_stuck``): ONE request stops getting
tokens while the rest of the batch goes on, for engine-watchdog's guard tests.

When ``ENGINE_WATCHDOG_TEST_STUCK_MARKER`` is set, ``register()`` wraps the v1 scheduler's
``Scheduler.schedule``: a running request whose id contains the marker (vLLM builds the id from
the client's X-Request-Id: ``cmpl-<id>-...``) and that already has
``ENGINE_WATCHDOG_TEST_STUCK_AFTER`` output tokens (default 2) is hidden from the running
list while the real ``schedule`` runs, and put back after: it stays running (its KV blocks,
``vllm:num_requests_running``), it is never scheduled again, and an abort finds and frees it
as usual. Without the variable the plugin does nothing.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

MARKER_ENV = "ENGINE_WATCHDOG_TEST_STUCK_MARKER"
AFTER_ENV = "ENGINE_WATCHDOG_TEST_STUCK_AFTER"
_WRAPPED = "_engine_watchdog_stuck_wrapped"


def _wrap(schedule: Callable[..., Any], marker: str, after: int) -> Callable[..., Any]:
    @functools.wraps(schedule)
    def _schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = [r for r in self.running if marker in r.request_id and r.num_output_tokens >= after]
        if not held:
            return schedule(self, *args, **kwargs)
        self.running = [r for r in self.running if r not in held]
        try:
            return schedule(self, *args, **kwargs)
        finally:
            self.running.extend(r for r in held if r not in self.running)

    setattr(_schedule, _WRAPPED, True)
    return _schedule


def register() -> None:
    """vLLM's plugin hook; idempotent; never raises (vLLM would not start)."""
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        return
    try:
        after = int(os.environ.get(AFTER_ENV, "2"))
        module = importlib.import_module("vllm.v1.core.sched.scheduler")
        cls = module.Scheduler
        schedule = cls.schedule
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"[engine-watchdog stuck plugin] not armed: {exc}", file=sys.stderr, flush=True)
        return
    if getattr(schedule, _WRAPPED, False):
        return
    cls.schedule = _wrap(schedule, marker, after)
    print(
        f"[engine-watchdog stuck plugin] armed in pid {os.getpid()}: {marker!r} after {after}",
        file=sys.stderr,
        flush=True,
    )
