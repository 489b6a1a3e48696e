"""``check``: a one-shot verdict for scripts and humans.

Exit codes: 0 healthy (progress seen, or an idle engine answered a canary), 1 stalled, 2
unreachable or not an engine, 3 undecided (no evidence either way when --timeout ran out: the
line says how long a verdict needs), 64 usage error.

Exit 0 needs evidence: a wedged core stops publishing, so its /metrics read
``num_requests_running 0`` and look idle (vLLM #46811). An idle look is no proof; a canary is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from engine_watchdog.core.detector import TARGET
from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    HttpStatus,
    Observation,
    Reason,
    State,
    Verdict,
)
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.net.connection import connection_for
from engine_watchdog.report.console import verdict_dict
from engine_watchdog.runtime.events import Bus
from engine_watchdog.runtime.pid_check import check_pids
from engine_watchdog.runtime.watch.watcher import Watcher, watcher_for

EXIT_OK, EXIT_STALLED, EXIT_UNREACHABLE, EXIT_UNDECIDED = 0, 1, 2, 3
FLEET_CONCURRENCY_MAX = 1000
"""Engines judged at once, at most: more only adds event-loop work per round and slows each
round down, so a check of one engine could overrun its own interval."""
SOCKETS_PER_CHECK = 3
"""/metrics, /health and a canary may be open at once for one engine."""
FD_RESERVE = 64
"""File descriptors kept for everything else (logs, the event loop, DNS, NVML)."""
# Scrape errors that will not heal by waiting: give up at once.
_HOPELESS: tuple[Reason, ...] = (
    Cause.REFUSED,
    Cause.DNS,
    Cause.NO_ENGINE_SERIES,
    HttpStatus.of(404),
    Cause.TOO_LARGE,
    Cause.TLS,
)
_QUIET = (State.IDLE, State.SLEEPING)


@dataclass
class CheckResult:
    code: int
    verdicts: list[Verdict] = field(default_factory=list)
    error: str | None = None
    evidence: str | None = None
    """What proved the engine healthy: "progress" or "canary"; None: nothing did."""
    undecided: str | None = None
    """Why there is no verdict (exit 3), and how long one needs."""

    def as_dict(self, target: str) -> dict[str, Any]:
        worst = max(self.verdicts, key=lambda v: v.seconds_without_progress, default=None)
        stalled = [v for v in self.verdicts if v.state is State.STALLED]
        head = stalled[0] if stalled else worst
        return {
            "target": target,
            "exit_code": self.code,
            "state": "unreachable"
            if self.code == EXIT_UNREACHABLE or head is None
            else head.state.value,
            "cause": head.cause if head else None,
            "seconds_without_progress": head.seconds_without_progress if head else 0.0,
            "error": self.error,
            "evidence": self.evidence,
            "undecided": self.undecided,
            "engines": [verdict_dict(v, target) for v in self.verdicts],
        }


def decide(
    verdicts: dict[str, Verdict], quiet_rounds: dict[str, int], answered: bool
) -> int | None:
    """An exit code once the verdicts are conclusive, else None (keep observing).

    ``answered``: a canary sent during this check was answered. A quiet engine is healthy only
    then: it may be quiet because its core is wedged."""
    if any(v.state is State.STALLED for v in verdicts.values()):
        return EXIT_STALLED
    target = verdicts.get(TARGET)
    if target is not None:
        return EXIT_UNREACHABLE if target.cause in _HOPELESS else None
    settled = all(
        (v.state is State.PROGRESSING and v.last_progress_t is not None)
        or (v.state in _QUIET and quiet_rounds.get(e, 0) >= 2 and answered)
        for e, v in verdicts.items()
    )
    return EXIT_OK if settled and verdicts else None


def at_timeout(verdicts: dict[str, Verdict]) -> int:
    """The budget ran out without a conclusive verdict: nothing proved the engine healthy."""
    states = {v.state for v in verdicts.values()}
    if TARGET in verdicts or State.UNREACHABLE in states:
        return EXIT_UNREACHABLE
    return EXIT_UNDECIDED


def verdict_needs_s(settings: WatchSettings) -> float:
    """How long a check of a quiet engine needs: a round to see it, a canary that may take its
    whole timeout, and a round to judge the answer; with two rounds' slack."""
    probe = settings.probe
    return probe.canary_timeout_s + 4 * probe.interval_s


def why_undecided(settings: WatchSettings, budget_s: float) -> str:
    if not settings.probe.canary:
        return (
            "no progress seen and --no-canary: nothing proves the engine healthy (send it "
            "traffic, or drop --no-canary so a canary can)"
        )
    needs = verdict_needs_s(settings)
    return (
        f"no progress seen and no canary answered within the {budget_s:g} s budget; a verdict "
        f"needs about {needs:.0f} s (--timeout {needs:.0f})"
    )


