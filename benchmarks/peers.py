"""What users have today, as rules over the same recorded observations (their sources: SGLang's
watchdog, TensorRT-LLM's HangDetector, PyTorch's NCCL watchdog, vLLM's multiproc executor timeout,
modelsphere/hang-watcher).

- **hang-watcher** (modelsphere/hang-watcher, a Go sidecar) with the defaults its README and
  ConfigMap give: poll /metrics every 15 s; progress = the sum of
  ``vllm:generation_tokens_total`` and ``vllm:prompt_tokens_total``; hung when progress has not
  grown for ``stall_sec`` = 180 s while ``vllm:num_requests_running`` > 0, or when /metrics has
  failed for 180 s after it once answered; a counter going back restarts the clock; nothing is
  judged before the first good scrape. (Its passive path, ``watcher.go`` ``step()``; the optional
  active probe is off in that configuration.)
- **Prometheus rule** ``rate(vllm:generation_tokens_total[1m]) == 0 and
  vllm:num_requests_running > 0`` held ``for: 2m``, scraped and evaluated every 15 s: rate over
  the samples in (T-60 s, T] (at least two, counter resets corrected), one alert per engine
  label set, reset whenever the expression is empty; a failed scrape marks the series stale,
  which empties the expression.
- **Forward-progress timeout** (SGLang's watchdog, TensorRT-LLM's hang detector): the forward
  counter (``vllm:iteration_tokens_total_count``, else the generation tokens) static for 300 s
  while a batch runs. In-process: it sees every step, so it is judged on every recorded scrape;
  a stopped or dead engine process stops it too (the benchmark says so per scenario).
- **vLLM /health**: stalled when /health answers anything but 200 (or nothing), after it once
  answered 200.

A peer sees the world through the trace: at time T it sees the latest observation at or before
T. ``until`` may reach past the end of the trace: the last observation is then held (a hung
engine serves the same frozen values for as long as it hangs: the seed's did for 55 min), so a
rule slower than the recording still gets its detection time, marked as projected. Where a
scenario lifts its hang (SIGCONT, the fault cleared), the trace is cut there first (an
observation answered after that point is cut too): the projection answers "when would this
rule have caught the hang had it gone on".
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from engine_watchdog.core.exposition import parse_samples
from engine_watchdog.engines.profile import EngineProfile

GENERATION = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
RUNNING = "vllm:num_requests_running"
ITERATIONS = "vllm:iteration_tokens_total_count"
PEER_SERIES = frozenset({GENERATION, PROMPT, RUNNING, ITERATIONS})


@dataclass(frozen=True)
class Point:
    """One recorded /metrics scrape, reduced to what the peers read (per engine label)."""

    t: float
    ok: bool
    """HTTP 200 (with or without vLLM series); False for timeouts, refusals, errors."""
    series: dict[str, dict[str, float]] = field(default_factory=dict)
    """series name -> engine label -> value (summed over the other labels)."""

    def total(self, name: str) -> float | None:
        values = self.series.get(name)
        return sum(values.values()) if values else None

    def engines(self) -> set[str]:
        return set(self.series.get(RUNNING, {}))


@dataclass(frozen=True)
class Timeline:
    """A trace as the peers see it: scrapes and /health answers, in time order."""

    scrapes: list[Point]
    health: list[tuple[float, int | None]]
    end_t: float

    @property
    def start_t(self) -> float:
        return self.scrapes[0].t if self.scrapes else self.end_t

    def at(self, t: float) -> Point | None:
        """The latest scrape at or before ``t`` (held past the end of the trace)."""
        i = bisect.bisect_right([p.t for p in self.scrapes], t)
        return self.scrapes[i - 1] if i else None


def timeline(lines: Iterable[str], profile: EngineProfile, before: float | None = None) -> Timeline:
    """Scrapes and /health answers of a trace (those before ``before``, if given); broken
    lines and other kinds are skipped."""
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
            t = float(rec["t"])
        except (ValueError, KeyError, TypeError):
            continue
        if before is None or t + _elapsed(rec) < before:
            records.append((t, rec))
    records.sort(key=lambda r: r[0])  # each peer polls in time order
    scrapes, health = [], []
    for t, rec in records:
        if rec.get("kind") == "scrape":
            scrapes.append(_point(t, rec, profile))
        elif rec.get("kind") == "health":
            health.append((t, rec.get("status")))
    return Timeline(scrapes, health, records[-1][0] if records else 0.0)


def _elapsed(rec: dict[str, object]) -> float:
    """How long the observation took: a scrape is stamped when it started, answered later."""
    elapsed = rec.get("elapsed_s")
    return float(elapsed) if isinstance(elapsed, int | float) else 0.0


def _point(t: float, rec: dict[str, object], profile: EngineProfile) -> Point:
    body = rec.get("body")
    if rec.get("error") or rec.get("status") != 200 or not isinstance(body, str):
        return Point(t, ok=False)
    series: dict[str, dict[str, float]] = {}
    for s in parse_samples(body, PEER_SERIES):
        engine = s.labels.get(profile.engine_label, "0")
        per_engine = series.setdefault(s.name, {})
        per_engine[engine] = per_engine.get(engine, 0.0) + s.value
    return Point(t, ok=True, series=series)


def grid(start: float, until: float, step: float) -> Iterator[float]:
    t = start
    while t <= until:
        yield t
        t += step


# -- the rules -----------------------------------------------------------------------------------


def hang_watcher(
    tl: Timeline, until: float, poll_s: float = 15.0, stall_s: float = 180.0
) -> float | None:
    """When hang-watcher's /healthz first turns 503, or None."""
    started, baseline, last_tp, last_grow = False, False, 0.0, 0.0
    first_fail: float | None = None
    for t in grid(tl.start_t, until, poll_s):
        p = tl.at(t)
        if p is None or not p.ok:
            if started:
                first_fail = t if first_fail is None else first_fail
                if t - first_fail >= stall_s:
                    return t
            continue
        started, first_fail = True, None
        parts = [v for v in (p.total(GENERATION), p.total(PROMPT)) if v is not None]
        if not parts:
            continue  # no progress counter: hang-watcher cannot judge and says healthy
        tp = sum(parts)
        if not baseline or tp != last_tp:
            baseline, last_tp, last_grow = True, tp, t  # growth, or a reset: the clock restarts
            continue
        if t - last_grow >= stall_s and (p.total(RUNNING) or 0) > 0:
            return t
    return None


