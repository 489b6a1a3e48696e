"""Injectable faults: what each one does to the engine core's loop, or to the API event loop.

Engine faults fire inside the engine step (an idle engine does not step, so a hang fault armed
while idle waits for work). The hangs are real: the busy loop's thread blocks on an event, on a
lock it already holds, or spins in Python, so py-spy and /proc show what a maintainer would see.
A fault is changed from the engine core's input thread, which keeps running during a hang
(as vLLM's does), so ``{"fault": "none"}`` can undo freeze-last, deadlock and spin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine_watchdog.sim.settings import FAULT_NAMES, SimSettings

log = logging.getLogger(__name__)

MAX_HANG_S = 24 * 3600.0
"""Upper bound of any injected hang, so even a forgotten simulator ends its wait some day.
A hang also ends when the API process dies (the engine core exits with it)."""

FREEZE_AFTER_ANSWER_S = 0.2
"""Delay between answering ``POST /sim/fault`` and blocking the loop, so the answer gets out."""

API_FAULTS = frozenset({"api-freeze"})
STUCK_MARKER = "stuck"
"""stuck-request holds the requests whose id contains this (the client's X-Request-Id)."""
"""Faults of the API process; every other fault belongs to the engine cores."""


class FaultError(ValueError):
    """A fault request that makes no sense; the message says why."""


@dataclass(frozen=True)
class FaultSpec:
    """One fault and its parameters (defaults come from the start-up settings)."""

    name: str = "none"
    freeze_last_n: int = 1
    long_prefill_seconds: float = 60.0
    slow_tokens_per_second: float = 0.2
    api_freeze_seconds: float = 3600.0
    stuck_after_tokens: int = 2

    @classmethod
    def from_settings(cls, s: SimSettings) -> FaultSpec:
        return cls(
            s.fault,
            s.freeze_last_n,
            s.long_prefill_seconds,
            s.slow_tokens_per_second,
            s.api_freeze_seconds,
            s.stuck_after_tokens,
        )

    def with_request(self, body: Mapping[str, Any]) -> FaultSpec:
        """This spec updated from a ``POST /sim/fault`` body (``-`` or ``_`` in keys)."""
        values = {str(k).replace("-", "_"): v for k, v in body.items()}
        name = values.pop("fault", None)
        if name not in FAULT_NAMES:
            raise FaultError(f"'fault' must be one of {', '.join(FAULT_NAMES)}, got {name!r}")
        params: dict[str, Any] = {"name": name}
        for f in fields(self):
            if f.name != "name" and f.name in values:
                params[f.name] = _number(f.name, values[f.name], int if f.type == "int" else float)
        return replace(self, **params)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def _number(name: str, value: Any, kind: type[int] | type[float]) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{name!r} must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise FaultError(f"{name!r} must be an integer, got {value!r}")
    if value <= 0:
        raise FaultError(f"{name!r} must be > 0, got {value!r}")
    return kind(value)


class EngineFaults:
    """The fault state of one engine core, shared by its busy loop and its input thread."""

    def __init__(
        self,
        spec: FaultSpec,
        notify: Callable[[dict[str, Any]], None],
        gpu_spin: Callable[[Callable[[], bool]], None] | None = None,
    ) -> None:
        self._notify = notify  # tells the API process when a fault fires or ends
        self._gpu_spin = gpu_spin  # sim --gpu: spins a GPU kernel until told to stop
        self._lock = threading.Lock()  # guards every field below
        self._spec = spec
        self._state = "idle" if spec.name == "none" else "armed"
        self._fresh = True  # armed since the last step: freeze-last looks at the load once
        self._seen_above = False
        self._release = threading.Event()
        self._step_lock = threading.Lock()  # the deadlock's victim
        self._deadlocked = False

    def apply(self, spec: FaultSpec) -> dict[str, Any]:
        """Replace the fault (input thread). Ends any hang the old one holds."""
        with self._lock:
            self._spec = spec
            self._state = "idle" if spec.name == "none" else "armed"
            self._fresh, self._seen_above = True, False
            self._release.set()
            if self._deadlocked and self._step_lock.locked():
                # Releasing the lock for its owner is what un-deadlocks the step below.
                self._deadlocked = False
                self._step_lock.release()
        return self.describe()

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"fault": self._spec.name, "state": self._state, "params": self._spec.to_wire()}

    def held(self) -> tuple[str, int] | None:
        """stuck-request: (the id marker, the tokens a marked request gets), else None."""
        with self._lock:
            if self._spec.name != "stuck-request":
                return None
            return STUCK_MARKER, self._spec.stuck_after_tokens

    def is_slow(self) -> bool:
        with self._lock:
            return self._spec.name == "slow"

    def steps_per_second(self, normal: float) -> float:
        with self._lock:
            slow = self._spec.name == "slow"
            return self._spec.slow_tokens_per_second if slow else normal

    def long_prefill_seconds(self) -> float | None:
        """Seconds the stretched prefill takes while long-prefill is armed or running."""
        with self._lock:
            if self._spec.name == "long-prefill" and self._state != "idle":
                return self._spec.long_prefill_seconds
            return None

    def long_prefill_started(self) -> None:
        with self._lock:
            if self._spec.name == "long-prefill":
                self._state = "fired"
        self._notify(self.describe())

    def long_prefill_done(self) -> None:
        # One-shot: "the next prompt" was stretched; later prompts prefill normally.
        with self._lock:
            if self._spec.name == "long-prefill":
                self._spec, self._state = replace(self._spec, name="none"), "idle"
        self._notify(self.describe())

    def before_step(self, running: int, waiting: int, unfinished_after: int) -> str | None:
        """Run a hang or crash fault that is due (busy loop, before the step).

        Returns the name of the fault that held the loop, once it lets go."""
        with self._lock:
            action = self._due(running, running + waiting, unfinished_after)
            if action is None:
                return None
            self._state = "fired"
            self._release.clear()
            if action == "deadlock":
                self._deadlocked = True
                self._step_lock.acquire()  # the step's own hold, taken atomically with the flag
        log.warning("fault %s fires: running=%d waiting=%d", action, running, waiting)
        self._notify(self.describe())
        return self._run(action)

    def _due(self, running: int, in_flight: int, unfinished_after: int) -> str | None:
        name, fresh = self._spec.name, self._fresh
        self._fresh = False
        if self._state != "armed" or name not in ("freeze-last", "deadlock", "spin", "crash"):
            return None
        if name != "freeze-last":
            return name
        n = self._spec.freeze_last_n
        self._seen_above |= in_flight > n
        if running < 1:
            return None
        if fresh and in_flight <= n:
            return name
        if not self._seen_above:
            return None
        # The last ones in flight; or the whole batch is about to finish in this very step.
        return name if in_flight <= n or unfinished_after == 0 else None

    def _run(self, action: str) -> str:
        if action == "crash":
            _crash()
        elif action == "deadlock":
            self._step_with_lock()
        elif action == "spin":
            self._spin_without_progress()
        else:
            self._frozen_forever()
        return action

    def _frozen_forever(self) -> None:
        """freeze-last: the loop stops stepping; only a fault change wakes it."""
        self._release.wait(MAX_HANG_S)

    def _step_with_lock(self) -> None:
        """deadlock: the step takes a non-reentrant lock it already holds (taken in before_step).

        The thread really blocks here; a fault change releases the first hold for us."""
        if self._step_lock.acquire(timeout=MAX_HANG_S):
            self._step_lock.release()
        else:
            with self._lock:
                self._deadlocked = False
                self._step_lock.release()

    def _spin_without_progress(self) -> None:
        """spin: burn CPU in Python (with --gpu: a GPU kernel) without producing anything."""
        deadline = time.monotonic() + MAX_HANG_S
        if self._gpu_spin is not None:
            self._gpu_spin(lambda: self._release.is_set() or time.monotonic() >= deadline)
            return
        spins = 0
        while not self._release.is_set() and time.monotonic() < deadline:
            spins += 1


