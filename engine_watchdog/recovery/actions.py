"""The ladder's actions against a real engine: capture, abort, restart (Actions protocol)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from engine_watchdog.capture.bundle import BundleError, BundleSettings, write_bundle
from engine_watchdog.capture.cuda import ENABLE_VAR
from engine_watchdog.capture.procfs import read_environ
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.capture.steps import DESTRUCTIVE_STEP_TIMEOUT_S
from engine_watchdog.model import Outcome, ProcInfo, Verdict
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.recovery.abort import abort_requests
from engine_watchdog.recovery.restart import kill_engine_core, run_restart_command
from engine_watchdog.watcher import Watcher

log = logging.getLogger(__name__)
StepsFactory = Callable[[bool], Sequence[CaptureStep]]
"""destructive -> the capture steps to run."""
Restarter = Callable[[float], Awaitable[Outcome]]
"""stalled_since -> outcome (supervise mode's ChildEngine.restart)."""


@dataclass(frozen=True)
class RecoverySettings:
    bundle: BundleSettings
    """Where and how incident bundles are written."""
    restart_command: tuple[str, ...] = ()
    """Run this (no shell) to restart the engine instead of killing its engine core."""
    restart_timeout_s: float = 120.0
    """Bound for --restart-command."""


def _core_dump_enabled(p: ProcInfo) -> bool:
    try:
        return read_environ(Path("/proc"), p.pid).get(ENABLE_VAR) == "1"
    except OSError:
        return False


class EngineActions:
    """Acts on the engine a Watcher watches."""

    def __init__(
        self,
        watcher: Watcher,
        settings: RecoverySettings,
        steps: StepsFactory,
        restarter: Restarter | None = None,
        on_bundle: Callable[[str, str], None] | None = None,
    ) -> None:
        self.watcher = watcher
        self.settings = settings
        self.steps = steps
        self.restarter = restarter
        self.on_bundle = on_bundle
        self.last_bundle: str | None = None

    async def _procs(self) -> tuple[ProcInfo, ...]:
        w = self.watcher
        pids = w.settings.probe.pids
        obs = await sample_procs_async(None if pids else w.target, pids, profile=w.profile)
        return obs.procs

    async def capture(self, verdict: Verdict, destructive: bool) -> Outcome:
        procs = await self._procs()
        if destructive and not any(map(_core_dump_enabled, procs)):
            return Outcome("skipped", f"no engine process has {ENABLE_VAR}=1: no CUDA core dump")
        # The profile's name, not the setting: "--engine auto" is resolved by now.
        bundle = replace(
            self.settings.bundle, destructive=destructive, engine=self.watcher.profile.name
        )
        if destructive:
            bundle = replace(bundle, step_timeout_s=DESTRUCTIVE_STEP_TIMEOUT_S)
        try:
            result = await write_bundle(
                bundle,
                verdict,
                procs,
                list(self.watcher.timeline),
                self.steps(destructive),
            )
        except BundleError as exc:
            return Outcome("failed", str(exc))
        self.last_bundle = str(result.path)
        if self.on_bundle:
            self.on_bundle(self.watcher.target, verdict.cause or "no-progress")
        statuses = ", ".join(f"{s.name} {s.status}" for s in result.steps)
        return Outcome("ok", f"bundle {result.path} in {result.elapsed_s:.1f} s ({statuses})")

    async def abort(self) -> Outcome:
        w = self.watcher
        done = await abort_requests(w.session, w.target, w.profile, sorted(w.canary.pending))
        return Outcome(done.result, done.detail)

    async def restart(self, stalled_since: float) -> Outcome:
        if self.restarter is not None:
            done = await self.restarter(stalled_since)
        elif self.settings.restart_command:
            done = await run_restart_command(
                self.settings.restart_command, self.settings.restart_timeout_s
            )
        else:
            done = await asyncio.to_thread(kill_engine_core, await self._procs(), stalled_since)
        if done.result == "ok":  # what follows is a start-up we caused, not a death
            # Supervise mode's restarter has started the next engine before it returns.
            replaced = self.restarter is not None
            self.watcher.note_restart(f"restarted by the watchdog: {done.detail}", replaced)
        return Outcome(done.result, done.detail)

    async def paused(self) -> bool:
        """vLLM dev mode's /is_paused; it waits on a hung engine's loop, so a timeout is 'no'."""
        w = self.watcher
        try:
            timeout = aiohttp.ClientTimeout(total=2.0)
            async with w.session.get(w.target + "/is_paused", timeout=timeout) as resp:
                if resp.status != 200:
                    return False
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False
        return bool(isinstance(doc, dict) and doc.get("is_paused"))

    def same_host(self) -> bool:
        """The engine's processes are visible here (a sidecar or the same machine)."""
        return any(
            r.get("kind") == "procs" and r.get("procs") for r in list(self.watcher.timeline)[-20:]
        )
