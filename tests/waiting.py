"""Bounded polling for tests: the one way a test waits for something to become true."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def eventually(
    check: Callable[[], Any],
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll ``check`` (plain or async) until it returns something truthy; fail after
    ``timeout`` seconds. Returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true within {timeout} s (last: {result!r})")
        await asyncio.sleep(interval)
