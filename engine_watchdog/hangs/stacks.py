"""Deduplicated stacks for the report, and the "where it is stuck" lines of summary.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine_watchdog.hangs.view import FrameView, ProcView, ThreadView

WHERE_HEADING = "## Where it is stuck"


@dataclass(frozen=True)
class StackGroup:
    threads: tuple[ThreadView, ...]

    @property
    def frames(self) -> tuple[FrameView, ...]:
        return self.threads[0].frames

    def label(self, pid: int) -> str:
        first = self.threads[0]
        if len(self.threads) == 1:
            main = first.tid == pid or first.name == "MainThread"
            return f'thread {first.tid} "{first.name}"' + (" (main)" if main else "")
        names = sorted({t.name or str(t.tid) for t in self.threads})
        shown = ", ".join(f'"{n}"' for n in names[:3]) + (", ..." if len(names) > 3 else "")
        return f"{len(self.threads)} threads ({shown})"


def groups(proc: ProcView) -> list[StackGroup]:
    """Identical stacks of one process together; the main thread's group first."""
    by_frames: dict[tuple[FrameView, ...], list[ThreadView]] = {}
    ordered = sorted(
        proc.threads or (), key=lambda t: (t.tid != proc.pid and t.name != "MainThread", t.tid)
    )
    for th in ordered:
        by_frames.setdefault(th.frames, []).append(th)
    return [StackGroup(tuple(ths)) for ths in by_frames.values()]


def render_group(group: StackGroup, pid: int, max_frames: int) -> list[str]:
    out = [f"{group.label(pid)}:"]
    out += [f"    {f.text()}" for f in group.frames[:max_frames]]
    if len(group.frames) > max_frames:
        out.append(f"    ... {len(group.frames) - max_frames} more frames (pyspy/{pid}.txt)")
    return out


def where_lines(summary_md: str) -> list[str]:
    """The bullet lines of summary.md's "Where it is stuck" section (the bundle writer's own
    diagnosis, engine_watchdog/capture/frames.py); empty when the bundle has no summary."""
    lines = summary_md.splitlines()
    try:
        start = lines.index(WHERE_HEADING) + 1
    except ValueError:
        return []
    out = []
    for line in lines[start:]:
        if line.startswith("## "):
            break
        if line.startswith("- "):
            out.append(line)
    return out


def fallback_where(procs: Sequence[ProcView]) -> list[str]:
    """Without summary.md: each process's main thread and its innermost Python frame."""
    out = []
    for p in procs:
        gs = groups(p)
        if not gs:
            continue
        py = next((f for f in gs[0].frames if not f.native), None)
        top = gs[0].frames[0] if gs[0].frames else None
        where = py or top
        if where is not None:
            native = (
                f", innermost native {top.name}" if top and top.native and top is not where else ""
            )
            out.append(f"- PID {p.pid} ({p.role}) main thread in {where.text()}{native}")
    return out
