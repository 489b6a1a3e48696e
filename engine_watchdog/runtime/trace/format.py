"""Record and replay observation traces: JSON Lines, one observation per line, in time order.

The format is a public contract (docs/traces.md). Any kind may be absent; unknown kinds and
fields are ignored; ``t`` is seconds since any epoch. Scrapes are recorded raw (the exposition
text, filtered to the series the engine profile reads) so a replay re-parses them with the same
code that ran live.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    GpuInfo,
    GpuObs,
    GuardObs,
    HealthObs,
    Observation,
    ProcInfo,
    ProcsObs,
    QuietStream,
    RestartObs,
)
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.engines import PROFILES
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from engine_watchdog.runtime.events import StuckHandled

VERSION = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedSettings:
    """What the detector judged with from ``t`` on (written when watching starts, and again
    when the engine's profile changes them): replay judges with the same, unless told not to."""

    t: float
    engine: str
    """The engine profile the scrapes were parsed with ("auto" before it was known)."""
    detector: DetectorSettings


Item = Observation | RecordedSettings


def encode_settings(t: float, engine: str, detector: DetectorSettings) -> dict[str, Any]:
    return {
        "v": VERSION,
        "t": t,
        "kind": "settings",
        "engine": engine,
        "detector": asdict(detector),
    }


def _detector(doc: Any) -> DetectorSettings:
    """Known fields with values of the right type (unknown ones are ignored: a newer writer)."""
    if not isinstance(doc, dict):
        raise ValueError("detector settings are not an object")
    known: dict[str, Any] = {}
    for f in fields(DetectorSettings):
        if f.name in doc:
            value = doc[f.name]
            known[f.name] = _bool(value) if isinstance(f.default, bool) else _num(value)
    return DetectorSettings(**known)


def encode_scrape(raw: RawScrape) -> dict[str, Any]:
    rec: dict[str, Any] = {"v": VERSION, "t": raw.t, "kind": "scrape"}
    if raw.error is not None:
        rec["error"] = raw.error
        if raw.detail:
            rec["detail"] = raw.detail
        if raw.elapsed_s is not None:
            rec["elapsed_s"] = raw.elapsed_s
        return rec
    rec.update(status=raw.status, elapsed_s=raw.elapsed_s, body=raw.body)
    return rec


def encode_health(obs: HealthObs) -> dict[str, Any]:
    rec: dict[str, Any] = {"v": VERSION, "t": obs.t, "kind": "health", "status": obs.status}
    if obs.error is not None:
        rec["error"] = obs.error
    return rec


def encode_canary(obs: CanaryObs) -> dict[str, Any]:
    return {
        "v": VERSION,
        "t": obs.t,
        "kind": "canary",
        "ok": obs.ok,
        "latency_s": obs.latency_s,
        "error": obs.error,
        "sent_t": obs.sent,
    }


def encode_gpu(obs: GpuObs) -> dict[str, Any]:
    gpus = [{**asdict(g), "pids": list(g.pids)} for g in obs.gpus]
    return {"v": VERSION, "t": obs.t, "kind": "gpu", "gpus": gpus}


def encode_procs(obs: ProcsObs) -> dict[str, Any]:
    return {"v": VERSION, "t": obs.t, "kind": "procs", "procs": [asdict(p) for p in obs.procs]}


def encode_guard(obs: GuardObs) -> dict[str, Any]:
    rec = {"v": VERSION, "t": obs.t, "kind": "guard", "open": obs.open, "decoding": obs.decoding}
    rec |= {"events": obs.events, "finished": obs.finished, "last_event_t": obs.last_event_t}
    quiet = [
        {
            "id": q.request_id,
            "started_t": q.started_t,
            "first_event_t": q.first_event_t,
            "last_event_t": q.last_event_t,
            "events": q.events,
            "waiting_since": q.waiting_since,
            "label": q.label,
        }
        for q in obs.quiet
    ]
    rec |= {"gaps": list(obs.gaps), "quiet": quiet}
    return rec | {"awaiting": obs.awaiting, "awaiting_since": obs.awaiting_since}


def decode_guard(t: float, rec: dict[str, Any]) -> GuardObs:
    quiet = tuple(
        QuietStream(
            request_id=str(q["id"]),
            started_t=_num(q["started_t"]) or 0.0,
            first_event_t=_num(q.get("first_event_t")),
            last_event_t=_num(q.get("last_event_t")),
            events=int(q.get("events", 0)),
            waiting_since=_num(q.get("waiting_since")),
            label=str(q.get("label", "")),
        )
        for q in rec.get("quiet", ())
    )
    return GuardObs(
        t,
        open=int(rec["open"]),
        decoding=int(rec["decoding"]),
        events=int(rec.get("events", 0)),
        finished=int(rec.get("finished", 0)),
        last_event_t=_num(rec.get("last_event_t")),
        gaps=tuple(int(n) for n in rec.get("gaps", ())),
        quiet=quiet,
        awaiting=int(rec.get("awaiting", 0)),
        awaiting_since=_num(rec.get("awaiting_since")),
    )


def encode(
    obs: HealthObs | CanaryObs | GpuObs | ProcsObs | RestartObs | GuardObs,
) -> dict[str, Any]:
    if isinstance(obs, GuardObs):
        return encode_guard(obs)
    if isinstance(obs, HealthObs):
        return encode_health(obs)
    if isinstance(obs, RestartObs):
        rec = {"v": VERSION, "t": obs.t, "kind": "restart", "detail": obs.detail}
        return {**rec, "replaced": obs.replaced}
    if isinstance(obs, CanaryObs):
        return encode_canary(obs)
    if isinstance(obs, GpuObs):
        return encode_gpu(obs)
    return encode_procs(obs)


def encode_handled(t: float, event: StuckHandled) -> dict[str, Any]:
    """What the supervisor had the guard do with a stuck request (replay skips its kind)."""
    rec = {"v": VERSION, "t": t, "kind": "request-stuck", "request_id": event.request_id}
    return {
        **rec,
        "result": event.result,
        "silent_s": event.silent_s,
        "threshold_s": event.threshold_s,
    }


def decode_settings(rec: dict[str, Any]) -> RecordedSettings:
    t = _time(rec["t"])
    return RecordedSettings(t, _str(rec.get("engine")) or "auto", _detector(rec["detector"]))


def decode(rec: dict[str, Any], profile: EngineProfile) -> Observation | None:
    """One trace record -> observation; None for kinds the detector does not read (settings
    records: :func:`decode_settings`)."""
    t = _time(rec["t"])
    kind = rec.get("kind")
    if kind == "scrape":
        status = _num(rec.get("status"))
        raw = RawScrape(
            t,
            status=None if status is None else int(status),
            body=_str(rec.get("body")),
            elapsed_s=_duration(rec.get("elapsed_s")),
            error=_cause(rec.get("error")),
            detail=_str(rec.get("detail")),
        )
        return parse_scrape(raw, profile)
    if kind == "health":
        status = _num(rec.get("status"))
        return HealthObs(t, None if status is None else int(status), _cause(rec.get("error")))
    if kind == "canary":
        return CanaryObs(
            t,
            ok=_bool(rec["ok"]),
            latency_s=_duration(rec.get("latency_s")),
            error=_str(rec.get("error")),
            sent_t=None if rec.get("sent_t") is None else _time(rec["sent_t"]),
        )
    if kind == "gpu":
        return GpuObs(t, tuple(_gpu(g) for g in rec["gpus"]))
    if kind == "procs":
        return ProcsObs(t, tuple(_proc(p) for p in rec["procs"]))
    if kind == "guard":
        return decode_guard(t, rec)
    if kind == "restart":
        return RestartObs(t, _str(rec.get("detail")) or "", _bool(rec.get("replaced", False)))
    return None


def _num(value: Any) -> float | None:
    """A finite number or None; anything else is a broken record (ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


MAX_ABS_T = 1e11
"""Times beyond this (year 5138) are broken records: no clock gives them, and formatting one
overflows."""


def _time(value: Any) -> float:
    t = _num(value)
    if t is None:
        raise ValueError("no time")
    if abs(t) > MAX_ABS_T:
        raise ValueError(f"time out of range: {t!r}")
    return t


def _duration(value: Any) -> float | None:
    seconds = _num(value)
    if seconds is not None and not 0 <= seconds <= MAX_ABS_T:
        raise ValueError(f"not a duration: {seconds!r}")
    return seconds


def _str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"not a string: {value!r}")
    return value


def _cause(value: Any) -> Cause | None:
    """A failed request's code (net/failures.py); any other is a broken record (ValueError)."""
    text = _str(value)
    return None if text is None else Cause(text)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"not a boolean: {value!r}")
    return value