def _crash() -> None:
    # vLLM's engine core logs the exception and dies; the API notices through its socket.
    log.error("EngineCore encountered a fatal error (injected fault: crash); exiting")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)


class ApiFault:
    """api-freeze, the API process's one fault: its event loop blocks (time.sleep on it).

    Nothing is served while it lasts, HTTP included, so it ends after ``api_freeze_seconds`` or
    on SIGUSR2 (see :meth:`install_signal`). Armed at start-up, it fires on the first inference
    request, so the server comes up first; set through ``POST /sim/fault``, it fires right after
    the answer is sent."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.state = "armed" if spec.name == "api-freeze" else "idle"
        self.released = threading.Event()

    def install_signal(self) -> None:
        # A plain handler: it runs between the sleeps below; asyncio's own handlers would wait
        # for the very loop that is blocked.
        signal.signal(signal.SIGUSR2, lambda signum, frame: self.released.set())

    def describe(self) -> dict[str, Any]:
        return {"fault": self.spec.name, "state": self.state, "params": self.spec.to_wire()}

    def on_inference(self) -> None:
        if self.state == "armed":
            self._schedule(0.0)

    def arm_now(self, spec: FaultSpec) -> None:
        self.spec, self.state = spec, "armed"
        self._schedule(FREEZE_AFTER_ANSWER_S)

    def clear(self, spec: FaultSpec) -> None:
        self.spec, self.state = spec, "idle"

    def _schedule(self, delay: float) -> None:
        self.state = "fired"
        asyncio.get_running_loop().call_later(delay, self._freeze)

    def _freeze(self) -> None:
        seconds = self.spec.api_freeze_seconds
        log.warning("fault api-freeze: blocking the API event loop for up to %.0f s", seconds)
        self.released.clear()
        deadline = time.monotonic() + seconds
        while not self.released.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(remaining, 0.1))
        self.spec, self.state = replace(self.spec, name="none"), "idle"
        log.warning("fault api-freeze: event loop released")