async def run_check(
    settings: WatchSettings, timeout_s: float, session: aiohttp.ClientSession | None = None
) -> CheckResult:
    """Observe until the verdict is conclusive or ``timeout_s`` runs out."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await run_check(settings, timeout_s, own)
    await asyncio.to_thread(check_pids, settings, False)  # check reads processes, never acts
    # A quiet engine gets its canary at once: the check has no minutes to wait for one.
    judged = replace(settings, detector=replace(settings.detector, canary_after_seconds=0.0))
    bus = Bus()
    watcher = watcher_for(judged, session, bus=bus, connection=connection_for(settings))
    answered = Answered(time.time())  # the watcher's clock
    bus.observed.subscribe(answered.on_observed)
    try:
        result = await _observe(watcher, answered, time.monotonic() + timeout_s)
    finally:
        watcher.close()
    if result.code == EXIT_UNDECIDED:
        return replace(result, undecided=why_undecided(settings, timeout_s))
    return result


def fleet_concurrency() -> int:
    """How many engines to judge at once: as many as the file-descriptor limit allows (the
    soft limit is raised to the hard one first, which needs no privilege), at most
    FLEET_CONCURRENCY_MAX. A check never opens more sockets than the limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLEET_CONCURRENCY_MAX * SOCKETS_PER_CHECK + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY:
        return FLEET_CONCURRENCY_MAX
    return max(1, min(FLEET_CONCURRENCY_MAX, (soft - FD_RESERVE) // SOCKETS_PER_CHECK))


async def run_checks(
    settings: Sequence[WatchSettings], timeout_s: float, concurrency: int | None = None
) -> list[CheckResult]:
    """Judge many engines concurrently (bounded), one result each, in the order given.

    Each engine gets a session of its own, closed when its verdict is in: its connections are
    reused between its rounds and none outlives its check, so at most ``concurrency`` engines'
    sockets are open at once (a shared pool would keep every finished engine's idle one)."""
    concurrency = concurrency or min(len(settings), fleet_concurrency())
    gate = asyncio.Semaphore(concurrency)

    async def one(s: WatchSettings) -> CheckResult:
        async with gate:
            connector = aiohttp.TCPConnector(limit=SOCKETS_PER_CHECK)
            async with aiohttp.ClientSession(connector=connector) as session:
                return await run_check(s, timeout_s, session)

    return list(await asyncio.gather(*(one(s) for s in settings)))


def worst_code(codes: Sequence[int]) -> int:
    """A stalled engine outranks an unreachable one, which outranks an undecided one."""
    for code in (EXIT_STALLED, EXIT_UNREACHABLE, EXIT_UNDECIDED):
        if code in codes:
            return code
    return EXIT_OK


def check_lines(
    results: Sequence[CheckResult], settings: Sequence[WatchSettings], as_json: bool
) -> tuple[int, list[str]]:
    """(exit code, lines to print): one JSON document, or one line per engine and a summary."""
    docs = [r.as_dict(s.url) for r, s in zip(results, settings, strict=True)]
    code = worst_code([r.code for r in results])
    if as_json:
        return code, [json.dumps(docs[0] if len(docs) == 1 else fleet_document(docs, code))]
    lines = [f"{doc['target']}: {check_line(doc)}" for doc in docs]
    return code, lines + ([summary_line(docs)] if len(docs) > 1 else [])


def check_line(doc: dict[str, Any]) -> str:
    if doc["error"]:
        return f"{doc['state']}: {doc['error']}"
    text = str(doc["state"]) + (f" ({doc['cause']})" if doc["cause"] else "")
    text += f", {doc['seconds_without_progress']:.1f} s without progress"
    if doc["undecided"]:
        return f"undecided: {text}: {doc['undecided']}"
    return text + (f" (evidence: {doc['evidence']})" if doc["evidence"] else "")


def fleet_document(docs: list[dict[str, Any]], code: int) -> dict[str, Any]:
    return {"exit_code": code, "summary": _counts(docs), "targets": docs}


def summary_line(docs: list[dict[str, Any]]) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(_counts(docs).items()))
    return f"{len(docs)} targets: {counts}"


def _counts(docs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for doc in docs:
        counts[doc["state"]] = counts.get(doc["state"], 0) + 1
    return counts


class Answered:
    """Whether a canary sent since ``since`` was answered, from the judged observations."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.yes = False

    def on_observed(self, obs: Observation) -> None:
        if isinstance(obs, CanaryObs) and obs.ok and obs.sent >= self.since:
            self.yes = True


async def _observe(watcher: Watcher, canary: Answered, deadline: float) -> CheckResult:
    quiet_rounds: dict[str, int] = {}
    while True:
        await watcher.tick()
        verdicts = watcher.verdicts
        for engine, v in verdicts.items():
            quiet_rounds[engine] = quiet_rounds.get(engine, 0) + 1 if v.state in _QUIET else 0
        answered = canary.yes
        code = decide(verdicts, quiet_rounds, answered)
        if code is None and time.monotonic() >= deadline:
            code = at_timeout(verdicts)
        if code is not None:
            evidence = _evidence(code, verdicts, answered)
            return CheckResult(code, list(verdicts.values()), _error(watcher), evidence)
        pause = min(watcher.interval_s, max(0.0, deadline - time.monotonic()))
        # Woken early when the canary ends: its answer is judged at once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.woken.wait(), pause)
        watcher.woken.clear()


def _evidence(code: int, verdicts: dict[str, Verdict], answered: bool) -> str | None:
    if code != EXIT_OK:
        return None
    # The canary's own token moves the counters: it is the evidence then.
    return "canary" if answered else "progress"


def _error(watcher: Watcher) -> str | None:
    obs = watcher.prober.last_scrape
    if obs is None or obs.error is None:
        return None
    return obs.detail or obs.error
