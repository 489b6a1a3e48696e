"""Whether requests were running or waiting when the bundle was taken, for log lines that mean
a hang only beside work (a ``log`` rule with ``only_with_requests``).

vLLM logs "No available shared memory broadcast block found in N seconds" at INFO while a
process merely waits for the next message, idle engines included (vllm-project/vllm#25720,
vllm/distributed/device_communicators/shm_broadcast.py): the line alone is no hang.

The first of these that says anything (pure):
- the timeline's latest record of the guard's open requests (``kind: guard``) or of running
  plus waiting from a /metrics scrape (``kind: scrape``);
- the watchdog's verdict: its causes ``no-progress`` (work present, nothing moved),
  ``admission-stall`` and ``host-deadlock`` (requests waiting) mean requests were there;
  ``wedged-idle`` means the metrics said idle (core/model.py's causes);
- the engine log's last stats line: vLLM's ``Running: N reqs, Waiting: M reqs`` (V0:
  ``Pending``), SGLang's ``#running-req: N, #queue-req: M``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine_watchdog.hangs import timeline
from engine_watchdog.hangs.view import BundleView

_STATS = (
    re.compile(r"Running:\s*(\d+)\s*reqs?.*?(?:Waiting|Pending):\s*(\d+)\s*reqs?"),
    re.compile(r"#running-req:\s*(\d+).*?#queue-req:\s*(\d+)"),
)


@dataclass(frozen=True)
class InFlight:
    busy: bool | None
    """Requests running or waiting; None: the bundle does not say."""
    file: str = ""
    detail: str = ""


_WORK_CAUSES = ("no-progress", "admission-stall", "host-deadlock")
_IDLE_CAUSES = ("wedged-idle",)


def in_flight(view: BundleView) -> InFlight:
    for source in (_from_timeline, _from_verdict, _from_log):
        got = source(view)
        if got.busy is not None:
            return got
    return InFlight(None)


def _from_verdict(view: BundleView) -> InFlight:
    verdict = view.manifest.get("verdict")
    cause = verdict.get("cause") if isinstance(verdict, dict) else None
    if cause in _WORK_CAUSES or cause in _IDLE_CAUSES:
        return InFlight(cause in _WORK_CAUSES, "manifest.json", f"the verdict's cause {cause}")
    return InFlight(None)


def _from_timeline(view: BundleView) -> InFlight:
    best: tuple[float, InFlight] | None = None
    for rec in view.timeline:
        t = rec.get("t")
        if isinstance(t, bool) or not isinstance(t, int | float):
            continue
        if rec.get("kind") == "guard" and isinstance(rec.get("open"), int):
            got = InFlight(rec["open"] > 0, "timeline.jsonl", f"guard: {rec['open']} open")
        else:
            continue
        if best is None or t >= best[0]:
            best = (float(t), got)
    for p in timeline.points(view.timeline, view.engine):
        if p.running is None and p.waiting is None:
            continue
        n = (p.running or 0) + (p.waiting or 0)
        text = f"scrape: running {_n(p.running)}, waiting {_n(p.waiting)}"
        if best is None or p.t >= best[0]:
            best = (p.t, InFlight(n > 0, "timeline.jsonl", text))
    return best[1] if best else InFlight(None)


def _from_log(view: BundleView) -> InFlight:
    for i in range(len(view.log or ()) - 1, -1, -1):
        line = (view.log or ())[i]
        for pat in _STATS:
            m = pat.search(line)
            if m:
                busy = int(m.group(1)) + int(m.group(2)) > 0
                return InFlight(busy, "engine.log", f"line {i + 1}: {line.strip()[:200]}")
    return InFlight(None)


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"
