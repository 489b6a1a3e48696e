"""docs/guard.md's "Before the first token" names the numbers that bound a client's wait on an
engine that froze while idle: they are the code's, and change with it."""

from __future__ import annotations

from pathlib import Path

from engine_watchdog.core.settings import DetectorSettings, ProbeSettings
from engine_watchdog.core.wire import AWAITING_PROBE_S
from engine_watchdog.runtime.act.supervisor import ANSWER_WAIT_S

GUARD_MD = Path(__file__).resolve().parents[2] / "docs" / "guard.md"


def _section(title: str) -> str:
    text = GUARD_MD.read_text()
    start = text.index(f"## {title}")
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def _s(value: float) -> str:
    return f"{value:g} s"


def test_the_bound_of_a_wait_before_the_first_token_is_the_code_s() -> None:
    doc = _section("Before the first token")
    detector, probe = DetectorSettings(), ProbeSettings()
    assert f"{_s(AWAITING_PROBE_S)} (`AWAITING_PROBE_S`" in doc
    assert f"has waited {_s(AWAITING_PROBE_S)}" in doc
    assert f"(`--canary-timeout`, {_s(probe.canary_timeout_s)})" in doc
    assert f"`--stalled-canary-interval` ({_s(detector.stalled_canary_seconds)})" in doc
    assert f"`--idle-canary-interval`, {_s(detector.idle_canary_seconds)}" in doc
    assert f"one probe round ({_s(probe.interval_s)})" in doc
    assert f"hold-back (at most {_s(ANSWER_WAIT_S)})" in doc
