"""Recovery and the guard on a REAL vLLM, in supervise mode: ``engine-watchdog run
--guard-listen ... -- <vLLM> --enable-scale-out`` with the ladder answer -> capture -> abort ->
restart (docs/performance.md "Recovery on a real vLLM"; docs/guard.md "Proof"). vLLM loads the
test plugins (tests/e2e/plugin): a request whose id holds ``stuck`` stops being scheduled after
two tokens, and the engine step deadlocks once a trigger file exists.

ONE supervised engine serves the whole module (one vLLM start instead of two: CI time); the
tests run in file order and each leaves the engine serving again:

a. healthy streaming load for two minutes, straight and through the guard: no stall verdict, no
   action, every request completes, none aborted, and every guarded response identical event for
   event to the same request sent straight to the engine at the same moment (temperature 0, a
   fixed seed; the pair shares the batch);
b. the abort rung's call ends the canary it names (the only requests whose ids it knows);
c. one request stuck while others progress: only that client gets the guard's error; the
   others complete; the engine's own metrics show the request gone from the running batch;
d. SIGSTOP of ``VLLM::EngineCore`` under load straight to the engine and through the guard at
   once (one restart): verdict ``stopped``, a bundle, the abort call accepted, escalation to a
   restart, serving again, every in-flight request answered; the guard's clients in flight get
   the error within the stall verdict + 1 s, new requests get 503 within 1 s, and after the
   restart requests pass;
e. a real deadlock inside the engine core: the same, and the bundle's stacks show the lock's frame;
f. SIGKILL of the engine core: ``engine-dead`` and exactly one restart.

The way out of a stall on a real vLLM (an idle core paused, then admitted within one canary
round) runs on the keyed engine of tests/e2e/test_api_key.py: this module's ladder would
restart its engine during the pause.

Times are from the fault to the stall verdict, to the old engine's processes gone and to the
first successful completion; they are printed at the end of the run (terminal summary).
On this 2-core machine the module takes about 6 minutes (each vLLM start costs 40-60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine_watchdog.engines import VLLM
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.canary import Canary
from engine_watchdog.recovery.abort import abort_requests
from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.guard import Stream, completion, normalised, stream
from tests.tools.guard_compare import pairs_of, watchdog_metric
from tests.tools.recovery_harness import (
    REPORT_LINES,
    Recovery,
    Supervised,
    WatchdogOptions,
    recover_from,
    start_supervised,
    stop_supervised,
    wait_until,
)
from tests.tools.vllm_env import VllmEnv
from tests.tools.vllm_server import (
    DEADLOCK_FRAME,
    SERVED_MODEL,
    STUCK_MARKER_ENV,
    http_get,
    metric_sum,
)

pytestmark = pytest.mark.e2e

GUARD_PORT = free_port()
GUARD = f"http://127.0.0.1:{GUARD_PORT}"
STUCK_S = 5.0
OPTS = WatchdogOptions(
    actions="answer,capture,abort,restart",
    # A stopped or deadlocked core cannot resume whatever the grace: 2 s prove the escalation
    # as 5 do (the benchmark keeps 5: benchmarks/recovery.py).
    abort_grace_s=2.0,
    extra=("--guard-listen", f"127.0.0.1:{GUARD_PORT}", "--request-stall-seconds", str(STUCK_S)),
    engine_env=((STUCK_MARKER_ENV, "stuck"),),
)
HEALTHY_S = 25.0
"""Longer than the stall window (--stall-seconds, 20 s here) and the request judge's 5 s: a
healthy load that any of them misjudged would show here."""
TEXT_PROMPT = "Tell me a story about a watchdog"
"""A prompt whose greedy continuation by the tiny random model carries text. On the loader's
default prompt it gives 75 tokens of text and then 225 whose text is empty (6.6 s of events
with `"text": ""`, measured alone): no progress by the guard's rule (tokens, not events), so a
healthy stream would be judged stuck. On this one, at most 9 tokens in a row are empty."""
SAME_TEXT_SHARE = 0.95
"""CPU kernels give a row slightly different numerics in a different batch, and a pair's two
requests do not always land in the same engine step: about 1 pair in 300 here samples another
token (2 of 546 in one CI run). The framing must be identical in every pair; the generated text
in nearly all of them, so a guard that changed text would still fail."""
FAST_STALL_S = 10.0  # the watchdog's --fast-stall-seconds default (a stopped process)
VERDICT_SLACK_S = 5.0


@pytest.fixture(scope="module")
def supervised(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    """One ``engine-watchdog run`` supervising one vLLM for the module; all of it stopped after."""
    sup = start_supervised(vllm_env, tmp_path_factory.mktemp("recovery"), OPTS)
    try:
        yield sup
    finally:
        stop_supervised(sup)


def without_text(events: list[bytes]) -> list[bytes]:
    """The events with the generated text blanked too: what the guard relays, not what the
    engine sampled."""
    return [re.sub(rb'"text":"(?:[^"\\]|\\.)*"', b'"text":""', e) for e in normalised(events)]


def report(recovery: Recovery) -> None:
    line = recovery.line()
    REPORT_LINES.append(line)
    print(f"\n[e2e] {line}")


def watchdog_alive(sup: Supervised) -> None:
    assert sup.proc.poll() is None, f"the watchdog exited {sup.proc.returncode}:\n{sup.log_tail()}"


def actions_of(rec: Recovery, action: str, result: str | None = None) -> list[dict[str, Any]]:
    return [a for a in rec.actions if a["action"] == action and result in (None, a["result"])]


def assert_recovered(rec: Recovery, sup: Supervised) -> None:
    """Serving again, one restart, every request that was in flight answered."""
    context = f"{rec.line()}\nactions: {rec.actions}\n{sup.log_tail()}"
    assert rec.verdict is not None, f"no stall verdict\n{context}"
    assert rec.stopped_s is not None, f"the old engine never stopped\n{context}"
    assert rec.served_s is not None, f"no completion after the restart\n{context}"
    assert len(actions_of(rec, "restart", "ok")) == 1, context
    assert rec.in_flight > 0, context
    assert rec.outcome.hanging == 0, context
    assert rec.answered == rec.in_flight, context
    watchdog_alive(sup)


def assert_abort_then_restart(rec: Recovery) -> None:
    """The abort rung called /inference/v1/abort_requests (200), the stall went on and the same
    incident escalated to a restart (not a second verdict's incident)."""
    aborts = actions_of(rec, "abort")
    restarts = actions_of(rec, "restart", "ok")
    assert len(aborts) == 1, rec.actions
    assert aborts[0]["result"] == "ok", aborts
    assert "/inference/v1/abort_requests" in aborts[0]["detail"], aborts
    assert restarts and restarts[0]["t"] > aborts[0]["t"], rec.actions
    assert len(actions_of(rec, "capture", "ok")) == 1, rec.actions


def bundle_of(rec: Recovery, sup: Supervised) -> Path:
    bundles = sup.bundles(since=rec.fault_t)
    assert bundles, f"no incident bundle since the fault in {sup.incident_dir}"
    bundle = bundles[0]
    assert (bundle / "summary.md").is_file(), sorted(bundle.iterdir())
    assert list((bundle / "pyspy").glob("*.txt")), sorted(bundle.iterdir())
    # No shipped known-hang signature is meant for a CPU engine stopped or deadlocked by a test:
    # a match here would be a false claim in front of an operator.
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["known_hangs"] == [], manifest["known_hangs"]
    assert "Nothing in this bundle matches a known hang" in (bundle / "summary.md").read_text()
    return bundle


@pytest.mark.timeout(600)  # also starts the module's engine (40-90 s here, up to 240 s bound)
async def test_healthy_load_takes_no_action_and_the_guard_changes_nothing(
    supervised: Supervised,
) -> None:
    sup = supervised
    # The load is the pairs themselves: more streams beside them would change the batches the
    # two requests of a pair share, and with them the numerics (CPU kernels, temperature 0).
    pairs = await pairs_of(sup.base_url, GUARD, clients=3, seconds=HEALTHY_S)
    framing = [
        (d.request_id, without_text(d.events)[:3], without_text(g.events)[:3])
        for d, g in pairs
        if without_text(d.events) != without_text(g.events)
    ]
    different = [d.request_id for d, g in pairs if normalised(d.events) != normalised(g.events)]
    failed = [s.error for pair in pairs for s in pair if not s.done or s.error is not None]
    line = f"healthy {HEALTHY_S:.0f} s: {2 * len(pairs)} completed, {len(failed)} failed"
    REPORT_LINES.append(f"{line}; through the guard: {len(different)} of {len(pairs)} differ")
    print(f"\n[e2e] {line}; through the guard: {len(different)} of {len(pairs)} differ")
    stalls = [v for v in sup.transitions if v["state"] == "stalled"]
    assert not stalls, stalls
    assert sup.actions() == []
    assert len(pairs) > 4 and failed == [], failed[:3]
    assert framing == [], framing[:3]
    assert len(different) <= (1 - SAME_TEXT_SHARE) * len(pairs), different
    assert await watchdog_metric(sup, "engine_watchdog_guard_stuck_requests_total") == 0
    aborted = "engine_watchdog_guard_aborted_requests_total"
    assert await watchdog_metric(sup, aborted, reason="stall") == 0
    watchdog_alive(sup)


async def test_abort_rung_ends_the_canary_it_names(supervised: Supervised) -> None:
    """The abort rung (recovery/abort.py) aborts by the ids of the watchdog's own canaries
    (probes/canary.py). vLLM names a /v1/completions request ``cmpl-<X-Request-Id>-<i>``, and
    ``/inference/v1/abort_requests`` answers 200 for ids it does not know: the call must name
    the request vLLM knows, so that the canary really ends, and an aborted canary (HTTP 200,
    finish_reason "abort") is no proof of life."""
    sup = supervised
    pids = sup.engine_core_pids()
    async with aiohttp.ClientSession() as session:
        conn = EngineConnection.of(sup.base_url)
        canary = Canary(session, conn, timeout_s=20.0)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            sent = asyncio.create_task(canary.send(VLLM))
            await wait_until(lambda: sorted(canary.pending) or None, 5.0)
            await asyncio.sleep(1.0)  # the request reaches vLLM's API server
            done = await abort_requests(session, conn, VLLM, sorted(canary.pending))
            finished = await asyncio.wait({sent}, timeout=5.0)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        obs = await sent
    assert done.result == "ok", done
    assert finished[0], f"{done.detail}, yet the canary still ran 5 s later: {obs}"
    assert not obs.ok, f"an aborted canary counted as proof of life: {obs}"


async def test_only_the_stuck_request_is_answered_and_the_engine_drops_it(
    supervised: Supervised,
) -> None:
    """Three clients stream continuously (so the others always move) while one request is kept
    from being scheduled after two tokens."""
    sup = supervised
    async with (
        aiohttp.ClientSession() as session,
        StreamingLoad(
            GUARD, clients=3, max_tokens=300, model=SERVED_MODEL, prompt=TEXT_PROMPT
        ) as load,
    ):
        await load.wait_for(chunks=20, in_flight=3, timeout=60)
        body = completion(SERVED_MODEL, 1500)
        stuck = await stream(session, GUARD, body, "stuck-1", timeout=90)
        await asyncio.sleep(1.0)
        text = (await asyncio.to_thread(http_get, sup.base_url + "/metrics"))[1]
        running, in_flight = metric_sum(text, "vllm:num_requests_running"), load.in_flight
        outcome = await load.stop(drain_s=60)
    context = f"{stuck.events[-3:]}\n{sup.log_tail(40)}"
    assert stuck.error is not None and stuck.done, context
    assert stuck.error["code"] == 503, context
    assert stuck.tokens == 2, context  # the plugin let it have two
    assert (outcome.errored, outcome.hanging) == (0, 0), outcome.errors
    assert running <= in_flight, (running, in_flight)  # the stuck request left the batch
    assert (
        await watchdog_metric(sup, "engine_watchdog_guard_aborted_requests_total", reason="stuck")
        == 1
    )
    assert [v for v in sup.transitions if v["state"] == "stalled"] == []


@dataclass
class GuardedStop:
    """What the guard's clients saw of one stop of the engine core."""

    answered: list[Stream]
    refused: Stream
    refused_t: float
    during: list[int]
    after: Stream


async def guarded_clients_through_a_stop(session: aiohttp.ClientSession) -> GuardedStop:
    """Four long streams through the guard, in flight when the core stops; then one request as
    soon as they are answered, and one a second until the restarted engine serves it."""
    clients = [
        asyncio.create_task(stream(session, GUARD, completion(SERVED_MODEL, 1800), f"c-{i}"))
        for i in range(4)
    ]
    answered = await asyncio.wait_for(asyncio.gather(*clients), 90)
    refused_t = time.time()
    refused = await stream(session, GUARD, completion(SERVED_MODEL, 4))
    during, after = [], refused
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and after.status != 200:
        await asyncio.sleep(1.0)
        after = await stream(session, GUARD, completion(SERVED_MODEL, 4))
        during.append(after.status)
    return GuardedStop(list(answered), refused, refused_t, during, after)


async def test_sigstopped_engine_core_is_restarted_and_the_guard_answers_its_clients(
    supervised: Supervised,
) -> None:
    """One stop of the core (one restart: CI time), with load straight to the engine and
    through the guard at once. Straight: the ladder (verdict ``stopped``, a bundle, the abort,
    the restart) and every request in flight answered. Through the guard: its clients get the
    error at the verdict, new requests 503 at once, and requests pass after the restart."""
    sup = supervised
    async with aiohttp.ClientSession() as session:
        guarded = asyncio.create_task(guarded_clients_through_a_stop(session))
        try:
            rec = await recover_from(sup, "sigstop")
            seen = await asyncio.wait_for(guarded, 300)
        finally:
            guarded.cancel()
    report(rec)
    assert rec.cause == "stopped", rec.verdict
    assert rec.verdict_s is not None and rec.verdict_s <= FAST_STALL_S + VERDICT_SLACK_S
    assert_recovered(rec, sup)
    assert_abort_then_restart(rec)
    bundle_of(rec, sup)
    assert_guard_answered(rec, seen)


def assert_guard_answered(rec: Recovery, seen: GuardedStop) -> None:
    verdict = rec.verdict
    assert verdict is not None
    last_token = max(t for c in seen.answered for t in c.times[:-2])
    late = max(c.times[-1] for c in seen.answered) - verdict["t"]
    line = (
        f"guard SIGSTOP: verdict {verdict['t'] - last_token:.1f} s after the last event "
        f"({verdict['cause']}), clients answered by +{late:.2f} s"
    )
    REPORT_LINES.append(line)
    print(f"\n[e2e] {line}")
    assert verdict["t"] - last_token <= 7.0, line
    for c in seen.answered:
        assert c.error is not None and c.done, c.events[-2:]
        assert c.times[-1] <= verdict["t"] + 1.0, line
    assert seen.refused.status == 503 and "Retry-After" in seen.refused.headers
    assert seen.refused_t - verdict["t"] <= 1.0  # sent as soon as the clients were answered
    assert set(seen.during[:-1]) <= {503}, seen.during  # refused, never hanging, until back
    assert seen.after.status == 200 and seen.after.done and seen.after.error is None, seen.after


async def test_deadlocked_engine_core_is_captured_and_restarted(supervised: Supervised) -> None:
    sup = supervised
    rec = await recover_from(sup, "deadlock")
    report(rec)
    assert not sup.trigger.exists()
    assert rec.verdict_s is not None and rec.verdict_s <= OPTS.stall_s + VERDICT_SLACK_S
    assert_recovered(rec, sup)
    assert_abort_then_restart(rec)
    bundle = bundle_of(rec, sup)
    stacks = [p.read_text(errors="replace") for p in (bundle / "pyspy").glob("*.txt")]
    summary = (bundle / "summary.md").read_text(errors="replace")
    assert any(DEADLOCK_FRAME in s for s in stacks), f"no {DEADLOCK_FRAME} in {bundle}/pyspy"
    assert DEADLOCK_FRAME in summary, summary[:2000]


async def test_killed_engine_core_is_restarted_once(supervised: Supervised) -> None:
    sup = supervised
    rec = await recover_from(sup, "sigkill")
    # The supervisor's own restart call comes after the verdict; wait for it before counting.
    await wait_until(lambda: _supervisor_restart(sup, rec.fault_t), 60.0)
    rec = replace(rec, actions=tuple(sup.actions(since=rec.fault_t)))
    report(rec)
    assert rec.cause == "engine-dead", rec.verdict
    assert rec.verdict_s is not None and rec.verdict_s <= FAST_STALL_S, rec.verdict
    assert_recovered(rec, sup)  # exactly one restart with result ok
    assert not actions_of(rec, "abort"), rec.actions  # nothing to abort in a dead engine
    assert _supervisor_restart(sup, rec.fault_t), rec.actions


def _supervisor_restart(sup: Supervised, since: float) -> dict[str, Any] | None:
    """The supervisor's restart record (supervise mode's own is 'engine exited (rc)')."""
    records = sup.actions(since)
    mine = [a for a in records if a["action"] == "restart"]
    return next((a for a in mine if not a["detail"].startswith("engine exited")), None)
