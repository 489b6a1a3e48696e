"""Which engine served this /metrics body? (``--engine auto``)

Pure: a body (and its HTTP status) in, a :class:`Detection` out. Each engine names its series
with its own prefix (``vllm:``, ``sglang:``, ``tgi_``, ``llamacpp:``, ``trtllm_``), so the
prefix that owns the most series names wins. Two bodies say more than their series:
trtllm-serve answers /metrics with JSON iteration stats (its Prometheus series live at
/prometheus/metrics), and llama-server without ``--metrics`` answers 501 saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from engine_watchdog.core.exposition import series_names
from engine_watchdog.engines import PROFILES, TRTLLM
from engine_watchdog.engines.profile import EngineProfile

SHOWN_NAMES = 5
"""Series names quoted in an "unknown engine" message."""

NOT_METRICS_HINT = (
    "check the URL: the engine server's own host and port (vLLM's default is 8000), not a "
    "proxy's or a web UI's"
)
NOT_FOUND = frozenset({404, 405, 410})
_LLAMACPP_NO_METRICS = "Start it with `--metrics`"
"""llama-server's 501 answer to /metrics without --metrics (tools/server/server-context.cpp)."""


@dataclass(frozen=True)
class Detection:
    """The verdict on one body: an engine name (or None) and what it was based on."""

    engine: str | None
    evidence: str
    """What was seen, e.g. ``41 sglang: series`` or ``a JSON list``."""
    hint: str | None = None
    """What to change on the engine's side, when the body shows something is missing."""
    metrics: bool = True
    """The answer was metrics at all (False: an error status or a web page)."""

    @property
    def profile(self) -> EngineProfile | None:
        return PROFILES.get(self.engine) if self.engine else None

    def message(self) -> str:
        """One line for humans."""
        if not self.metrics:
            return f"no engine's metrics there: /metrics answered {self.evidence}; {self.hint}"
        if self.engine is None:
            names = ", ".join(sorted(PROFILES))
            text = f"unknown engine: found {self.evidence}; pass --engine ({names})"
        else:
            text = f"detected engine {self.engine} from {self.evidence}"
        return f"{text}. {self.hint}" if self.hint else text


def detect_profile(
    body: str, status: int = 200, profiles: Iterable[EngineProfile] | None = None
) -> Detection:
    """Name the engine whose /metrics answered ``body`` with ``status``."""
    candidates = list(PROFILES.values() if profiles is None else profiles)
    special = _special_body(body, status, candidates)
    if special is not None:
        return special
    page = is_html(body)
    # A web page, or no such path: not an engine's /metrics. A 5xx is an engine's (or a
    # proxy's) trouble of the moment, judged as a failed scrape, round after round.
    if page or status in NOT_FOUND:
        what = f"HTTP {status}" + (", a web page" if page else "")
        return Detection(None, what, NOT_METRICS_HINT, metrics=False)
    names = _all_series_names(body)
    counts = {p.name: sum(1 for n in names if n.startswith(p.series_prefix)) for p in candidates}
    best = max(counts.values(), default=0)
    winners = sorted(name for name, count in counts.items() if count == best and count > 0)
    if len(winners) == 1:
        winner = winners[0]
        return Detection(winner, f"{best} {PROFILES[winner].series_prefix} series names")
    if winners:
        tied = " and ".join(f"{PROFILES[w].series_prefix} ({best})" for w in winners)
        return Detection(None, f"as many series names of {tied}")
    return Detection(None, _found(names), _enable_hints(candidates) if names else None)


def _special_body(body: str, status: int, candidates: list[EngineProfile]) -> Detection | None:
    """The bodies that name their engine without a single engine series."""
    names = {p.name for p in candidates}
    if status == 501 and _LLAMACPP_NO_METRICS in body and "llamacpp" in names:
        hint = PROFILES["llamacpp"].enable_hint
        return Detection("llamacpp", "llama-server's 501 answer to /metrics", hint)
    if status == 200 and TRTLLM.name in names and _is_json_list(body):
        hint = (
            f"The watchdog reads {TRTLLM.metrics_path}; if it is missing, "
            f"{TRTLLM.enable_hint.split(';')[0]}"
        )
        return Detection(TRTLLM.name, "a JSON list (trtllm-serve's iteration stats)", hint)
    return None


def is_html(body: str) -> bool:
    head = body.lstrip()[:100].lower()
    return head.startswith(("<!doctype html", "<html", "<head", "<body"))


def _is_json_list(body: str) -> bool:
    if not body.lstrip().startswith("["):
        return False
    try:
        return isinstance(json.loads(body), list)
    except ValueError:
        return False


def _all_series_names(body: str) -> list[str]:
    _, names = series_names(body, limit=len(body))
    return names


def _found(names: list[str]) -> str:
    if not names:
        return "no series at all"
    shown = ", ".join(names[:SHOWN_NAMES])
    more = "..." if len(names) > SHOWN_NAMES else ""
    return f"{len(names)} series of no known engine ({shown}{more})"


def _enable_hints(candidates: list[EngineProfile]) -> str:
    """Only process or HTTP series: the engine's own metrics are probably switched off."""
    hints = [f"{p.name}: {p.enable_hint}" for p in candidates if p.enable_hint]
    return "If the engine's metrics are off: " + "; ".join(hints)
