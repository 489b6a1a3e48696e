"""Plain data crossing every boundary: probes emit it, the detector reads it, reporters print it.

Everything here is a frozen dataclass with no behaviour beyond small derived properties, so it
can be recorded, replayed and compared bit for bit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum


class Word(str, Enum):
    """A word of the typed vocabulary: compares, prints and serialises as its value (on every
    Python: a plain ``(str, Enum)`` formats as ``Class.NAME`` in f-strings from 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class State(Word):
    """Verdict states, from least to most alarming (see SEVERITY)."""

    STARTING = "starting"
    IDLE = "idle"
    SLEEPING = "sleeping"
    PROGRESSING = "progressing"
    SUSPECT = "suspect"
    UNREACHABLE = "unreachable"
    STALLED = "stalled"


SEVERITY: dict[State, int] = {s: i for i, s in enumerate(State)}


class Cause(Word):
    """Why a verdict is what it is: a stall's cause, or what the failed probe got (unreachable
    and starting verdicts; net/failures.py says which failure each is). With :class:`HttpStatus`
    the one closed vocabulary of causes, from the probe's answer to the metric label
    (:data:`Reason`)."""

    ENGINE_DEAD = "engine-dead"
    """/health answered 503, or the engine-core process is gone."""
    STOPPED = "stopped"
    """An engine process stopped (state T) in two samples."""
    GPU_SPIN = "gpu-spin"
    """The engine's GPUs busy with no tensor or DRAM activity: a spin-wait."""
    HOST_DEADLOCK = "host-deadlock"
    """Engine CPU idle and GPU idle while requests wait."""
    HOST_BUSY = "host-busy"
    """An engine process busy on the CPU with no progress."""
    ADMISSION_STALL = "admission-stall"
    """Requests waiting, none running."""
    NO_PROGRESS = "no-progress"
    """Work present and nothing moved; no more specific cause."""
    API_UNRESPONSIVE = "api-unresponsive"
    """/metrics and /health both time out for the stall window."""
    WEDGED_IDLE = "wedged-idle"
    """The metrics say idle but a canary fails (a scheduler frozen while idle)."""
    RESTARTING = "restarting"
    """(state starting) the watchdog restarted the engine and waits for the next one."""
    STUCK_REQUESTS = "stuck-requests"
    """Several requests stuck while the engine served others (the request judge's burst): an
    incident of the supervisor's, never a detector's verdict."""
    # What a failed request got (net/failures.py): the cause of an unreachable or starting verdict.
    TIMEOUT = "timeout"
    TOO_LARGE = "too-large"
    TLS = "tls"
    REFUSED = "connection-refused"
    DNS = "dns"
    """The URL's host name does not resolve: no connection was even tried."""
    DISCONNECTED = "disconnected"
    HTTP_ERROR = "http-error"
    NO_ANSWER = "no-answer"
    NO_BODY = "no-body"
    NO_ENGINE_SERIES = "no-engine-series"
    """/metrics answered, with no series of a known engine."""


STALL_CAUSES: tuple[Cause, ...] = (
    Cause.ENGINE_DEAD,
    Cause.STOPPED,
    Cause.GPU_SPIN,
    Cause.HOST_DEADLOCK,
    Cause.HOST_BUSY,
    Cause.ADMISSION_STALL,
    Cause.NO_PROGRESS,
    Cause.API_UNRESPONSIVE,
    Cause.WEDGED_IDLE,
)
"""Causes the detector's stalled verdicts can carry."""


class HttpStatus(str):
    """A request answered with an HTTP error status, as a cause: ``http-503``. Statuses are
    numbers, not a list of words: made by :meth:`of`."""

    __slots__ = ()

    @classmethod
    def of(cls, status: int | None) -> HttpStatus:
        """(None: an answer recorded without its status, as a hand-written trace may hold.)"""
        return cls(f"http-{status}")


Reason = Cause | HttpStatus
"""Every cause a verdict, a probe's error, a log line or a metric label can carry."""


class Action(Word):
    """Rungs of the escalation ladder, in the order they run."""

    ANSWER = "answer"
    """The guard answers every client in flight with an error and refuses new requests (503)
    until the engine is back: clients never wait for the rest of the ladder."""
    CAPTURE = "capture"
    ABORT = "abort"
    RESTART = "restart"
    LIVENESS = "liveness"


RUNGS: tuple[Action, ...] = tuple(Action)


class Result(Word):
    """What an action did."""

    OK = "ok"
    FAILED = "failed"
    NOT_AVAILABLE = "not-available"
    SKIPPED = "skipped"
    DRY_RUN = "dry_run"
    RATE_LIMITED = "rate_limited"


@dataclass(frozen=True)
class Note:
    """Something odd in what a probe read or the detector judged, said once in the log (its
    ``kind`` is what "once" counts by) and kept in the evidence."""

    kind: str
    text: str


@dataclass(frozen=True)
class EngineSample:
    """One data-parallel rank's series from one scrape."""

    engine: str
    running: float | None
    waiting: float | None
    kv_usage: float | None
    asleep: bool
    progress: dict[str, float] = field(default_factory=dict)
    """Logical progress signal (profile key) -> counter value; NaN, infinite and negative
    counter values are left out. A key starting with "~" is carried by a gauge: any change is
    progress, a drop is no restart."""
    unknown: tuple[str, ...] = ()
    """Work gauges ("running", "waiting") whose series are there but hold no number (NaN,
    infinite or negative): unknown, which is not zero (the detector decides what it means)."""


@dataclass(frozen=True)
class ScrapeObs:
    """A scrape of the engine's /metrics, parsed. ``error`` set means no usable answer."""

    t: float
    engines: tuple[EngineSample, ...] = ()
    error: Reason | None = None
    """timeout, connection-refused, http-<status>, too-large, no-engine-series..."""
    detail: str | None = None
    """One line for humans saying what was found and what to check."""
    status: int | None = None
    elapsed_s: float | None = None
    notes: tuple[Note, ...] = ()
    """Odd values in the exposition (duplicate series, negative counters, NaN gauges)."""


@dataclass(frozen=True)
class HealthObs:
    """The engine's own /health answer (status None: no answer, see error)."""

    t: float
    status: int | None
    error: Cause | None = None


@dataclass(frozen=True)
class ProcInfo:
    """One engine process as the process table shows it."""

    pid: int
    ppid: int
    role: str
    """api-server | engine-core | worker | dp-coordinator | other"""
    title: str
    state: str
    """running | sleeping | disk-wait | stopped | zombie | gone (psutil's names, normalised)"""
    cpu_s: float
    ns_pid: int | None = None
    """The PID inside the process's own PID namespace when it differs (containers)."""
    orphan: bool = False
    """Found by its engine title outside the server's process tree (its parent gone): it may
    be another engine's, so it is observed but never sampled or stopped as one of our ranks."""


@dataclass(frozen=True)
class ProcsObs:
    t: float
    procs: tuple[ProcInfo, ...]


@dataclass(frozen=True)
class GpuInfo:
    index: int
    util_pct: float | None
    power_w: float | None
    sm_pct: float | None = None
    tensor_pct: float | None = None
    dram_pct: float | None = None
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuObs:
    t: float
    gpus: tuple[GpuInfo, ...]


@dataclass(frozen=True)
class CanaryObs:
    """A 1-token request through the engine's own API. ok=True proves the engine is alive."""

    t: float
    ok: bool
    latency_s: float | None = None
    error: str | None = None
    """timeout, disconnected, http-5xx: evidence; unusable:... (4xx, no model): ignored."""
    sent_t: float | None = None
    """When the request was sent (defaults to t - latency_s)."""

    @property
    def sent(self) -> float:
        if self.sent_t is not None:
            return self.sent_t
        return self.t - (self.latency_s or 0.0)

    @property
    def is_evidence(self) -> bool:
        """A failure that says something about the engine (not about the canary itself)."""
        return self.ok or not (self.error or "").startswith("unusable")


@dataclass(frozen=True)
class RestartObs:
    """The watchdog itself ended the engine so that it starts again: what follows is a
    start-up, not a death."""

    t: float
    detail: str = ""
    replaced: bool = False
    """The next engine was already started when this was noted (supervise mode): whatever
    answers next is it. Otherwise the ended engine's API server may still answer a while."""


@dataclass(frozen=True)
class QuietStream:
    """A stream through the guard that has been quiet a while (guard/, docs/guard.md): the
    times are when it started, got its first and its last token event, and since when the guard
    has been waiting on the engine for more (None while it waits on the client instead).
    ``request_id`` is the guard's own id of the stream; ``label`` the client's X-Request-Id."""

    request_id: str
    started_t: float
    first_event_t: float | None
    last_event_t: float | None
    events: int
    waiting_since: float | None
    """When the guard last asked the engine for more of this stream; None: the guard is blocked
    writing to the client (a slow reader holds its own stream back)."""
    label: str = ""


@dataclass(frozen=True)
class GuardObs:
    """What the guard saw on the wire since its previous observation: requests in flight,
    events passed, the inter-event gaps (counts per GAP_BOUNDS bucket, core/wire.py), and the
    streams quiet for a second or more."""

    t: float
    open: int
    """Requests in flight through the guard (streaming or not)."""
    decoding: int
    """Of which SSE streams that have had at least one event."""
    events: int = 0
    finished: int = 0
    """Requests the engine completed since the previous observation (not those the guard
    ended, refused, or whose client left)."""
    last_event_t: float | None = None
    """The newest event on any stream."""
    gaps: tuple[int, ...] = ()
    quiet: tuple[QuietStream, ...] = ()
    awaiting: int = 0
    """Of the requests in flight, those waiting on the engine for their first token: a stream
    with no token event yet, or a request whose answer has not begun. The engine may not count
    them (a frozen core publishes nothing): the guard holding them is the evidence."""
    awaiting_since: float | None = None
    """When the oldest of them came to the guard."""


Observation = ScrapeObs | HealthObs | ProcsObs | GpuObs | CanaryObs | RestartObs | GuardObs


@dataclass(frozen=True)
class Verdict:
    """The detector's judgement of one engine (data-parallel rank) at time ``t``."""

    t: float
    engine: str
    state: State
    cause: Reason | None = None
    """Why, for stalled/suspect/unreachable (e.g. no-progress, stopped, engine-dead)."""
    since: float | None = None
    """When the engine entered this state."""
    seconds_without_progress: float = 0.0
    last_progress_t: float | None = None
    evidence: tuple[str, ...] = ()
    """Short human-readable facts behind the verdict, newest last."""


def incident_name(t: float, engine: str, cause: Reason | None) -> str:
    """``20261130T055012Z-0-stopped``: the UTC second a stall began, the engine (its
    data-parallel rank; ``all`` for the whole target) and the cause; safe as a file name."""
    stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{_slug(engine) or 'all'}-{_slug(cause or 'stall') or 'stall'}"


def incident_id(v: Verdict) -> str:
    """The incident a stall verdict opens: the same in the transition line, in every log line
    and action record of its ladder, and as the name of its bundles (a second one gets
    ``-2``)."""
    return incident_name(v.since if v.since is not None else v.t, v.engine, v.cause)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class Transition:
    """A change of verdict state for one engine."""

    old: State | None
    new: Verdict


@dataclass(frozen=True)
class StuckRequest:
    """The request judge's finding (core/requests.py): one stream silent far beyond what the
    engine does for the others."""

    t: float
    request_id: str
    silent_s: float
    threshold_s: float
    evidence: str
    burst: bool = False
    """This one makes several stuck requests within a window: an engine-level incident."""


@dataclass(frozen=True)
class Outcome:
    """What a recovery action did."""

    result: Result
    detail: str = ""
