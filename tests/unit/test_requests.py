"""The request judge (core/requests.py) and the wire's stall rule (core/wire.py): pure, fed
scripted guard observations in time order, as the watcher feeds them live and replay does."""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine_watchdog.core.model import (
    EngineSample,
    GuardObs,
    Observation,
    ProcInfo,
    ProcsObs,
    QuietStream,
    ScrapeObs,
)
from engine_watchdog.core.requests import BURST_COUNT, RequestJudge
from engine_watchdog.core.wire import GAP_BOUNDS, GapWindow, gap_bucket
from engine_watchdog.engines import VLLM
from engine_watchdog.runtime.trace.format import decode, encode
from tests.tools.detector_feed import T0, run

FLOOR = 10.0


def gaps(**per_bucket: int) -> tuple[int, ...]:
    """Gap counts by bucket bound name, e.g. gaps(b0_05=100)."""
    counts = [0] * (len(GAP_BOUNDS) + 1)
    for name, n in per_bucket.items():
        counts[gap_bucket(float(name[1:].replace("_", ".")))] += n
    return tuple(counts)


def quiet(
    rid: str, last: float | None, waiting: float | None = -1.0, events: int = 5
) -> QuietStream:
    """A stream started at T0 whose last event was at T0 + last; by default the guard has
    waited on the engine since that event."""
    last_t = None if last is None else T0 + last
    since = (last_t or T0) if waiting == -1.0 else (None if waiting is None else T0 + waiting)
    return QuietStream(rid, T0, None if last is None else T0, last_t, events, since)


def obs(
    t: float, *streams: QuietStream, newest: float | None = None, decoding: int = 4
) -> GuardObs:
    """The wire at T0 + t: the others' newest event at T0 + newest (default: just now)."""
    newest_t = T0 + (t if newest is None else newest)
    return GuardObs(T0 + t, decoding + 1, decoding, 25, 0, newest_t, gaps(b0_05=100), streams)


def test_a_stream_silent_while_the_others_move_is_stuck_once() -> None:
    judge = RequestJudge()
    assert judge.judge(obs(9.0, quiet("a", 0.0)), FLOOR) == []
    found = judge.judge(obs(10.5, quiet("a", 0.0)), FLOOR)
    assert [(f.request_id, f.silent_s, f.threshold_s) for f in found] == [("a", 10.5, FLOOR)]
    assert "other streams got events" in found[0].evidence
    assert judge.judge(obs(11.5, quiet("a", 0.0)), FLOOR) == []  # named once


def test_the_legitimately_quiet_are_never_stuck() -> None:
    judge = RequestJudge()
    cases = [
        quiet("queued", None),  # no first event yet: queued, or a long prefill
        quiet("slow-reader", 0.0, waiting=None),  # the guard waits on its client
        quiet("just-written", 0.0, waiting=25.0),  # its client held it until a second ago
    ]
    for t in (15.0, 30.0):
        assert judge.judge(obs(t, *cases), FLOOR) == []


def test_when_every_stream_stopped_together_it_is_the_engine_s_matter() -> None:
    judge = RequestJudge()
    # The batch froze at 3.0; their last events microseconds apart.
    frozen = [quiet(f"s{i}", 3.0 + i * 1e-4) for i in range(4)]
    for t in (10.0, 15.0, 30.0):
        assert judge.judge(obs(t, *frozen, newest=3.0004), FLOOR) == []
    # ... and the others that moved, but not lately (an engine that stopped since).
    assert judge.judge(obs(40.0, quiet("a", 3.0), newest=30.0), FLOOR) == []


def test_after_an_engine_wide_pause_the_next_stream_relayed_is_not_stuck() -> None:
    """Every stream paused at 3.0 for 12 s (over the threshold); at 15.0 the first one is
    relayed, the next a few microseconds behind it in the same step. A look between the two
    named the second stuck. Still silent once the others moved half the threshold, it is."""
    judge = RequestJudge()
    for t in range(4, 15):  # the probe rounds of the pause: the whole wire silent
        assert judge.judge(obs(float(t), quiet("b", 3.0), newest=3.0), FLOOR) == []
    assert judge.judge(obs(15.001, quiet("b", 3.0), newest=15.0), FLOOR) == []
    assert judge.judge(obs(18.0, quiet("b", 3.0)), FLOOR) == []
    found = judge.judge(obs(19.5, quiet("b", 3.0)), FLOOR)
    assert [f.request_id for f in found] == ["b"]


def test_a_preempted_stream_waits_for_its_recompute() -> None:
    judge = RequestJudge()

    def scrape(t: float, waiting: float, preemptions: float) -> ScrapeObs:
        sample = EngineSample("0", 3, waiting, 0.9, False, {"preemptions": preemptions})
        return ScrapeObs(T0 + t, (sample,), status=200)

    judge.on_scrape(scrape(0.0, 0, 0))
    judge.on_scrape(scrape(2.0, 2, 1))  # preempted just after its last event at 1.0
    assert judge.judge(obs(20.0, quiet("a", 1.0)), FLOOR) == []
    judge.on_scrape(scrape(21.0, 0, 1))  # nothing waits any more: it should have run again
    assert [f.request_id for f in judge.judge(obs(22.0, quiet("a", 1.0)), FLOOR)] == ["a"]


def test_far_beyond_follows_the_engine_s_pace() -> None:
    """A slow engine (a gap of up to 2.5 s between events) is ten times that, not the floor."""
    window = GapWindow()
    window.add(T0, gaps(b0_05=1000))
    assert window.threshold(FLOOR) == FLOOR
    window.add(T0 + 1, gaps(b2_5=200))
    assert window.threshold(FLOOR) == 25.0
    window.add(T0 + 100, ())  # a minute later the old gaps are gone: the floor again
    assert window.threshold(FLOOR) == FLOOR


