"""``summary.md``: what happened and when, the verdict, and where each engine thread sits.

Written to be pasted into an upstream issue as is: a few "where it is stuck" lines first, then the
facts (verdict, processes, capture steps) and, per process, the deduplicated thread table with
the stacks folded under ``<details>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine_watchdog.capture.frames import (
    SourceLine,
    ThreadGroup,
    group_threads,
    parse_threads,
    thread_label,
)
from engine_watchdog.capture.step import StepResult
from engine_watchdog.core.model import ProcInfo, Verdict

# Thread states worth a headline line even off the main thread.
_NOTABLE = frozenset({"cuda-sync", "collective", "gil", "lock", "running"})
_STACK_LINES = 30
_ROLE_LABEL = {
    "engine-core": "EngineCore",
    "worker": "Worker",
    "dp-coordinator": "DPCoordinator",
    "api-server": "API server",
}


@dataclass(frozen=True)
class SummaryInput:
    created: float
    engine: str
    verdict: Verdict | None
    procs: Sequence[ProcInfo]
    steps: Sequence[StepResult]
    timeline: Sequence[Mapping[str, Any]] = ()
    groups: Mapping[int, Sequence[ThreadGroup]] = field(default_factory=dict)
    """PID -> grouped threads (from py-spy); a PID without stacks is absent."""
    engine_version: str | None = None
    """What the engine's /version said; None: it did not answer."""


