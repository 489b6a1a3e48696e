"""The parts of one watched engine talk through its bus (runtime/events.py), never through the
records: a restart the actions note reaches the judge, the engine view learns the profile and
whether the processes are seen here from events, and the supervisor's answer to a stuck request
reaches the timeline as a typed event."""

from __future__ import annotations

from dataclasses import replace

import aiohttp

from engine_watchdog.core.model import Cause, ProcInfo, ProcsObs, State
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines import LLAMACPP, VLLM
from engine_watchdog.net.connection import connection_for
from engine_watchdog.runtime.act.handle import PROCS_SEEN_SAMPLES, EngineView
from engine_watchdog.runtime.events import Bus, StuckHandled
from engine_watchdog.runtime.trace.recording import RoundRecords
from engine_watchdog.runtime.watch.watcher import Watcher, watcher_for

T = 1_796_000_000.0
SETTINGS = WatchSettings(url="http://127.0.0.1:9")
SETTINGS = replace(SETTINGS, probe=replace(SETTINGS.probe, gpu=False, procs=False))
ENGINE = ProcInfo(
    pid=7, ppid=1, role="engine-core", title="VLLM::EngineCore", state="running", cpu_s=1.0
)


def parts(session: aiohttp.ClientSession) -> tuple[Bus, RoundRecords, Watcher, EngineView]:
    bus, records = Bus(), RoundRecords()
    watcher = watcher_for(SETTINGS, session, bus=bus, records=records, clock=lambda: T)
    view = EngineView(SETTINGS, session, connection_for(SETTINGS), bus, lambda: {"b", "a"}, ())
    return bus, records, watcher, view


async def test_a_restart_the_actions_note_is_judged_as_a_start_up() -> None:
    async with aiohttp.ClientSession() as session:
        _, records, watcher, view = parts(session)
        view.note_restart("restarted by the watchdog", replaced=True)
        changes = watcher.judge.judge([])
        records.publish()
        watcher.close()
    assert [(c.new.state, c.new.cause) for c in changes] == [(State.STARTING, Cause.RESTARTING)]
    restart = [r for r in records.timeline if r["kind"] == "restart"]
    assert restart == [
        {"v": 1, "t": T, "kind": "restart", "detail": "restarted by the watchdog", "replaced": True}
    ]


async def test_the_engine_view_learns_from_events_and_reads_no_record() -> None:
    async with aiohttp.ClientSession() as session:
        bus, _, watcher, view = parts(session)  # its timeline is empty: nothing to read
        watcher.close()
    assert (view.profile, view.sees_processes()) == (VLLM, False)
    bus.observed.publish(ProcsObs(T, (ENGINE,)))
    assert view.sees_processes()
    for i in range(PROCS_SEEN_SAMPLES):
        bus.observed.publish(ProcsObs(T + i, ()))
    assert not view.sees_processes()  # none seen in the latest samples
    bus.named.publish(LLAMACPP)
    assert view.profile is LLAMACPP
    assert view.known_request_ids() == ["a", "b"]


async def test_what_became_of_a_stuck_request_reaches_the_timeline() -> None:
    async with aiohttp.ClientSession() as session:
        bus, records, watcher, _ = parts(session)
        bus.handled.publish(StuckHandled("r-1", "aborted", 21.0, 20.0))
        records.publish()  # as the next round does
        watcher.close()
    assert list(records.timeline)[-1] == {
        "v": 1,
        "t": T,
        "kind": "request-stuck",
        "request_id": "r-1",
        "result": "aborted",
        "silent_s": 21.0,
        "threshold_s": 20.0,
    }
