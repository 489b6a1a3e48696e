"""The guard's part of a stop (SIGTERM): refuse new requests, let the streams that move finish
within a budget, then end the rest with the error event, so that no client is left hanging
and the process exits well inside the pod's grace period (Kubernetes' default is 30 s).

While this runs the probe loop and the supervisor still run (runtime/runner.py cancels them
only afterwards): a stream on a frozen engine is then answered by the stall verdict as at any
other time, not held to the end of the budget.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engine_watchdog.core.serving import ANSWER_S
from engine_watchdog.guard.answers import Ending
from engine_watchdog.guard.proxy import Guard

log = logging.getLogger(__name__)

STOPPING = "engine-watchdog: the guard is stopping; retry the request (elsewhere, or in a moment)"
ENDED = "engine-watchdog: the guard stopped before this request finished; retry it"
POLL_S = 0.05


async def drain(guard: Guard, budget_s: float) -> int:
    """Stop admitting, wait up to ``budget_s`` for the open requests to end, then end the
    rest; how many were ended."""
    guard.stop_admitting(STOPPING)
    if guard.open:
        # Said, as the wait is: a Ctrl-C that seems to do nothing for 20 s is pressed again.
        log.warning(
            "guard: draining: %d request(s) open get up to %.0f s to finish "
            "(--guard-drain-seconds), then the error event; new requests get 503; a second "
            "Ctrl-C or SIGTERM ends it at once",
            len(guard.open),
            budget_s,
        )
    await _until_empty(guard, budget_s)
    if not guard.open:
        return 0
    ended = guard.end_all(ENDED, Ending.SHUTDOWN)
    log.warning("guard: drain budget of %.0f s spent: ended %d request(s)", budget_s, ended)
    await _until_empty(guard, ANSWER_S)
    return ended


async def _until_empty(guard: Guard, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    # Polled: requests end on their own handlers' paths, none of which should pay for an event.
    while guard.open and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