def prometheus_rule(
    tl: Timeline,
    until: float,
    interval_s: float = 15.0,
    range_s: float = 60.0,
    for_s: float = 120.0,
) -> float | None:
    """When the alert first fires (pending for ``for_s``), or None."""
    history: dict[str, list[tuple[float, float]]] = {}
    active_at: dict[str, float] = {}
    for t in grid(tl.start_t, until, interval_s):
        p = tl.at(t)
        if p is None or not p.ok:
            active_at.clear()  # stale series: the expression is empty, pending alerts reset
            continue
        for engine, value in p.series.get(GENERATION, {}).items():
            history.setdefault(engine, []).append((t, value))
        for engine in p.engines() | set(active_at):
            if _rule_holds(p, history.get(engine, []), engine, t, range_s):
                since = active_at.setdefault(engine, t)
                if t - since >= for_s:
                    return t
            else:
                active_at.pop(engine, None)
    return None


def _rule_holds(
    p: Point, samples: list[tuple[float, float]], engine: str, t: float, range_s: float
) -> bool:
    window = [v for ts, v in samples if t - range_s < ts <= t]
    if len(window) < 2 or engine not in p.series.get(GENERATION, {}):
        return False
    increase = sum(b if b < a else b - a for a, b in itertools.pairwise(window))
    return increase == 0 and p.series.get(RUNNING, {}).get(engine, 0.0) > 0


def forward_timeout(tl: Timeline, until: float, timeout_s: float = 300.0) -> float | None:
    """When an in-process forward-progress watchdog fires, or None."""
    last: dict[str, float] = {}
    since: dict[str, float] = {}
    points = [p for p in tl.scrapes if p.ok]
    if points and tl.scrapes[-1].ok and until > tl.end_t:
        # Held: the same frozen values. Not after failed scrapes: the engine's own watchdog
        # saw what the trace does not (an API freeze says nothing about the engine core).
        points.append(Point(until, True, points[-1].series))
    for p in points:
        counter = ITERATIONS if ITERATIONS in p.series else GENERATION
        for engine, value in p.series.get(counter, {}).items():
            busy = p.series.get(RUNNING, {}).get(engine, 0.0) > 0
            if not busy or last.get(engine) != value:
                last[engine], since[engine] = value, p.t
            elif p.t - since[engine] >= timeout_s:
                return since[engine] + timeout_s
    return None


def health_rule(tl: Timeline, until: float) -> float | None:
    """The first /health answer other than 200 after a 200, or None."""
    seen_ok = False
    for t, status in tl.health:
        if t > until:
            break
        if status == 200:
            seen_ok = True
        elif seen_ok:
            return t
    return None


Rule = Callable[[Timeline, float], float | None]
PEERS: dict[str, Rule] = {
    "hang-watcher": hang_watcher,
    "prometheus-rule": prometheus_rule,
    "forward-300s": forward_timeout,
    "vllm-health": health_rule,
}
"""Name -> rule(timeline, until) -> detection time or None."""