def utc(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def proc_label(proc: ProcInfo) -> str:
    """'EngineCore_DP0', 'Worker_TP1', 'API server', 'PID 123' for a process."""
    if "::" in proc.title and proc.role != "other":
        return proc.title.split()[0].rsplit("::", 1)[-1]
    return _ROLE_LABEL.get(proc.role, f"PID {proc.pid}")


def load_groups(
    workdir: Path, procs: Sequence[ProcInfo], source_line: SourceLine | None = None
) -> dict[int, list[ThreadGroup]]:
    """Read ``pyspy/<pid>.json`` (or, for a native process, ``native/<pid>.json``: eu-stack's
    stacks in the same shape) of each process and group its threads. Blocking."""
    out: dict[int, list[ThreadGroup]] = {}
    for p in procs:
        for folder in ("pyspy", "native"):
            try:
                data = json.loads((workdir / folder / f"{p.pid}.json").read_bytes())
            except (OSError, ValueError):
                continue
            out[p.pid] = group_threads(parse_threads(data, p.pid), source_line)
            break
    return out


def stuck_lines(
    procs: Sequence[ProcInfo], groups: Mapping[int, Sequence[ThreadGroup]]
) -> list[str]:
    """One line per main thread, and per other thread group in a notable state."""
    lines: list[str] = []
    for p in procs:
        label = proc_label(p)
        if p.state in ("stopped", "zombie", "gone"):
            who = label if label.startswith("PID") else f"{label} (PID {p.pid})"
            lines.append(f"{who} is {p.state}")
        for i, g in enumerate(groups.get(p.pid, ())):
            if i == 0 or g.diagnosis.kind in _NOTABLE:
                lines.append(f"{label} {thread_label(g)} {g.diagnosis.activity}")
    return lines


def _verdict_lines(v: Verdict | None, created: float) -> list[str]:
    if v is None:
        return [f"- On-demand capture at {utc(created)} (no verdict)."]
    since = f", since {utc(v.since)}" if v.since is not None else ""
    lines = [
        f"- Verdict: **{v.state.value}**, cause `{v.cause or '-'}`, engine `{v.engine}`{since}; "
        f"verdict at {utc(v.t)}, bundle at {utc(created)}",
    ]
    if v.last_progress_t is not None or v.seconds_without_progress:
        lines.append(
            f"- No progress for {v.seconds_without_progress:.1f} s (last progress "
            f"{utc(v.last_progress_t)})"
        )
    lines += [f"  - {e}" for e in v.evidence]
    return lines


def _timeline_lines(timeline: Sequence[Mapping[str, Any]]) -> list[str]:
    ts = [float(e["t"]) for e in timeline if isinstance(e.get("t"), (int, float))]
    if not ts:
        return []
    lines = [
        f"- Timeline: {len(timeline)} record(s) from {utc(min(ts))} to {utc(max(ts))} "
        "(`timeline.jsonl`)"
    ]
    # Verdict records carry a state: list their changes, the story in one glance.
    last = None
    for e in timeline:
        state = e.get("state")
        if isinstance(state, str) and state != last and isinstance(e.get("t"), (int, float)):
            lines.append(f"  - {utc(float(e['t']))} {state} {e.get('cause') or ''}".rstrip())
            last = state
    return lines


def _process_table(procs: Sequence[ProcInfo]) -> list[str]:
    rows = ["| PID | NS PID | role | title | state | CPU s |", "|---|---|---|---|---|---|"]
    for p in procs:
        title = p.title if len(p.title) <= 80 else p.title[:77] + "..."
        rows.append(
            f"| {p.pid} | {p.ns_pid or ''} | {p.role} | `{title}` | {p.state} | {p.cpu_s:.2f} |"
        )
    return rows


def _thread_section(p: ProcInfo, groups: Sequence[ThreadGroup]) -> list[str]:
    native = all(f.native for g in groups for f in g.threads[0].frames)
    out = [
        f"### PID {p.pid}: {proc_label(p)} ({p.role}, {p.state}"
        + ("; native stacks, eu-stack)" if native else ")"),
        "",
        "| threads | where it is stuck | frame |",
        "|---|---|---|",
    ]
    for g in groups:
        out.append(f"| {thread_label(g)} | {g.diagnosis.activity} | `{g.diagnosis.frame}` |")
    out += ["", "<details><summary>stacks</summary>", "", "```text"]
    for g in groups:
        out.append(f"{thread_label(g)}:")
        frames = g.threads[0].frames
        out += [f"    {f.text()}" for f in frames[:_STACK_LINES]]
        if len(frames) > _STACK_LINES:
            folder = "native" if native else "pyspy"
            out.append(f"    ... {len(frames) - _STACK_LINES} more frames ({folder}/{p.pid}.txt)")
    return [*out, "```", "", "</details>", ""]


def _step_table(steps: Sequence[StepResult]) -> list[str]:
    rows = ["| step | status | time | detail |", "|---|---|---|---|"]
    for s in steps:
        detail = s.detail.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {s.name} | {s.status} | {s.elapsed_s:.2f} s | {detail} |")
    return rows


def render_summary(info: SummaryInput) -> str:
    """The whole ``summary.md``."""
    v = info.verdict
    what = f"{v.state.value} ({v.cause})" if v and v.cause else (v.state.value if v else "capture")
    version = info.engine_version or "unknown (the engine did not answer /version)"
    out = [f"# {info.engine} {what} at {utc(info.created)}", "", f"Engine version: {version}"]
    out += ["", "## Where it is stuck", ""]
    lines = stuck_lines(info.procs, info.groups)
    out += [f"- {line}" for line in lines] or ["- No stacks were captured (see the steps below)."]
    out += ["", "## What happened", "", *_verdict_lines(v, info.created)]
    out += [*_timeline_lines(info.timeline), "", "## Processes", "", *_process_table(info.procs)]
    out += ["", "## Threads (py-spy)", ""]
    sections = [
        _thread_section(p, info.groups[p.pid]) for p in info.procs if info.groups.get(p.pid)
    ]
    # Never an empty section: the process state may say where it is stuck, not why no stacks.
    out += [line for s in sections for line in s] or [
        "No stacks were captured (see the steps below).",
        "",
    ]
    out += ["## Capture steps", "", *_step_table(info.steps), ""]
    return "\n".join(out)


_SOURCE_MAX_BYTES = 4 << 20


def source_reader(proc_root: Path = Path("/proc")) -> SourceLine:
    """Read a source line as the target process sees its files (``/proc/PID/root``: the engine
    may live in another mount namespace, e.g. a container)."""

    def read(pid: int, filename: str, line: int) -> str | None:
        if not filename.startswith("/") or line <= 0:
            return None
        path = proc_root / str(pid) / "root" / filename.lstrip("/")
        try:
            if path.stat().st_size > _SOURCE_MAX_BYTES:
                return None
            with path.open(errors="replace") as f:
                for i, text in enumerate(f, 1):
                    if i == line:
                        return text.rstrip("\n")
        except OSError:
            return None
        return None

    return read
