"""The metrics probe: GET the engine's /metrics, keep only the profile's series, group by rank."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from engine_watchdog.core.exposition import Sample, is_number, parse_samples, series_names
from engine_watchdog.core.model import Cause, EngineSample, HttpStatus, Note, ScrapeObs
from engine_watchdog.engines.detect import NOT_METRICS_HINT, is_html
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.access import OPEN, Access
from engine_watchdog.net.failures import TOO_LARGE
from engine_watchdog.net.http import fetch

GAUGE_MARK = "~"
"""Prefix of progress keys carried by gauges (any change is progress, a drop no restart)."""


@dataclass(frozen=True)
class RawScrape:
    """What came over the wire; recorded as-is in traces so replay re-parses it."""

    t: float
    status: int | None = None
    body: str | None = None
    elapsed_s: float | None = None
    error: Cause | None = None
    detail: str | None = None


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    clock: Callable[[], float] = time.time,
    access: Access = OPEN,
) -> RawScrape:
    """GET /metrics, read to its end (or to ``max_bytes``: then a too-large error)."""
    t = clock()
    answer = await fetch(
        session, "GET", url, timeout_s=timeout_s, max_bytes=max_bytes, access=access
    )
    if answer.error == TOO_LARGE:
        detail = f"{answer.detail}; raise --max-scrape-bytes (now {max_bytes})"
        return RawScrape(t, error=TOO_LARGE, detail=detail, elapsed_s=answer.elapsed_s)
    if answer.error is not None or answer.status is None:
        # How long it went unanswered is evidence too (an engine loop that answers /metrics).
        return RawScrape(t, error=answer.error, detail=answer.detail, elapsed_s=answer.elapsed_s)
    return RawScrape(t, status=answer.status, body=answer.text(), elapsed_s=answer.elapsed_s)


def parse_scrape(raw: RawScrape, profile: EngineProfile) -> ScrapeObs:
    """Turn a raw scrape into per-rank samples. Pure: same input, same output."""
    if raw.error is not None or raw.body is None:
        error = raw.error or Cause.NO_BODY
        return ScrapeObs(raw.t, error=error, detail=raw.detail, elapsed_s=raw.elapsed_s)
    if raw.status != 200:
        detail = f"/metrics answered HTTP {raw.status}"
        detail += f"; {NOT_METRICS_HINT}" if raw.status == 404 else ""
        return ScrapeObs(raw.t, error=HttpStatus.of(raw.status), detail=detail, status=raw.status)
    by_engine, duplicates = _by_engine(raw.body, profile)
    if not by_engine:
        return ScrapeObs(
            raw.t,
            error=Cause.NO_ENGINE_SERIES,
            detail=_no_series_detail(raw.body, profile),
            status=200,
        )
    notes = [_duplicates_note(duplicates)] if duplicates else []
    engines = tuple(_engine_sample(e, s, profile, notes) for e, s in sorted(by_engine.items()))
    first: dict[str, Note] = {}
    for note in notes:
        first.setdefault(note.kind, note)  # one of each kind a scrape (the ranks repeat them)
    return ScrapeObs(
        raw.t, engines=engines, status=200, elapsed_s=raw.elapsed_s, notes=tuple(first.values())
    )


def _by_engine(body: str, profile: EngineProfile) -> tuple[dict[str, list[Sample]], list[str]]:
    """The wanted samples per rank, and the series that appeared more than once."""
    by_engine: dict[str, list[Sample]] = defaultdict(list)
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    duplicates: list[str] = []
    for sample in parse_samples(body, profile.wanted_series()):
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            duplicates.append(_series_text(sample))
        seen.add(key)
        by_engine[sample.labels.get(profile.engine_label, "0")].append(sample)
    return by_engine, duplicates


def _duplicates_note(duplicates: list[str]) -> Note:
    # Summed, like series of separate processes: whichever copy moves is progress (a stale copy
    # left by another process cannot hide a live one, as keeping only the first could).
    return Note(
        "duplicate-series",
        f"{len(duplicates)} series appear more than once in /metrics with the same labels "
        f"(e.g. {duplicates[0]}): their values are summed; the exposition mixes several "
        "processes or registries",
    )


def _series_text(sample: Sample) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}"


def _no_series_detail(body: str, profile: EngineProfile) -> str:
    count, first = series_names(body)
    found = f"{count} series ({', '.join(first)}...)" if count else "no series at all"
    found = "a web page" if is_html(body) else found
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


def _first_present(samples: list[Sample], names: tuple[str, ...]) -> list[Sample]:
    for name in names:
        found = [s for s in samples if s.name == name]
        if found:
            return found
    return []


def _counter(samples: list[Sample], names: tuple[str, ...], notes: list[Note]) -> float | None:
    """A counter's total; values that no counter can have (NaN, Inf, negative) left out, said."""
    found = _first_present(samples, names)
    good = [s.value for s in found if is_number(s.value) and s.value >= 0]
    bad = [s for s in found if not (is_number(s.value) and s.value >= 0)]
    if bad:
        notes.append(
            Note(
                "bad-counter",
                f"{_series_text(bad[0])} reads {bad[0].value}: no counter can; that value is "
                "left out (neither progress nor a restart)",
            )
        )
    return sum(good) if good else None


def _work(
    samples: list[Sample], names: tuple[str, ...], what: str, notes: list[Note]
) -> tuple[float | None, bool]:
    """(total, unknown) of a work gauge: unknown when it is there but holds no number."""
    found = _first_present(samples, names)
    good = [s.value for s in found if is_number(s.value) and s.value >= 0]
    if found and not good:
        notes.append(
            Note(
                "unknown-work",
                f"{_series_text(found[0])} reads {found[0].value}: how many requests are "
                f"{what} is unknown, not zero; the last number read is kept (none yet: work "
                "counts as present, and the canary tells a hang from idle)",
            )
        )
        return None, True
    return (sum(good) if good else None), False


def _engine_sample(
    engine: str, samples: list[Sample], profile: EngineProfile, notes: list[Note]
) -> EngineSample:
    kv = _values(samples, profile.kv_usage)
    progress = {}
    for key, names in profile.progress.items():
        if key in profile.gauge_progress:
            gauge = _values(samples, names)
            if gauge:
                progress[GAUGE_MARK + key] = sum(gauge)
        elif (value := _counter(samples, names, notes)) is not None:
            progress[key] = value
    running, running_unknown = _work(samples, profile.running, "running", notes)
    waiting, waiting_unknown = _work(samples, profile.waiting, "waiting", notes)
    unknown = (("running",) if running_unknown else ()) + (("waiting",) if waiting_unknown else ())
    return EngineSample(
        engine=engine,
        running=running,
        waiting=waiting,
        kv_usage=max(kv) if kv else None,
        asleep=_asleep(samples, profile),
        progress=progress,
        unknown=unknown,
    )


def _asleep(samples: list[Sample], profile: EngineProfile) -> bool:
    if profile.sleep_gauge is None or profile.sleep_awake_label is None:
        return False
    label, awake_value = profile.sleep_awake_label
    for s in samples:
        if s.name == profile.sleep_gauge and s.labels.get(label) == awake_value:
            return s.value == 0
    return False
