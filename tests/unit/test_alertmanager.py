"""The Alertmanager v2 client and reporter, against a REAL Alertmanager on a loopback port.

The binary comes from Debian's prometheus-alertmanager (``deploy/ensure-tools.sh`` installs it;
``make test`` runs that). Missing binary = failure with the fix, never a silent skip.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from engine_watchdog.core.model import Cause, State, Transition, Verdict
from engine_watchdog.report.alertmanager import (
    Alert,
    AlertmanagerError,
    AlertmanagerReporter,
    push_alerts,
    utc,
)

AM_CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alertmanager_binary() -> str:
    for name in ("alertmanager", "prometheus-alertmanager"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "alertmanager is not installed: run `bash deploy/ensure-tools.sh` "
        "(apt-get install prometheus-alertmanager); `make test` does it for you"
    )


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.load(resp)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"alertmanager exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"alertmanager not ready at {url} within {deadline_s} s")


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _alertmanager_binary()
    tmp = tmp_path_factory.mktemp("am")
    config = tmp / "alertmanager.yml"
    config.write_text(AM_CONFIG)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    log = (tmp / "alertmanager.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(url, proc, deadline_s=20)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


def _active(url: str, **labels: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get_json(url + "/api/v2/alerts")
    return [a for a in alerts if all(a["labels"].get(k) == v for k, v in labels.items())]


async def _eventually(url: str, present: bool, labels: dict[str, str], within_s: float = 5) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        found = await asyncio.to_thread(_active, url, **labels)
        if bool(found) == present:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"alert {labels} present={bool(found)} after {within_s} s")
        await asyncio.sleep(0.1)


def _verdict(state: State, t: float, cause: str | None = None, engine: str = "0") -> Verdict:
    return Verdict(
        t=t,
        engine=engine,
        state=state,
        cause=None if cause is None else Cause(cause),
        since=t,
        seconds_without_progress=31.0 if state is State.STALLED else 0.0,
        evidence=("running=6 and no counter moved for 31 s",),
    )


async def test_push_and_resolve(alertmanager: str) -> None:
    labels = {"alertname": "UnitPush", "target": "http://127.0.0.1:1", "case": "push"}
    now = time.time()
    alert = Alert(labels, {"summary": "s"}, starts_at=utc(now), ends_at=utc(now + 300))
    async with aiohttp.ClientSession() as session:
        await push_alerts(session, alertmanager, [alert], timeout_s=5)
        found = await _eventually(alertmanager, True, labels)
        assert found[0]["annotations"]["summary"] == "s"
        assert found[0]["status"]["state"] in ("active", "unprocessed")
        resolved = Alert(labels, starts_at=utc(now), ends_at=utc(time.time()))
        await push_alerts(session, alertmanager, [resolved], timeout_s=5)
        await _eventually(alertmanager, False, labels)


async def test_push_rejected_raises(alertmanager: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(AlertmanagerError, match="HTTP 400"):
            await push_alerts(session, alertmanager, [Alert(labels={})], timeout_s=5)


async def test_reporter_fires_and_resolves(alertmanager: str) -> None:
    target = "http://127.0.0.1:8123"
    labels = {"alertname": "EngineStalled", "target": target, "engine": "1"}
    async with aiohttp.ClientSession() as session:
        rep = AlertmanagerReporter(session, alertmanager, extra_labels={"pod": "vllm-0"})
        stalled = _verdict(State.STALLED, time.time(), cause="stopped", engine="1")
        rep.report(target, [Transition(State.SUSPECT, stalled)], {"1": stalled})
        assert await rep.flush()
        found = await _eventually(alertmanager, True, labels)
        assert found[0]["labels"] == {
            **labels,
            "cause": "stopped",
            "severity": "critical",
            "pod": "vllm-0",
        }
        assert "runbook_url" in found[0]["annotations"]
        moving = _verdict(State.PROGRESSING, time.time(), engine="1")
        rep.report(target, [Transition(State.STALLED, moving)], {"1": moving})
        assert await rep.flush()
        await _eventually(alertmanager, False, labels)
        assert rep.errors == 0 and not rep.firing


async def test_reporter_never_raises_and_counts() -> None:
    port = _free_port()  # nothing listens there
    async with aiohttp.ClientSession() as session:
        rep = AlertmanagerReporter(session, f"http://127.0.0.1:{port}", timeout_s=1)
        stalled = _verdict(State.STALLED, time.time(), cause="no-progress")
        rep.report("t", [Transition(State.SUSPECT, stalled)], {"0": stalled})
        assert await rep.flush() is False
        assert rep.errors == 1 and rep.last_error and "failed" in rep.last_error
        assert rep.due(time.time()), "a failed push must be retried"
        rep.report("t", [object()], {})  # type: ignore[list-item]
        assert rep.errors == 2


def test_resend_schedule_and_cause_change() -> None:
    now = [1000.0]
    rep = AlertmanagerReporter(None, "http://unused", resend_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    v = _verdict(State.STALLED, 1000.0, cause="no-progress")
    rep.report("t", [Transition(State.SUSPECT, v)], {"0": v})
    first = rep.due(now[0])
    assert [a.labels["cause"] for a in first] == ["no-progress"]
    assert first[0].ends_at == utc(1000.0 + 240)
    rep.outbox.clear()
    rep.last_push = now[0]
    assert rep.due(now[0] + 59) == []
    resent = rep.due(now[0] + 60)
    assert len(resent) == 1 and resent[0].ends_at == utc(1060.0 + 240)
    # The cause changes while stalled: the old alert resolves, a new one fires.
    now[0] = 1010.0
    v2 = _verdict(State.STALLED, 1010.0, cause="engine-dead")
    rep.report("t", [Transition(State.STALLED, v2)], {"0": v2})
    sent = rep.due(now[0])
    by_cause = {a.labels["cause"]: a for a in sent}
    assert set(by_cause) == {"no-progress", "engine-dead"}
    assert by_cause["no-progress"].ends_at == utc(1010.0)


def test_changes_queued_during_a_push_are_not_lost() -> None:
    rep = AlertmanagerReporter(None, "http://unused", clock=lambda: 1000.0)  # type: ignore[arg-type]
    stalled = _verdict(State.STALLED, 1000.0, cause="stopped")
    rep.report("t", [Transition(State.SUSPECT, stalled)], {"0": stalled})
    pending = list(rep.outbox)  # what a push in flight carries
    moving = _verdict(State.PROGRESSING, 1001.0)
    rep.report("t", [Transition(State.STALLED, moving)], {"0": moving})  # during the push
    rep.acknowledge(pending)
    (left,) = rep.outbox
    assert left.labels["cause"] == "stopped" and left.ends_at == utc(1000.0)
    assert rep.due(1000.0) == [left]


async def test_every_action_is_an_alert_before_and_after(alertmanager: str) -> None:
    from engine_watchdog.core.model import Outcome, Result

    target = "http://127.0.0.1:8124"
    async with aiohttp.ClientSession() as session:
        rep = AlertmanagerReporter(session, alertmanager)
        rep.on_action(target, "restart", "start", None)
        rep.on_action(
            target, "restart", "end", Outcome(Result.RATE_LIMITED, "3 restarts in 3600 s")
        )
        assert await rep.flush()
        base = {"alertname": "EngineWatchdogAction", "target": target, "action": "restart"}
        before = await _eventually(alertmanager, True, {**base, "phase": "start"})
        after = await _eventually(alertmanager, True, {**base, "phase": "end"})
    assert before[0]["labels"]["severity"] == "warning"
    assert after[0]["labels"]["result"] == "rate_limited"
    assert after[0]["labels"]["severity"] == "critical"
    assert "3 restarts" in after[0]["annotations"]["description"]
