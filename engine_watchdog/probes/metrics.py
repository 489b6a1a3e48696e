"""The metrics probe: GET the engine's /metrics, keep only the profile's series, group by rank."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from engine_watchdog.core.exposition import Sample, is_number, parse_samples, series_names
from engine_watchdog.core.model import EngineSample, ScrapeObs
from engine_watchdog.core.redact import redact_url
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.http import error_code

GAUGE_MARK = "~"
"""Prefix of progress keys carried by gauges (any change is progress, a drop no restart)."""


@dataclass(frozen=True)
class RawScrape:
    """What came over the wire; recorded as-is in traces so replay re-parses it."""

    t: float
    status: int | None = None
    body: str | None = None
    elapsed_s: float | None = None
    error: str | None = None
    detail: str | None = None


async def fetch_text(
    session: aiohttp.ClientSession, url: str, timeout_s: float, max_bytes: int
) -> tuple[int, str]:
    """GET ``url``; raises ValueError when the body exceeds ``max_bytes``."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, timeout=timeout) as resp:
        body = await resp.content.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise ValueError(f"body larger than {max_bytes} bytes")
        return resp.status, body.decode("utf-8", errors="replace")


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    clock: Callable[[], float] = time.time,
) -> RawScrape:
    t = clock()
    started = time.monotonic()
    try:
        status, body = await fetch_text(session, url, timeout_s, max_bytes)
    except ValueError as exc:
        detail = redact_url(f"{url}: {exc}; raise --max-scrape-bytes")
        return RawScrape(t, error="too-large", detail=detail)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        code = error_code(exc)
        # The URL may hold credentials (only to connect): a detail reaches traces and logs.
        detail = redact_url(f"{url}: {code} ({exc or type(exc).__name__})")
        # How long it went unanswered is evidence too (an engine loop that answers /metrics).
        return RawScrape(t, error=code, detail=detail, elapsed_s=time.monotonic() - started)
    return RawScrape(t, status=status, body=body, elapsed_s=time.monotonic() - started)


def parse_scrape(raw: RawScrape, profile: EngineProfile) -> ScrapeObs:
    """Turn a raw scrape into per-rank samples. Pure: same input, same output."""
    if raw.error is not None or raw.body is None:
        error = raw.error or "no-body"
        return ScrapeObs(raw.t, error=error, detail=raw.detail, elapsed_s=raw.elapsed_s)
    if raw.status != 200:
        detail = f"/metrics answered HTTP {raw.status}"
        return ScrapeObs(raw.t, error=f"http-{raw.status}", detail=detail, status=raw.status)
    by_engine: dict[str, list[Sample]] = defaultdict(list)
    for sample in parse_samples(raw.body, profile.wanted_series()):
        by_engine[sample.labels.get(profile.engine_label, "0")].append(sample)
    if not by_engine:
        return ScrapeObs(
            raw.t, error="no-engine-series", detail=_no_series_detail(raw.body, profile), status=200
        )
    engines = tuple(_engine_sample(e, s, profile) for e, s in sorted(by_engine.items()))
    return ScrapeObs(raw.t, engines=engines, status=200, elapsed_s=raw.elapsed_s)


def _no_series_detail(body: str, profile: EngineProfile) -> str:
    count, first = series_names(body)
    found = f"{count} series ({', '.join(first)}...)" if count else "no series at all"
    hint = f" and {profile.enable_hint}" if profile.enable_hint else ""
    return (
        f"no {profile.name} series in /metrics: found {found}. Check that the URL is the "
        f"{profile.name} API server{hint}."
    )


def _values(samples: list[Sample], names: tuple[str, ...]) -> list[float] | None:
    """Values of the first name in ``names`` that is present (NaN and Inf left out)."""
    for name in names:
        found = [s.value for s in samples if s.name == name]
        if found:
            return [v for v in found if is_number(v)]
    return None


def _total(samples: list[Sample], names: tuple[str, ...]) -> float | None:
    values = _values(samples, names)
    return sum(values) if values else None


def _engine_sample(engine: str, samples: list[Sample], profile: EngineProfile) -> EngineSample:
    kv = _values(samples, profile.kv_usage)
    progress = {}
    for key, names in profile.progress.items():
        value = _total(samples, names)
        if value is not None:
            progress[GAUGE_MARK + key if key in profile.gauge_progress else key] = value
    return EngineSample(
        engine=engine,
        running=_total(samples, profile.running),
        waiting=_total(samples, profile.waiting),
        kv_usage=max(kv) if kv else None,
        asleep=_asleep(samples, profile),
        progress=progress,
    )


def _asleep(samples: list[Sample], profile: EngineProfile) -> bool:
    if profile.sleep_gauge is None or profile.sleep_awake_label is None:
        return False
    label, awake_value = profile.sleep_awake_label
    for s in samples:
        if s.name == profile.sleep_gauge and s.labels.get(label) == awake_value:
            return s.value == 0
    return False
