"""Running, waiting and the token rate over the bundle's timeline (``timeline.jsonl``).

The watcher records each /metrics scrape raw (``kind: scrape``, the exposition text in ``body``,
docs/traces.md), so the numbers are read back here from the text: the series names are the
engines' own (vLLM: vllm/v1/metrics/loggers.py; SGLang: the profile in engines/sglang.py).
Series of several label sets (data-parallel ranks) are summed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SERIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # engine: (running, waiting, token counters in order of preference)
    "vllm": (
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:generation_tokens_total",),
    ),
    "sglang": (
        ("sglang:num_running_reqs",),
        ("sglang:num_queue_reqs",),
        ("sglang:realtime_tokens_total", "sglang:generation_tokens_total"),
    ),
}
MAX_BODY = 4 << 20


@dataclass(frozen=True)
class Point:
    t: float
    running: float | None
    waiting: float | None
    tokens: float | None
    """The token counter (cumulative)."""


@dataclass(frozen=True)
class Row:
    t: float
    running: float | None
    waiting: float | None
    rate: float | None
    """Tokens per second since the previous point."""


def parse_exposition(body: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of each wanted series over its label sets, from Prometheus text."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in body[:MAX_BODY].splitlines():
        if not line or line[0] == "#":
            continue
        end = next((i for i, ch in enumerate(line) if ch in "{ "), len(line))
        name = line[:end]
        if name not in wanted:
            continue
        rest = line[line.rfind("}") + 1 :] if line[end : end + 1] == "{" else line[end:]
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


def points(timeline: Sequence[Mapping[str, Any]], engine: str) -> list[Point]:
    running, waiting, tokens = SERIES.get(engine, SERIES["vllm"])
    names = (*running, *waiting, *tokens)
    out = []
    for rec in timeline:
        t, body = rec.get("t"), rec.get("body")
        if rec.get("kind") != "scrape" or not isinstance(body, str):
            continue
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            continue
        values = parse_exposition(body, names)
        tok = next((values[n] for n in tokens if n in values), None)
        out.append(Point(float(t), _pick(values, running), _pick(values, waiting), tok))
    return sorted(out, key=lambda p: p.t)


def _pick(values: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((values[n] for n in names if n in values), None)


def rows(pts: Sequence[Point]) -> list[Row]:
    out = []
    prev: Point | None = None
    for p in pts:
        rate = None
        if prev and p.tokens is not None and prev.tokens is not None and p.t > prev.t:
            rate = max(p.tokens - prev.tokens, 0.0) / (p.t - prev.t)
        out.append(Row(p.t, p.running, p.waiting, rate))
        prev = p
    return out


def last_progress(pts: Sequence[Point]) -> float | None:
    """When the token counter last rose (the freeze began after it)."""
    last = None
    for a, b in itertools.pairwise(pts):
        if a.tokens is not None and b.tokens is not None and b.tokens > a.tokens:
            last = b.t
    return last


def around(all_rows: Sequence[Row], freeze: float | None, before: int, after: int) -> list[Row]:
    """Up to ``before`` rows up to the freeze and ``after`` rows after it (the last one kept)."""
    if freeze is None:
        return list(all_rows[-(before + after) :])
    pre = [r for r in all_rows if r.t <= freeze][-before:]
    post = [r for r in all_rows if r.t > freeze]
    if len(post) > after:
        post = post[: after - 1] + post[-1:] if after > 1 else post[-1:]
    return pre + post
