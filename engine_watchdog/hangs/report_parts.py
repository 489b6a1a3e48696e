"""The pieces of report.md, each a list of markdown lines built from a :class:`BundleView`.

Pure. Text from the bundle goes through :func:`~engine_watchdog.core.redact.redact_text` here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from engine_watchdog.core.redact import redact_text
from engine_watchdog.hangs import stacks, timeline
from engine_watchdog.hangs.group import culprit_lines
from engine_watchdog.hangs.view import BundleView, FrameView, ProcView

NOT_IN_BUNDLE = "not in the bundle"
_ROLE_ORDER = {"engine-core": 0, "worker": 1, "api-server": 2, "dp-coordinator": 3}


def utc(t: Any) -> str:
    if isinstance(t, bool) or not isinstance(t, int | float):
        return "-"
    try:
        return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return "-"


def fence(lines: Sequence[str], lang: str = "text") -> list[str]:
    """A code block whose fence cannot be closed by the content."""
    body = [line.replace("```", "'''") for line in lines]
    return [f"```{lang}", *body, "```"]


def environment(view: BundleView) -> list[str]:
    v = view.versions
    host_rec = v.get("host")
    host: Mapping[str, Any] = host_rec if isinstance(host_rec, Mapping) else {}
    gpus = view.gpus or ()
    names = sorted({g.name for g in gpus if g.name})
    gpu = f"{len(gpus)}x {', '.join(names)}" if gpus else NOT_IN_BUNDLE
    engine_version = view.engine_version or f"(version {NOT_IN_BUNDLE})"
    host_text = " ".join(str(host.get(k, "")) for k in ("system", "release", "machine")).strip()
    watchdog = v.get("engine_watchdog") or view.manifest.get("engine_watchdog") or "?"
    lines = [
        f"engine: {view.engine or 'unknown'} {engine_version}",
        f"GPU: {gpu}",
        f"NVIDIA driver: {view.gpu_driver or NOT_IN_BUNDLE}",
        f"CUDA: {view.cuda_version or NOT_IN_BUNDLE}",
        f"NCCL: {view.nccl_version or NOT_IN_BUNDLE}",
        f"Python (watchdog): {v.get('python') or NOT_IN_BUNDLE}",
        f"host: {host_text or NOT_IN_BUNDLE}",
        f"engine-watchdog: {watchdog}",
        f"py-spy: {v.get('py_spy') or NOT_IN_BUNDLE}",
    ]
    return fence([redact_text(line) for line in lines])


def describe_bug(view: BundleView) -> list[str]:
    m = view.manifest
    verdict = m.get("verdict") if isinstance(m.get("verdict"), Mapping) else None
    if verdict is None:
        head = f"An on-demand capture at {utc(m.get('created_unix'))}: the engine looked stuck."
        return [head, ""]
    secs = verdict.get("seconds_without_progress")
    lines = [*culprit_lines(view.group), ""] if view.group is not None else []
    lines += [
        f"The engine stopped making progress: engine-watchdog judged it **{verdict.get('state')}** "
        f"(cause `{verdict.get('cause') or '-'}`) at {utc(verdict.get('t'))}, after "
        f"{secs if isinstance(secs, int | float) else '?'} s without progress (last progress "
        f"{utc(verdict.get('last_progress_t'))}). /health and /metrics may still answer: "
        "a hung engine core does not fail them."
    ]
    evidence = verdict.get("evidence") if isinstance(verdict.get("evidence"), list) else []
    lines += [f"- {redact_text(str(e))[:300]}" for e in evidence[:20]]
    return [*lines, *_steps(m), ""]


def _steps(manifest: Mapping[str, Any]) -> list[str]:
    listed = manifest.get("steps")
    steps = listed if isinstance(listed, list) else []
    done = [f"{s.get('name')} {s.get('status')}" for s in steps[:20] if isinstance(s, Mapping)]
    return ["", f"Capture steps: {', '.join(done)}."] if done else []


def command_lines(view: BundleView, max_arg: int = 0) -> list[str]:
    """Each distinct engine command line, as the bundle holds it (already redacted)."""
    seen: set[tuple[str, ...]] = set()
    out: list[str] = []
    first = {"api-server": 0}
    for p in sorted(view.procs, key=lambda p: (first.get(p.role, 1), p.pid)):
        # A process that set its title (VLLM::EngineCore) shows the title as its command line.
        if len(p.cmdline) < 2 or p.cmdline in seen:
            continue
        seen.add(p.cmdline)
        args = [a if not max_arg or len(a) <= max_arg else a[:max_arg] + "..." for a in p.cmdline]
        out.append(f"# PID {p.pid} ({p.role})")
        out.append(redact_text(" ".join(_quote(a) for a in args)))
    return fence(out, "bash") if out else [f"(command line {NOT_IN_BUNDLE})"]


def _quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "-_./=:,+@%" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"


def timeline_table(view: BundleView, before: int, after: int) -> list[str]:
    pts = timeline.points(view.timeline, view.engine)
    if not pts:
        return [f"(no metrics scrapes in timeline.jsonl: {NOT_IN_BUNDLE})"]
    all_rows = timeline.rows(pts)
    verdict = view.manifest.get("verdict")
    freeze = timeline.last_progress(pts)
    if freeze is None and isinstance(verdict, Mapping):
        lp = verdict.get("last_progress_t")
        freeze = float(lp) if isinstance(lp, int | float) and not isinstance(lp, bool) else None
    shown = timeline.around(all_rows, freeze, before, after)
    out = [
        f"Last token progress: {utc(freeze)}. {len(all_rows)} scrapes in the bundle, "
        f"{len(shown)} shown.",
        "",
        "| time (UTC) | running | waiting | generation tokens/s |",
        "|---|---|---|---|",
    ]
    for r in shown:
        mark = " (after the freeze)" if freeze is not None and r.t > freeze else ""
        out.append(f"| {utc(r.t)}{mark} | {_n(r.running)} | {_n(r.waiting)} | {_n(r.rate, 1)} |")
    return out


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def where_stuck(view: BundleView, limit: int) -> list[str]:
    lines = stacks.where_lines(view.summary_md) or stacks.fallback_where(view.procs)
    if not lines:
        return ["(no stacks were captured; see the capture steps in manifest.json)"]
    cut = [redact_text(line)[:400] for line in lines[:limit]]
    if len(lines) > limit:
        cut.append(f"- ... {len(lines) - limit} more in summary.md")
    return cut


def stack_sections(
    view: BundleView, roles: Sequence[str] | None, max_frames: int, main_only: bool
) -> list[str]:
    out: list[str] = []
    procs = [p for p in view.procs if p.threads and (roles is None or p.role in roles)]
    shown: dict[tuple[tuple[FrameView, ...], ...], ProcView] = {}
    for p in sorted(procs, key=lambda p: (_ROLE_ORDER.get(p.role, 9), p.pid)):
        # TP ranks often hold the very same stacks: show them once, name the others.
        key = tuple(g.frames for g in stacks.groups(p))
        if key in shown:
            first = shown[key]
            out += [
                redact_text(
                    f"- PID {p.pid} {p.title or p.role}: the same stacks as PID {first.pid}"
                ),
                "",
            ]
            continue
        shown[key] = p
        out += _proc_stacks(p, max_frames, main_only)
    return out or ["(no stacks in the bundle)", ""]


def _proc_stacks(p: ProcView, max_frames: int, main_only: bool) -> list[str]:
    gs = stacks.groups(p)
    shown = gs[:1] if main_only else gs
    body: list[str] = []
    for g in shown:
        body += stacks.render_group(g, p.pid, max_frames)
    if len(gs) > len(shown):
        body.append(f"({len(gs) - len(shown)} more thread group(s) in pyspy/{p.pid}.txt)")
    title = redact_text(
        f"PID {p.pid} {p.title or p.role} ({p.role}, {p.state or '?'}): {len(gs)} distinct stack(s)"
    )
    return [
        f"<details><summary>{title}</summary>",
        "",
        *fence([redact_text(b) for b in body]),
        "",
        "</details>",
        "",
    ]


def actions_table(view: BundleView, last: int) -> list[str]:
    """What was tried in this bundle's incident, for its target: the incident dir's history
    holds every incident's and every target's (and, before records and manifests named their
    incident, nothing says which is whose: those are left out)."""
    if not view.actions:
        return ["(no actions.jsonl beside the bundle: nothing recorded as tried)"]
    incident, target = view.manifest.get("incident"), view.manifest.get("target")
    if not isinstance(incident, str) or not incident:
        return [
            "(the bundle names no incident: on demand, or written before bundles named theirs; "
            "the action history beside it holds other incidents' records and is not listed)"
        ]
    acts = [
        a
        for a in view.actions
        if a.get("incident") == incident
        and (not isinstance(target, str) or a.get("target") == target)
    ][-last:]
    if not acts:
        return [f"(nothing recorded as tried in incident {redact_text(incident)})"]
    out = ["| time (UTC) | target | action | result | detail |", "|---|---|---|---|---|"]
    for a in acts:
        cells = [utc(a.get("t"))] + [
            redact_text(str(a.get(k, "")))[:200] for k in ("target", "action", "result", "detail")
        ]
        out.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    return out


def log_tail(view: BundleView, lines: int) -> list[str]:
    if view.log is None:
        return [f"(engine.log {NOT_IN_BUNDLE})"]
    tail = view.log[-lines:]
    return fence([redact_text(line)[:1000] for line in tail])
