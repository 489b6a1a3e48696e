"""The readiness gate: the pod's own condition ``engine-watchdog.io/progressing`` mirrors the
verdicts, so a hung engine leaves routing (Services, llm-d's endpoint picker honour a pod's
readinessGates) and returns after recovery, with no restart.

A reporter: it sees verdicts and says them to the API server; it decides no action (the
supervisor alone does). ``report`` only notes what the condition should be; a task of its own
sends it, one bounded PATCH of pods/status at a time, so the probe loop never waits on the API
server. A failed PATCH is tried again on the next change, or after a backoff, whichever is first.

The patch is a strategic merge patch, as kubectl's own ``kubectl patch --subresource=status``
sends by default: PodStatus.conditions is merged by its ``type`` key (``patchMergeKey:"type"``
in kubernetes/api core/v1/types.go), so the kubelet's Ready, ContainersReady and the other
gates' conditions stay. A JSON merge patch would replace the whole list with ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import aiohttp

from engine_watchdog.core.model import Cause, State, Transition, Verdict
from engine_watchdog.net.k8s_api import ApiError, PodRef, call

log = logging.getLogger(__name__)
CONDITION = "engine-watchdog.io/progressing"
PATCH_TYPE = "application/strategic-merge-patch+json"
RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
MAX_MESSAGE = 1000


@dataclass(frozen=True)
class Wanted:
    """What the condition should say."""

    status: str
    """"True" or "False"."""
    reason: str
    """CamelCase, as the API conventions have a reason: the verdict's cause (HostDeadlock)."""
    message: str

    def key(self) -> tuple[str, str]:
        # The evidence changes every round while stalled: a new PATCH only for a new status or
        # cause, never one a second.
        return self.status, self.reason


def camel(cause: str) -> str:
    """``host-deadlock`` -> ``HostDeadlock``."""
    return "".join(part.capitalize() for part in cause.split("-") if part)


def wanted(target: str, verdicts: dict[str, Verdict]) -> Wanted:
    """False while any engine (rank) of the target is judged stalled, True otherwise: starting,
    idle, busy and unreachable are the engine's own readinessProbe's to judge."""
    stalled = [v for v in verdicts.values() if v.state is State.STALLED]
    if not stalled:
        return Wanted("True", "Progressing", f"no engine at {target} is judged stalled")
    v = stalled[0]
    cause = v.cause or Cause.NO_PROGRESS
    why = f"engine {v.engine} at {target} stalled ({cause})"
    evidence = "; ".join(v.evidence)
    message = f"{why}: {evidence}" if evidence else why
    return Wanted("False", camel(cause), message[:MAX_MESSAGE])


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReadinessGate:
    """A Reporter with a long task (:meth:`run`); never raises into the probe loop."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        pod: PodRef,
        on_flip: Callable[[str], None],
        on_error: Callable[[], None],
        timeout_s: float = 5.0,
        stamp: Callable[[], str] = _utc,
    ) -> None:
        self.session = session
        self.pod = pod
        self.on_flip = on_flip
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.stamp = stamp
        self.want: Wanted | None = None
        self.applied: Wanted | None = None
        self.since: str | None = None
        """lastTransitionTime of the applied status."""
        self.changed = asyncio.Event()
        self.patches = 0

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        try:
            want = wanted(target, verdicts)
        except Exception as exc:  # a reporter must never take the probe loop down
            log.warning("readiness gate: %r", exc)
            return
        if self.want is None or want.key() != self.want.key():
            self.want = want
            self.changed.set()

    async def run(self) -> None:
        """The patching task: the latest wanted condition, one PATCH at a time, forever."""
        retry_in: float | None = None
        while True:
            await self._wait(retry_in)
            want = self.want
            if want is None or (self.applied is not None and want.key() == self.applied.key()):
                retry_in = None
                continue
            try:
                await self._patch(want)
            except (aiohttp.ClientError, TimeoutError, OSError, ApiError) as exc:
                self.on_error()
                retry_in = min(RETRY_MAX_S, 2 * retry_in) if retry_in else RETRY_MIN_S
                log.warning(
                    "readiness gate: condition %s=%s not set (again in %.0f s or at the next "
                    "change): %s",
                    CONDITION,
                    want.status,
                    retry_in,
                    exc or type(exc).__name__,
                )
                continue
            retry_in = None
            self._applied(want)

    async def _wait(self, retry_in: float | None) -> None:
        if retry_in is None:
            await self.changed.wait()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(retry_in):
                    await self.changed.wait()
        self.changed.clear()

    async def _patch(self, want: Wanted) -> None:
        same = self.applied is not None and self.applied.status == want.status
        since = self.since if same and self.since else self.stamp()
        condition = {
            "type": CONDITION,
            "status": want.status,
            "reason": want.reason,
            "message": want.message,
            "lastTransitionTime": since,
        }
        path = f"/api/v1/namespaces/{self.pod.namespace}/pods/{self.pod.name}/status"
        body = {"status": {"conditions": [condition]}}
        await call(self.session, self.pod, "PATCH", path, body, PATCH_TYPE, self.timeout_s)
        self.since = since
        self.patches += 1

    def _applied(self, want: Wanted) -> None:
        before = self.applied
        self.applied = want
        if before is not None and before.status != want.status:
            self.on_flip(want.status)
        log.info("readiness gate: %s=%s (%s)", CONDITION, want.status, want.reason)