def test_several_stuck_requests_make_a_burst() -> None:
    judge = RequestJudge()
    found = [
        f
        for i in range(BURST_COUNT)
        for f in judge.judge(obs(20.0 + i, quiet(f"r{i}", 0.0)), FLOOR)
    ]
    assert [f.burst for f in found] == [False] * (BURST_COUNT - 1) + [True]


def test_guard_records_round_trip_through_a_trace() -> None:
    o = obs(12.0, quiet("a", 1.0), quiet("b", 2.0, waiting=None), quiet("c", None))
    rec = json.loads(json.dumps(encode(o)))
    assert rec["kind"] == "guard"
    assert decode(rec, VLLM) == o


# -- the detector with the guard's observations ---------------------------------------------


def procs(t: float, state: str = "sleeping", cpu_s: float = 1.0) -> ProcsObs:
    return ProcsObs(T0 + t, (ProcInfo(11, 10, "engine-core", "VLLM::EngineCore", state, cpu_s),))


def freeze_at(
    freeze: float,
    seconds: int,
    state: str,
    cpu_per_s: float,
    pace: tuple[int, ...] = gaps(b0_05=40),
) -> list[Observation]:
    """Streaming load whose events stop at ``freeze``: scrapes, processes, guard rounds, each
    round's gaps ``pace``."""
    out: list[Observation] = []
    tokens = 0.0
    for t in range(seconds):
        moving = t < freeze
        tokens += 40 if moving else 0
        sample = EngineSample("0", 4, 0, 0.3, False, {"generation_tokens": tokens})
        out.append(ScrapeObs(T0 + t, (sample,), status=200))
        out.append(procs(t + 0.1, "running" if moving else state, 1.0 + cpu_per_s * t))
        last = min(t, freeze)
        out.append(GuardObs(T0 + t + 0.2, 4, 4, 40 if moving else 0, 0, T0 + last, pace))
    return out


SLOW_PACE = gaps(b0_1=96, b1_0=2)
"""2% of the gaps between 0.5 and 1 s: a p99 of 1 s, so 10 x p99 is 10 s (a real vLLM on 2 CPU
cores under load: new requests' prefills hold a step)."""


def first_stall(seen: Sequence[tuple[float, str, str | None]]) -> tuple[float, str | None]:
    stalls = [(t, c) for t, s, c in seen if s == "stalled"]
    assert stalls, seen
    return stalls[0]


def test_a_frozen_engine_under_streaming_load_is_stalled_within_6_s_of_its_last_event() -> None:
    for state, cpu in (("stopped", 0.0), ("sleeping", 0.001)):
        _, seen = run(freeze_at(20.0, 40, state, cpu), startup_grace_seconds=0)
        stalls = [(t, c) for t, s, c in seen if s == "stalled"]
        assert stalls, seen
        t, cause = stalls[0]
        assert t - 20.0 <= 6.0 and cause in ("stopped", "host-deadlock"), seen
        after = [s for t2, s, _ in seen if t2 > t]
        assert "suspect" not in after and "progressing" not in after, seen  # no flapping


def test_a_stopped_engine_is_stalled_at_the_floor_whatever_its_pace() -> None:
    """Stopped (state T) since the last event: no step can come, however slow the engine's
    pace was; an idle one may be in a slow step still: 10 x its p99 gap."""
    t, cause = first_stall(
        run(freeze_at(20.0, 45, "stopped", 0.0, SLOW_PACE), startup_grace_seconds=0)[1]
    )
    assert (cause, t - 20.0 <= 6.0) == ("stopped", True), (t, cause)
    t, cause = first_stall(
        run(freeze_at(20.0, 45, "sleeping", 0.001, SLOW_PACE), startup_grace_seconds=0)[1]
    )
    assert cause == "host-deadlock" and t - 20.0 >= 10.0, (t, cause)


def test_the_wire_alone_never_calls_a_busy_engine_stalled_early() -> None:
    """A long step (the engine's process computing) is silent on the wire too: only the usual
    --stall-seconds, never the wire's window, can call it."""
    _, seen = run(freeze_at(20.0, 45, "running", 0.9), startup_grace_seconds=0)
    stalls = [t for t, s, _ in seen if s == "stalled"]
    assert not stalls or stalls[0] - 20.0 >= 10.0, seen


def test_events_on_the_wire_are_progress_without_the_metrics_or_a_canary() -> None:
    """Frozen counters (a stats logger that stopped, say) with work present would be a stall
    after --stall-seconds; events on the wire say the engine serves."""
    out: list[Observation] = []
    for t in range(60):
        sample = EngineSample("0", 4, 0, 0.3, False, {"generation_tokens": 100.0})
        out.append(ScrapeObs(T0 + t, (sample,), status=200))
        out.append(procs(t + 0.1, "running", 1.0 + 0.5 * t))
        out.append(GuardObs(T0 + t + 0.2, 4, 4, 40, 0, T0 + t + 0.15, gaps(b0_05=40)))
    _, seen = run(out, startup_grace_seconds=0)
    assert [s for _, s, _ in seen if s in ("stalled", "suspect")] == [], seen
    _, without = run([o for o in out if not isinstance(o, GuardObs)], startup_grace_seconds=0)
    assert "stalled" in [s for _, s, _ in without], without  # the same engine, no guard
