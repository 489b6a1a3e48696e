"""Awaiting with a bound: every close, cleanup and task end at shutdown is one of these, so no
race (a peer that never closes, a task that swallows its cancellation) can hold the process.

Built on :func:`asyncio.wait`, which never cancels what it waits on and never swallows a
cancellation of the waiter: ``asyncio.wait_for`` on Python 3.11 can lose a cancellation that
arrives as the inner awaitable finishes (CPython gh-86296), and a lost cancellation at shutdown
is a task that never ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 1.0
"""After a cancellation: how long a task may take to unwind before it is left behind."""


async def bounded(aw: Awaitable[Any], seconds: float, what: str) -> bool:
    """Await ``aw`` at most ``seconds``; past that cancel it, wait :data:`CANCEL_GRACE_S` more
    and go on. An error it raises is logged, not raised (a cleanup step that fails must not
    skip the next). True when it ended in time."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        log.warning("%s took longer than %.1f s: cancelled, going on without it", what, seconds)
        await end_tasks([task], CANCEL_GRACE_S)
        return False
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s failed: %r", what, task.exception())
    return True


async def end_tasks(tasks: Iterable[asyncio.Future[Any]], seconds: float) -> set[str]:
    """Cancel ``tasks`` and wait at most ``seconds`` for them to end; the names of those that
    did not (they are left behind, and named in the log)."""
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    if pending:
        _, pending = await asyncio.wait(pending, timeout=seconds)
    names = {t.get_name() if isinstance(t, asyncio.Task) else repr(t) for t in pending}
    if names:
        log.warning("tasks still running %.1f s after cancellation: %s", seconds, sorted(names))
    for task in tasks:  # retrieve outcomes: no "exception was never retrieved" at exit
        if task.done() and not task.cancelled():
            task.exception()
    return names
