"""Properties of the detector and of replay, over generated observation streams (hypothesis).

- No stall verdict while a progress signal moved within the window.
- Replay is deterministic, and the replay of a trace gives the verdicts the live stream gave.
- Junk in a trace is skipped with a warning, never a crash.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_watchdog.core.detector import Detector, DetectorSettings
from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    EngineSample,
    GpuInfo,
    GpuObs,
    HealthObs,
    Observation,
    ProcInfo,
    ProcsObs,
    ScrapeObs,
    State,
    Transition,
)
from engine_watchdog.core.progress import FLAP_WINDOW_S
from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from engine_watchdog.runtime.trace.format import encode, encode_scrape
from engine_watchdog.runtime.trace.replay import replay, replay_document

T0 = 1_796_000_000.0
DEFAULTS = DetectorSettings()
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "iterations": "vllm:iteration_tokens_total_count",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "finished_requests": "vllm:request_success_total",
}
GPU_CLASSES = {
    "computing": GpuInfo(0, 100.0, 650.0, 95.0, 92.0, 17.0, (200,)),
    "spinning": GpuInfo(0, 100.0, 137.0, 100.0, 0.0, 0.0, (200,)),
    "idle": GpuInfo(0, 0.0, 80.0, 0.0, 0.0, 0.0, (200,)),
    "unknown": GpuInfo(0, 60.0, 200.0, pids=(200,)),
}

# -- generated engines and streams -----------------------------------------------------------


@dataclass
class Rank:
    """One scripted data-parallel rank: what its next scrape says."""

    engine: str
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    running: int = 0
    waiting: int = 0
    kv: float = 0.0
    asleep: bool = False
    restarted_t: float = -math.inf
    before_restart: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lab = f'engine="{self.engine}",model_name="m"'
        awake = 0.0 if self.asleep else 1.0
        out = [
            f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
            f"vllm:num_requests_waiting{{{lab}}} {float(self.waiting)}",
            f"vllm:kv_cache_usage_perc{{{lab}}} {self.kv}",
            f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {awake}',
        ]
        return out + [f"{COUNTERS[k]}{{{lab}}} {v}" for k, v in self.counters.items()]


@st.composite
def rank_step(draw: st.DrawFn, rank: Rank, t: float) -> None:
    """Advance one rank between two scrapes: counters move (or not, or reset), gauges change.
    A restart comes at most once per FLAP_WINDOW_S (an engine start loads a model), and the new
    engine's counters never land on exactly the old one's values: counters that do either are
    flapping between two sources, which the detector reads differently (test_odd_values.py)."""
    for key in COUNTERS:
        if draw(st.integers(0, 3)) == 0:
            rank.counters[key] += draw(st.integers(1, 50))
            if rank.counters[key] == rank.before_restart.get(key):
                rank.counters[key] += 1  # exactly the old engine's value again reads as a flap
    if draw(st.integers(0, 40)) == 0 and t - rank.restarted_t >= FLAP_WINDOW_S:
        rank.before_restart = dict(rank.counters)
        rank.counters = dict.fromkeys(COUNTERS, 0.0)  # the engine restarted
        rank.restarted_t = t
    if draw(st.integers(0, 3)) == 0:
        rank.kv = round(draw(st.floats(0.0, 1.0)), 3)
    rank.running = draw(st.sampled_from([0, 0, 1, 2, 4]))
    rank.waiting = draw(st.sampled_from([0, 0, 0, 1, 3]))
    rank.asleep = draw(st.integers(0, 30)) == 0


Item = HealthObs | CanaryObs | GpuObs | ProcsObs | RawScrape
"""What a watcher records: every observation, scrapes still raw."""


@dataclass
class Stream:
    """A live observation stream and the raw scrapes behind its ScrapeObs."""

    items: list[Item]

    def live(self) -> list[Observation]:
        """What a watcher feeds the detector (scrapes parsed)."""
        return [parse_scrape(o, VLLM) if isinstance(o, RawScrape) else o for o in self.items]

    def lines(self) -> list[str]:
        """The trace a watcher writes."""
        recs = [encode_scrape(o) if isinstance(o, RawScrape) else encode(o) for o in self.items]
        return [json.dumps(r, separators=(",", ":")) for r in recs]


def procs_obs(t: float, state: str, cpu: float) -> ProcsObs:
    return ProcsObs(
        t,
        (
            ProcInfo(100, 1, "api-server", "python -m vllm", "sleeping", 1.0),
            ProcInfo(200, 100, "engine-core", "VLLM::EngineCore", state, cpu),
        ),
    )


@st.composite
def other_obs(
    draw: st.DrawFn, t: float, cpu: float, failed_canaries: bool
) -> HealthObs | CanaryObs | GpuObs | ProcsObs:
    kind = draw(st.sampled_from(["health", "procs", "canary", "gpu"]))
    if kind == "health":
        return HealthObs(t, 200) if draw(st.booleans()) else HealthObs(t, None, Cause.TIMEOUT)
    if kind == "procs":
        return procs_obs(t, draw(st.sampled_from(["running", "sleeping", "stopped"])), cpu)
    if kind == "gpu":
        return GpuObs(t, (GPU_CLASSES[draw(st.sampled_from(sorted(GPU_CLASSES)))],))
    if failed_canaries and draw(st.booleans()):
        error, took = draw(st.sampled_from([("timeout", 8.0), ("http-500", 0.05)]))
        return CanaryObs(t, ok=False, error=error, sent_t=t - took)
    latency = draw(st.sampled_from([0.02, 0.5, 3.0]))
    return CanaryObs(t, ok=True, latency_s=latency, sent_t=t - latency)


@st.composite
def streams(draw: st.DrawFn, failed_canaries: bool = True, max_size: int = 150) -> Stream:
    ranks = [Rank(str(i)) for i in range(draw(st.integers(1, 2)))]
    t, cpu = T0, 0.0
    items: list[Item] = []
    for _ in range(draw(st.integers(1, max_size))):
        t = round(t + draw(st.sampled_from([0.1, 0.5, 1.0, 1.0, 1.0, 2.0, 5.0])), 3)
        cpu += draw(st.sampled_from([0.0, 0.01, 0.5, 1.0]))
        roll = draw(st.integers(0, 9))
        if roll < 5:
            for rank in ranks:
                draw(rank_step(rank, t))
            body = "\n".join(line for r in ranks for line in r.lines()) + "\n"
            items.append(RawScrape(t, status=200, body=body, elapsed_s=0.003))
        elif roll == 5:
            error = draw(st.sampled_from([Cause.TIMEOUT, Cause.REFUSED]))
            items.append(RawScrape(t, error=error))
        else:
            items.append(draw(other_obs(t, round(cpu, 2), failed_canaries)))
    return Stream(items)


# -- 1. no stall while progress moved ----------------------------------------------------------


def moved(before: EngineSample | None, now: EngineSample) -> bool:
    """Did any progress signal move (either way: a reset is a sign of life too)?"""
    if before is None:
        return False
    if now.kv_usage != before.kv_usage:
        return True
    return any(before.progress.get(k, v) != v for k, v in now.progress.items())


@given(streams(max_size=80))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_stall_verdict_while_progress_moved_within_the_window(stream: Stream) -> None:
    """A stalled verdict at t means no progress signal of that rank moved in the last
    fast-stall seconds (the shortest window, used with strong evidence). wedged-idle rests on a
    failed canary, not on flat counters: see the example test below."""
    detector = Detector(DEFAULTS)
    last: dict[str, EngineSample] = {}
    moved_at: dict[str, float] = {}
    for obs in stream.live():
        if isinstance(obs, ScrapeObs):
            for sample in obs.engines:
                if moved(last.get(sample.engine), sample):
                    moved_at[sample.engine] = obs.t
                last[sample.engine] = sample
        detector.feed(obs)
        for engine, verdict in detector.verdicts.items():
            if verdict.state is State.STALLED and verdict.cause != "wedged-idle":
                quiet = obs.t - moved_at.get(engine, -math.inf)
                assert quiet >= DEFAULTS.fast_stall_seconds, (quiet, verdict)


def test_a_canary_sent_before_the_last_progress_does_not_make_wedged_idle() -> None:
    rank = Rank("0", running=2)
    stream: list[Observation] = []
    for i in range(16):
        if i < 5 or i == 8:
            rank.counters["generation_tokens"] += 10  # t=8: a short request came and went
        rank.running = 2 if i < 5 else 0
        body = "\n".join(rank.lines()) + "\n"
        stream.append(parse_scrape(RawScrape(T0 + i, 200, body, 0.003), VLLM))
        if i == 14:  # the idle canary sent at t=6 timed out at t=14
            stream.append(CanaryObs(T0 + 14.5, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 6.0))
    stalls = [c.new for c in feed_all(stream) if c.new.state is State.STALLED]
    assert stalls == []


def test_tokens_flowing_is_never_engine_dead_because_of_one_process_sample() -> None:
    """A process sample that misses the engine core (a discovery race, a PID namespace change)
    while the tokens keep flowing must not make a stall: the metrics show life."""
    detector = Detector(DEFAULTS)
    rank = Rank("0", running=2)
    stalls = []
    for i in range(40):
        t = T0 + i
        rank.counters["generation_tokens"] += 20
        body = "\n".join(rank.lines()) + "\n"
        stream: list[Observation] = [parse_scrape(RawScrape(t, 200, body, 0.003), VLLM)]
        if i == 25:
            stream.append(ProcsObs(t + 0.02, (ProcInfo(100, 1, "api-server", "x", "sleeping", 1),)))
        elif i % 2 == 0:
            stream.append(procs_obs(t + 0.02, "running", float(i)))
        for obs in stream:
            stalls += [c for c in detector.feed(obs) if c.new.state is State.STALLED]
    assert stalls == []


# -- 2. replay is deterministic ----------------------------------------------------------------


def verdicts_of(changes: Iterable[Transition]) -> list[tuple[Any, ...]]:
    return [(c.old, c.new) for c in changes]


def feed_all(observations: Sequence[Observation]) -> list[Transition]:
    detector = Detector(DEFAULTS)
    return [c for obs in observations for c in detector.feed(obs)]


@given(streams())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_replay_is_deterministic(stream: Stream) -> None:
    lines = stream.lines()
    first = replay(lines, VLLM, DEFAULTS)
    second = replay(list(lines), VLLM, DEFAULTS)
    assert verdicts_of(first) == verdicts_of(second)
    assert json.dumps(replay_document(first)) == json.dumps(replay_document(second))


@given(streams(failed_canaries=False))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_replay_of_a_trace_gives_the_live_verdicts(stream: Stream) -> None:
    """Live and replay run the same detector over the same observations (failed canaries are
    left out here: their send time does not survive the trace, see test_trace.py)."""
    assert verdicts_of(replay(stream.lines(), VLLM, DEFAULTS)) == verdicts_of(
        feed_all(stream.live())
    )


def test_a_failed_canary_gives_the_same_verdict_live_and_in_replay() -> None:
    """A timeout canary sent before the engine went quiet says nothing about the quiet spell
    live; in replay it looks sent 8 s later, inside the spell, and calls a stall early."""
    rank = Rank("0", running=2)
    stream: list[Item] = []
    for i in range(20):
        if i < 6:
            rank.counters["generation_tokens"] += 10  # moving until t=5, flat afterwards
        stream.append(RawScrape(T0 + i, 200, "\n".join(rank.lines()) + "\n", 0.003))
        if i == 11:  # sent at t=3.5 while tokens still moved, timed out at t=11.5
            stream.append(CanaryObs(T0 + 11.5, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 3.5))
    s = Stream(stream)
    assert verdicts_of(replay(s.lines(), VLLM, DEFAULTS)) == verdicts_of(feed_all(s.live()))


def test_replay_cli_json_is_deterministic_and_matches_the_api() -> None:
    trace = TRACES / "gpu-spin-synthetic.jsonl"
    argv = [sys.executable, "-m", "engine_watchdog", "replay", str(trace), "--json"]
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [1, 1], runs[0].stderr  # 1: a stall was found
    assert runs[0].stdout == runs[1].stdout
    with trace.open(encoding="utf-8") as lines:
        expected = replay_document(replay(lines, VLLM, DEFAULTS))
    assert json.loads(runs[0].stdout) == json.loads(json.dumps(expected))


# -- 3. junk in a trace --------------------------------------------------------------------------

NOT_A_RECORD = st.one_of(
    st.text(max_size=40).filter(lambda s: not s.strip().startswith(("{", "["))),
    st.sampled_from(["[1, 2]", "42", "null", "true", '"text"', "{", '{"t": }']),
    st.builds(
        lambda kind, t: json.dumps({"t": t, "kind": kind}),
        st.sampled_from(["scrape", "health", "canary", "gpu", "procs"]),
        st.sampled_from(["soon", None, [1], {"a": 1}]),
    ),
    st.builds(
        lambda kind: json.dumps({"kind": kind, "status": 200}),
        st.sampled_from(["scrape", "health", "gpu"]),
    ),
)
"""Lines that cannot be an observation: not JSON, not an object, no usable time."""


@given(streams(max_size=60), st.lists(st.tuples(st.integers(0, 60), NOT_A_RECORD), max_size=8))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_junk_lines_are_skipped_with_a_warning(stream: Stream, junk: list[tuple[int, str]]) -> None:
    clean = stream.lines()
    dirty = list(clean)
    for position, line in sorted(junk, reverse=True):
        dirty.insert(min(position, len(dirty)), line)
    handler = _Collect()
    logger = logging.getLogger("engine_watchdog.runtime.trace.format")
    logger.addHandler(handler)
    try:
        got = replay(dirty, VLLM, DEFAULTS)
    finally:
        logger.removeHandler(handler)
    assert verdicts_of(got) == verdicts_of(replay(clean, VLLM, DEFAULTS))
    blank = sum(1 for _, line in junk if not line.strip())
    assert len(handler.messages) == len(junk) - blank
    assert all("skipped" in m for m in handler.messages)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def busy_trace() -> Stream:
    """Busy for 5 s, then flat: the detector evaluates canaries, GPUs and processes in it."""
    rank = Rank("0", running=2)
    items: list[Item] = []
    for i in range(30):
        if i < 6:
            rank.counters["generation_tokens"] += 10
        items.append(RawScrape(T0 + i, 200, "\n".join(rank.lines()) + "\n", 0.003))
    return Stream(items)


TYPE_JUNK: dict[str, dict[str, Any]] = {
    "gpu-util-text": {"kind": "gpu", "gpus": [{"index": 0, "util_pct": "high", "pids": [1]}]},
    "gpu-pids-text": {"kind": "gpu", "gpus": [{"index": 0, "util_pct": 50, "pids": "12"}]},
    "gpu-entry-not-object": {"kind": "gpu", "gpus": ["GPU 0"]},
    "procs-entry-not-object": {"kind": "procs", "procs": [12]},
    "procs-state-number": {
        "kind": "procs",
        "procs": [{"pid": 5, "role": "engine-core", "state": 7, "cpu_s": 1}],
    },
    "canary-latency-text": {"kind": "canary", "ok": True, "latency_s": "fast"},
    "canary-error-number": {"kind": "canary", "ok": False, "error": 500},
    "health-status-text": {"kind": "health", "status": "OK"},
    "scrape-body-number": {"kind": "scrape", "status": 200, "body": 42},
    "scrape-status-text": {"kind": "scrape", "status": "200", "body": "x 1\n"},
}
"""Records of a known kind whose fields have the wrong type."""


def type_junk_cases() -> list[Any]:
    return sorted(TYPE_JUNK)


@pytest.mark.parametrize("name", type_junk_cases())
def test_a_record_with_a_field_of_the_wrong_type_never_crashes_replay(name: str) -> None:
    lines = busy_trace().lines()
    junk = json.dumps({"v": 1, "t": T0 + 12.5, **TYPE_JUNK[name]})
    lines.insert(13, junk)
    lines.insert(26, junk.replace(f"{T0 + 12.5}", f"{T0 + 25.5}"))
    changes = replay(lines, VLLM, DEFAULTS)  # must not raise
    assert all(math.isfinite(c.new.t) for c in changes)


def test_replay_document_is_json() -> None:
    doc = replay_document(replay(busy_trace().lines(), VLLM, DEFAULTS))
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
