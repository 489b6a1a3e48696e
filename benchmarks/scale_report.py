"""The tables of benchmarks/scale.py: one row per path and load (rows begin with the proxy's
name, the stream count in a column of its own, as docs/performance.md's do), then the guard's
judging rounds, its /metrics scrapes, the freezes and the verdicts.

Every row shows that the engine side and the clients kept up: the direct path's events/s
against what was asked (streams x pace), the upstream's CPU (share of one core, and per event)
and the clients' (per event, and the busiest client process's share of one core).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.streams import Seen, percentile


@dataclass
class Phase:
    """One phase: ``n`` streams straight (``direct``) or through one proxy."""

    path: str
    streams: int
    rate: float
    spread: float
    seconds: float
    seen: Seen
    idle_rss_mb: float = 0.0
    rss_mb: float = 0.0
    upstream_cpu_s: float = 0.0
    proxy_user_s: float = math.nan
    proxy_sys_s: float = math.nan
    scrapes_ms: list[float] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)

    @property
    def key(self) -> tuple[int, float, float]:
        return self.streams, self.rate, self.spread

    @property
    def events_s(self) -> float:
        return self.seen.events / self.seconds

    def per_event_us(self, seconds: float) -> float:
        return seconds / self.seen.events * 1e6 if self.seen.events else math.nan


@dataclass
class Freeze:
    streams: int
    frozen_t: float
    thawed_t: float
    back_s: float
    delays: list[float]
    """Per stream: from its last token to its answer; inf when not answered in the bound."""
    outcomes: dict[str, int]


HEAD = (
    "proxy", "streams", "events/s per stream", "arrival s", "asked events/s", "direct / asked",
    "events/s", "ratio to direct", "added p50 ms", "added p99 ms", "p50 / p99 ms",
    "first event p50 / p99 ms", "CPU µs/event (user + sys)", "RSS MB per 1,000 streams",
    "errors", "upstream: % of a core (µs/event)", "clients: µs/event (busiest process %)",
)  # fmt: skip


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def q(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else math.nan


@dataclass
class Report:
    setup: dict[str, Any] = field(default_factory=dict)
    phases: list[Phase] = field(default_factory=list)
    freezes: list[Freeze] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[tuple[float, ...]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, phase: Phase) -> None:
        self.phases.append(phase)

    def direct(self, phase: Phase) -> Phase | None:
        return next((p for p in self.phases if p.path == "direct" and p.key == phase.key), None)

    def cells(self, p: Phase) -> list[str]:
        d = self.direct(p) or p
        asked = p.streams * p.rate
        lat = [percentile(p.seen.hist, x) for x in (0.5, 0.99)]
        added = ["-", "-"]
        cpu = rss = "-"
        if p is not d:
            base = [percentile(d.seen.hist, x) for x in (0.5, 0.99)]
            added = [f"{(a - b) * 1e3:+.2f}" for a, b in zip(lat, base, strict=True)]
            user, kernel = p.per_event_us(p.proxy_user_s), p.per_event_us(p.proxy_sys_s)
            cpu = f"{user + kernel:.1f} ({user:.1f} + {kernel:.1f})"
            rss = f"{(p.rss_mb - p.idle_rss_mb) / p.streams * 1000:.1f}"
        errors = str(p.seen.errors) + (f" {p.seen.error_kinds}" if p.seen.errors else "")
        up = f"{100 * p.upstream_cpu_s / p.seconds:.0f} ({p.per_event_us(p.upstream_cpu_s):.2f})"
        busiest = 100 * p.seen.busiest_cpu_s / p.seconds
        return [
            p.path, str(p.streams), f"{p.rate:g}", f"{p.spread:g}" if p.spread else "-",
            f"{asked:.0f}", f"{d.events_s / asked:.3f}", f"{p.events_s:.0f}",
            f"{p.events_s / d.events_s:.3f}" if d.events_s else "-", *added,
            f"{ms(lat[0])} / {ms(lat[1])}",
            f"{ms(q(p.seen.first, 0.5))} / {ms(q(p.seen.first, 0.99))}", cpu, rss, errors, up,
            f"{p.per_event_us(p.seen.cpu_s):.2f} ({busiest:.0f})",
        ]  # fmt: skip

    def line(self, p: Phase) -> str:
        return " | ".join(self.cells(p))

    def table(self) -> str:
        rows = sorted(self.phases, key=lambda p: (p.spread > 0, p.streams, p.rate))
        lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        return "\n".join([*lines, *("| " + " | ".join(self.cells(p)) + " |" for p in rows)])

    def add_freeze(
        self, n: int, frozen_t: float, thawed_t: float, back_s: float, seen: Seen
    ) -> None:
        delays: list[float] = []
        outcomes: dict[str, int] = {}
        for last_t, end_t, outcome in seen.frozen:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            answered = outcome == "error-event" and last_t > 0
            delays.append(end_t - max(last_t, 0.0) if answered else math.inf)
        self.freezes.append(Freeze(n, frozen_t, thawed_t, back_s, delays, outcomes))

    def freeze_line(self, i: int) -> str:
        f = self.freezes[i]
        d = f.delays
        answered = sum(math.isfinite(x) for x in d)
        return (
            f"freeze at {f.streams} streams: answered {answered}/{len(d)}, from the last token "
            f"p50 {q(d, 0.5):.2f} s, p95 {q(d, 0.95):.2f} s, max {max(d, default=math.nan):.2f} s;"
            f" {f.outcomes}; requests passed again {f.back_s:.1f} s after the thaw"
        )

    def stalls_outside_freezes(self) -> list[str]:
        spans = [(f.frozen_t, f.thawed_t + f.back_s + 5.0) for f in self.freezes]
        return [
            f"{v['state']}({v.get('cause')}) at {v['read_t']:.1f}"
            for v in self.verdicts
            if str(v["state"]).startswith("stalled")
            and not any(a <= v["read_t"] <= b for a, b in spans)
        ]

    def rounds_in(self, start: float, end: float) -> list[tuple[float, ...]]:
        return [r for r in self.rounds if start <= r[0] <= end]

    def round_rows(self) -> list[str]:
        out = [
            "| when | streams open | rounds | quiet streams (max) | snapshot ms p50 / max "
            "| judge ms p50 / max | round ms p99 / max |",
            "|---|---|---|---|---|---|---|",
        ]
        spans = [
            (
                f"steady, {p.rate:g} events/s{f', arrival {p.spread:g} s' if p.spread else ''}",
                p.window,
            )
            for p in self.phases
            if p.path == "guard"
        ]
        spans += [("frozen", (f.frozen_t, f.thawed_t)) for f in self.freezes]
        for label, (a, b) in spans:
            rs = self.rounds_in(a, b)
            if not rs:
                continue
            snap, judge = [r[1] for r in rs], [r[2] for r in rs]
            total = [x + y for x, y in zip(snap, judge, strict=True)]
            out.append(
                f"| {label} | {max(int(r[3]) for r in rs)} | {len(rs)} | "
                f"{max(int(r[4]) for r in rs)} | {statistics.median(snap):.2f} / {max(snap):.2f}"
                f" | {statistics.median(judge):.2f} / {max(judge):.2f} | "
                f"{q(total, 0.99):.2f} / {max(total):.2f} |"
            )
        return out

    def extras(self) -> str:
        out = ["### The guard's judging rounds (benchmarks/guard_rounds.py)", ""]
        out += self.round_rows()
        out += ["", "### The guard's own /metrics, scraped in the window", ""]
        scrapes = [(p.streams, p.rate, s) for p in self.phases for s in p.scrapes_ms]
        out += [f"- {n} streams at {r:g} events/s: {s:.1f} ms" for n, r, s in scrapes] or ["- none"]
        out += ["", "### Freeze to answer (the upstream frozen under the guard)", ""]
        out += [f"- {self.freeze_line(i)}" for i in range(len(self.freezes))] or ["- none"]
        for n in sorted({f.streams for f in self.freezes}):
            d = [x for f in self.freezes if f.streams == n for x in f.delays]
            worst = [max(f.delays) for f in self.freezes if f.streams == n]
            out.append(
                f"- all at {n} streams: p50 {q(d, 0.5):.2f} s, p95 {q(d, 0.95):.2f} s over "
                f"{len(d)} streams; p95 of each freeze's last answer {q(worst, 0.95):.2f} s"
            )
        false = self.stalls_outside_freezes()
        out += ["", f"False stalls (stalled verdicts outside the freezes): {len(false)} {false}"]
        out += [f"Verdicts: {[(v['state'], v.get('cause')) for v in self.verdicts]}"]
        out += [f"Skipped (time): {', '.join(self.skipped)}"] if self.skipped else []
        out += [f"Failed: {failure}" for failure in self.failed]
        return "\n".join(out)

    def write(self, out: Path) -> None:
        setup = "\n".join(f"- {k}: {v}" for k, v in self.setup.items())
        text = f"## Setup\n{setup}\n\n## Rows\n{self.table()}\n\n{self.extras()}\n"
        (out / "scale.md").write_text(text, encoding="utf-8")
        doc = {
            "setup": self.setup,
            "rows": [dict(zip(HEAD, self.cells(p), strict=True)) for p in self.phases],
            "freezes": [
                f.__dict__ | {"delays": [x if math.isfinite(x) else None for x in f.delays]}
                for f in self.freezes
            ],
            "verdicts": self.verdicts,
            "scrapes_ms": {
                f"{p.streams}x{p.rate:g}": p.scrapes_ms for p in self.phases if p.scrapes_ms
            },
            "skipped": self.skipped,
            "failed": self.failed,
        }
        (out / "scale.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")


def read_rounds(path: Path) -> list[tuple[float, ...]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [tuple(float(x) for x in line.split()) for line in lines if len(line.split()) == 5]