def _gpu(g: dict[str, Any]) -> GpuInfo:
    return GpuInfo(
        index=int(g["index"]),
        util_pct=_num(g.get("util_pct")),
        power_w=_num(g.get("power_w")),
        sm_pct=_num(g.get("sm_pct")),
        tensor_pct=_num(g.get("tensor_pct")),
        dram_pct=_num(g.get("dram_pct")),
        pids=tuple(int(p) for p in g.get("pids", ())),
    )


def _proc(p: dict[str, Any]) -> ProcInfo:
    return ProcInfo(
        pid=int(p["pid"]),
        ppid=int(p.get("ppid", 0)),
        role=str(p.get("role", "other")),
        title=str(p.get("title", "")),
        state=str(p.get("state", "running")),
        cpu_s=_num(p.get("cpu_s", 0.0)) or 0.0,
        ns_pid=None if p.get("ns_pid") is None else int(p["ns_pid"]),
    )


REORDER_WINDOW_S = 5.0
"""Records this close may come out of order (writers that log probes as they finish)."""


def read_trace(
    lines: Iterable[str], profile: EngineProfile, follow_engine: bool = False
) -> Iterator[Item]:
    """Observations (and settings) of a trace in time order; a broken line is skipped with a
    warning. ``follow_engine``: scrapes after a settings record are parsed with its engine's
    profile, as they were live.

    Records up to REORDER_WINDOW_S apart are put back in order (a heap that releases a record
    once one REORDER_WINDOW_S later has been read): the detector ignores time running backwards.
    """
    pending: list[tuple[float, int, Item]] = []
    for number, obs in enumerate(_decoded(lines, profile, follow_engine)):
        heapq.heappush(pending, (obs.t, number, obs))
        while pending and obs.t - pending[0][0] > REORDER_WINDOW_S:
            yield heapq.heappop(pending)[2]
    while pending:
        yield heapq.heappop(pending)[2]


def _decoded(lines: Iterable[str], profile: EngineProfile, follow_engine: bool) -> Iterator[Item]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            obs: Item | None = (
                decode_settings(rec) if rec.get("kind") == "settings" else decode(rec, profile)
            )
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            RecursionError,
            OverflowError,
        ) as exc:
            # RecursionError: json on deeply nested input. Each broken record is said, once.
            log.warning("trace line %d skipped: %s", number, str(exc)[:200])
            continue
        if isinstance(obs, RecordedSettings) and follow_engine and obs.engine in PROFILES:
            profile = PROFILES[obs.engine]
        if obs is not None:
            yield obs
