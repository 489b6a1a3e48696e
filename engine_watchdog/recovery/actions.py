"""The ladder's actions against a real engine: capture, abort, restart (the supervisor's
``Actions`` protocol).

Recovery never probes: what it needs to know of the engine comes through :class:`EngineHandle`,
which the runtime implements from its typed events (runtime/act/handle.py; the process finder
included).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.core.model import Cause, Outcome, ProcInfo, Reason, Result, Verdict
from engine_watchdog.core.settings import CaptureSettings, RecoverySettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.host.tools import tools_with
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.net.http import get_json
from engine_watchdog.recovery.abort import abort_requests
from engine_watchdog.recovery.restart import (
    RESTART_LOG,
    Owner,
    kill_engine_core,
    run_restart_command,
)

if TYPE_CHECKING:
    from engine_watchdog.capture.bundle import BundleSettings

log = logging.getLogger(__name__)
StepsFactory = Callable[[bool], Sequence[CaptureStep]]
"""destructive -> the capture steps to run."""
Restarter = Callable[[float], Awaitable[Outcome]]
"""stalled_since -> outcome (supervise mode's ChildEngine.restart)."""
GroupStop = Callable[[Path | None], Awaitable[Outcome]]
"""A multi-node leader's stop of every node (runtime/peering.py), given the incident's bundle."""
PAUSED_TIMEOUT_S = 2.0


class EngineHandle(Protocol):
    """What the actions may know of the engine they act on, and the one thing they tell it."""

    @property
    def target(self) -> str:
        """The engine's base URL as reports name it (any credentials in it redacted)."""

    @property
    def connection(self) -> EngineConnection:
        """Where to connect, TLS and the watchdog's credentials (abort routes are guarded too)."""

    @property
    def session(self) -> aiohttp.ClientSession: ...

    @property
    def profile(self) -> EngineProfile:
        """The engine's profile (resolved by now where it was "auto")."""

    def known_request_ids(self) -> list[str]:
        """Engine-side ids of requests in flight that we know (our canaries)."""

    def recent_records(self) -> list[dict[str, Any]]:
        """The recorded observations of the last minutes (the bundle's timeline)."""

    def sees_processes(self) -> bool:
        """The engine's processes are visible here (a sidecar or the same machine)."""

    async def find_procs(self) -> tuple[ProcInfo, ...]:
        """The engine's processes, discovered afresh."""

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        """The watchdog ended the engine so that it restarts (``replaced``: the next one runs)."""


class EngineActions:
    """Acts on the engine behind an :class:`EngineHandle`."""

    def __init__(
        self,
        engine: EngineHandle,
        capture: CaptureSettings,
        recovery: RecoverySettings,
        steps: StepsFactory,
        restarter: Restarter | None = None,
        on_bundle: Callable[[str, Reason, str], None] | None = None,
        hand_off: Callable[[Path], None] | None = None,
        pod_log: Callable[[], Awaitable[bytes]] | None = None,
        stop_group: GroupStop | None = None,
    ) -> None:
        self.engine = engine
        self.capture_settings = capture
        self.recovery = recovery
        self.steps = steps
        self.restarter = restarter
        self.on_bundle = on_bundle
        self.hand_off = hand_off
        """Given each finished bundle's path (--bundle-command); returns at once."""
        self.pod_log = pod_log
        """Reads the engine container's log through the Kubernetes API (--pod-log)."""
        self.stop_group = stop_group
        """Every node of a multi-node group stopped and checked before this one restarts."""
        self.last_bundle: str | None = None

    async def capture(self, verdict: Verdict, destructive: bool) -> Outcome:
        # Imported at the first capture, not at start: a sidecar that never sees an incident
        # never holds the bundle writer, its steps and the known hangs (docs/performance.md).
        from engine_watchdog.capture.bundle import BundleError, write_bundle
        from engine_watchdog.capture.cuda import ENABLE_VAR, core_dump_enabled

        procs = await self.engine.find_procs()
        if destructive and not await asyncio.to_thread(core_dump_enabled, procs):
            return Outcome(
                Result.SKIPPED, f"no engine process has {ENABLE_VAR}=1: no CUDA core dump"
            )
        bundle = self._bundle_settings(destructive)
        timeline = self.engine.recent_records()
        try:
            result = await write_bundle(bundle, verdict, procs, timeline, self.steps(destructive))
        except BundleError as exc:
            return Outcome(Result.FAILED, str(exc))
        self.last_bundle = str(result.path)
        if self.on_bundle:
            self.on_bundle(self.engine.target, verdict.cause or Cause.NO_PROGRESS, result.signature)
        if self.hand_off:
            self.hand_off(result.path)
        statuses = ", ".join(f"{s.name} {s.status}" for s in result.steps)
        known = ""
        if result.signature.startswith("possible:"):  # (hangs/: what decides it was not seen)
            known = f"; possibly resembles known hang {result.signature.removeprefix('possible:')}"
        elif result.signature != "none":
            known = f"; resembles known hang {result.signature}"
        return Outcome(
            Result.OK, f"bundle {result.path} in {result.elapsed_s:.1f} s ({statuses}){known}"
        )

    def _bundle_settings(self, destructive: bool) -> BundleSettings:
        from engine_watchdog.capture.bundle import BundleSettings
        from engine_watchdog.capture.engine_version import read_engine_version
        from engine_watchdog.capture.steps import DESTRUCTIVE_STEP_TIMEOUT_S

        capture = self.capture_settings
        if destructive:
            capture = replace(capture, step_timeout_s=DESTRUCTIVE_STEP_TIMEOUT_S)
        # The profile's name, not the setting: "--engine auto" is resolved by now.
        return BundleSettings(
            capture,
            engine=self.engine.profile.name,
            target=self.engine.target,
            destructive=destructive,
            tools=tools_with(capture.py_spy),
            engine_version=lambda: read_engine_version(self.engine.session, self.engine.connection),
            pod_log=self.pod_log,
        )

    async def abort(self) -> Outcome:
        e = self.engine
        ids = sorted(e.known_request_ids())
        return await abort_requests(e.session, e.connection, e.profile, ids)

    async def restart(self, stalled_since: float) -> Outcome:
        """A group's nodes first (all stopped and checked), then this engine's own restart."""
        group = None
        if self.stop_group is not None:
            group = await self.stop_group(Path(self.last_bundle) if self.last_bundle else None)
        done = await self._restart_own(stalled_since)
        killing = self.restarter is None and not self.recovery.restart_command
        if group is not None and killing and done.result == Result.SKIPPED:
            # The group stop ended the engine's processes (a group's rank 0 may be a worker
            # with no engine core at all): nothing is left to kill, and kill_engine_core's
            # advice (--pid, --restart-command) would mislead. Whatever runs it restarts it.
            done = Outcome(Result.OK, "engine ended by the group stop; its supervisor restarts it")
        if done.result == Result.OK:  # what follows is a start-up we caused, not a death
            # Supervise mode's restarter has started the next engine before it returns.
            replaced = self.restarter is not None
            self.engine.note_restart(f"restarted by the watchdog: {done.detail}", replaced)
        return (
            done if group is None else Outcome(done.result, f"{group.detail}; then {done.detail}")
        )

    async def _restart_own(self, stalled_since: float) -> Outcome:
        if self.restarter is not None:
            return await self.restarter(stalled_since)
        if self.recovery.restart_command:
            return await run_restart_command(
                self.recovery.restart_command,
                self.recovery.restart_timeout_s,
                self.capture_settings.incident_dir / RESTART_LOG,
            )
        procs = await self.engine.find_procs()
        uid = self.recovery.engine_uid
        owner = Owner(os.getuid() if uid is None else uid)
        return await asyncio.to_thread(kill_engine_core, procs, stalled_since, owner)

    async def paused(self) -> bool:
        """vLLM dev mode's /is_paused; it waits on a hung engine's loop, so a timeout is 'no'."""
        e = self.engine
        conn = e.connection
        doc = await get_json(e.session, conn.url("/is_paused"), PAUSED_TIMEOUT_S, conn.access)
        return bool(isinstance(doc, dict) and doc.get("is_paused"))

    def same_host(self) -> bool:
        return self.engine.sees_processes()
