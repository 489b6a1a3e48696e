"""Evaluate one rule against a bundle: matched, not matched, or unknown (the bundle lacks the data),
with the evidence that decided it (which file, which frame, line or flag)."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from engine_watchdog.hangs import cmdline as cl
from engine_watchdog.hangs.describe import describe
from engine_watchdog.hangs.gpustate import GpuState, gpu_state, matches_state
from engine_watchdog.hangs.inflight import in_flight
from engine_watchdog.hangs.schema import (
    CmdlineRule,
    EnvRule,
    FlagRule,
    FlightRecorderRule,
    FrameRule,
    GpuModelRule,
    GpuRule,
    LogRule,
    MultiNodeRule,
    Rule,
    VersionRule,
)
from engine_watchdog.hangs.topology import several_nodes
from engine_watchdog.hangs.versions import in_range
from engine_watchdog.hangs.view import BundleView, FrameView, GpuView, ProcView

Status = Literal["matched", "not-matched", "unknown"]
MAX_EVIDENCE = 4


@dataclass(frozen=True)
class Evidence:
    file: str
    detail: str


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    status: Status
    evidence: tuple[Evidence, ...] = ()
    note: str = ""
    """Why it is unknown or not matched, in a few words."""
    credit: float = 1.0
    """The share of the rule's weight a match earns: below 1 when the evidence is indirect (a
    spinning GPU read from NVML alone, without GPM)."""


Found = tuple[bool | None, list[Evidence], str]
"""(condition holds, or None when unknown; evidence; note)."""


def evaluate(rule: Rule, view: BundleView) -> RuleResult:
    if isinstance(rule, GpuRule):
        hit, evidence, note, credit = _gpu(rule, view)
    else:
        hit, evidence, note = _EVALUATORS[type(rule)](rule, view)
        credit = 1.0
    if hit is None:
        return RuleResult(rule, "unknown", (), note)
    if not rule.negate:
        status: Status = "matched" if hit else "not-matched"
        return RuleResult(rule, status, tuple(evidence[:MAX_EVIDENCE]), note, credit)
    if hit:  # present, where this hang has it absent
        return RuleResult(rule, "not-matched", tuple(evidence[:MAX_EVIDENCE]), "present")
    absent = Evidence(_source(rule), f"not found: {describe(rule, negated=False)}")
    return RuleResult(rule, "matched", (absent,), "absent")


def _source(rule: Rule) -> str:
    return {
        FrameRule: "pyspy/",
        GpuRule: "gpu.json",
        GpuModelRule: "gpu.json",
        FlightRecorderRule: "flight_recorder/",
        LogRule: "engine.log",
        VersionRule: "engine.log",
        MultiNodeRule: "processes.json",
    }.get(type(rule), "processes.json")


def _roles(procs: Sequence[ProcView], role: str) -> list[ProcView]:
    return [p for p in procs if role == "any" or p.role == role]


@dataclass(frozen=True)
class _Pattern:
    func: str
    glob: re.Pattern[str] | None
    file: str

    def hit(self, frame: FrameView) -> bool:
        if self.file and self.file not in frame.file and self.file not in frame.short:
            return False
        if self.glob is None:
            return frame.func == self.func or frame.name == self.func
        return bool(self.glob.match(frame.func) or self.glob.match(frame.name))


@functools.lru_cache(maxsize=1024)
def _pattern(text: str) -> _Pattern:
    """``func`` or ``func@file``; ``*?[`` in ``func`` make it a glob (fnmatch)."""
    func, _, file = text.partition("@")
    glob = re.compile(fnmatch.translate(func)) if any(c in func for c in "*?[") else None
    return _Pattern(func, glob, file)


def _thread_hit(frames: tuple[FrameView, ...], rule: FrameRule) -> list[FrameView] | None:
    hits = []
    for pat in map(_pattern, rule.frames):
        f = next((f for f in frames if pat.hit(f)), None)
        if f is None:
            return None
        hits.append(f)
    if rule.any_frames:
        pats = [_pattern(p) for p in rule.any_frames]
        f = next((f for f in frames if any(p.hit(f) for p in pats)), None)
        if f is None:
            return None
        hits.append(f)
    return hits


def _proc_hit(p: ProcView, rule: FrameRule) -> Evidence | None:
    """The first thread of ``p`` whose stack matches (each distinct stack tried once)."""
    tried: set[int] = set()
    for th in p.threads or ():
        if id(th.frames) in tried:  # identical stacks share one tuple (view._threads)
            continue
        tried.add(id(th.frames))
        got = _thread_hit(th.frames, rule)
        if got is not None:
            where = f"PID {p.pid} ({p.role}) thread {th.name or th.tid}"
            return Evidence(p.stacks_file, f"{where}: {' <- '.join(f.text() for f in got)}")
    return None


def _frames(rule: FrameRule, view: BundleView) -> Found:
    with_stacks = [p for p in _roles(view.procs, rule.role) if p.threads is not None]
    if not with_stacks:
        return None, [], f"no stacks of a {rule.role} process"
    ev = [e for e in (_proc_hit(p, rule) for p in with_stacks) if e is not None]
    ok = len(ev) == len(with_stacks) if rule.processes == "all" else bool(ev)
    return ok, ev, f"{len(ev)} of {len(with_stacks)} process(es) with stacks"


def _gpu_text(g: GpuView, s: GpuState) -> str:
    if s.how:
        return f"GPU {g.index} {g.name}: {s.state} ({s.how})"
    util = "" if g.util_pct is None else f", util {g.util_pct:g} %"
    power = "" if g.power_w is None else f", {g.power_w:g} W"
    return f"GPU {g.index} {g.name}: {g.classification}{util}{power}"


def _gpu(rule: GpuRule, view: BundleView) -> tuple[bool | None, list[Evidence], str, float]:
    read = [(g, gpu_state(g)) for g in view.gpus or ()]
    gpus = [(g, s) for g, s in read if s.state != "unknown"]
    if not gpus:
        return None, [], "no GPU classification in the bundle", 1.0
    hits = [(g, s, c) for g, s in gpus if (c := matches_state(s, rule.state)) > 0]
    if rule.scope == "all":
        ok = len(hits) == len(gpus)
    elif rule.scope == "split":
        hit_ids = {g.index for g, _, _ in hits}
        peers = [
            (g, s, c)
            for g, s in gpus
            if g.index not in hit_ids and (c := matches_state(s, rule.peer_state)) > 0
        ]
        ok, hits = bool(hits) and bool(peers), hits + peers
    else:
        ok = bool(hits)
    credits = [c for _, _, c in hits]
    credit = (max(credits) if rule.scope == "any" else min(credits)) if ok else 1.0
    shown = [(g, s) for g, s, _ in hits] if hits else gpus
    text = "; ".join(_gpu_text(g, s) for g, s in shown)
    note = "read from NVML alone (no GPM): half weight" if ok and credit < 1 else ""
    return ok, [Evidence("gpu.json", text)], note, credit


def _gpu_model(rule: GpuModelRule, view: BundleView) -> Found:
    if not view.gpus:
        return None, [], "no GPU snapshot"
    hits = [g for g in view.gpus if any(n.lower() in g.name.lower() for n in rule.names)]
    return bool(hits), [Evidence("gpu.json", f"GPU {g.index}: {g.name}") for g in hits], ""


def _flight(rule: FlightRecorderRule, view: BundleView) -> Found:
    cols = view.collectives
    if not cols:
        return None, [], "no readable flight-recorder dump"
    ev = [Evidence(c.file, f"rank {c.rank}: last {c.op} seq {c.seq} {c.state}") for c in cols]
    if rule.mismatch:
        if len(cols) < 2:
            return None, [], "one rank's dump only"
        return len({(c.op, c.seq) for c in cols}) > 1, ev, ""
    hits = [
        e
        for c, e in zip(cols, ev, strict=True)
        if rule.op in c.op and (not rule.state or c.state == rule.state)
    ]
    return bool(hits), hits, ""


def _line_hit(line: str, rule: LogRule) -> bool:
    if rule.any_of and not any(s in line for s in rule.any_of):
        return False
    return all(s in line for s in rule.all_of) and not any(s in line for s in rule.none_of)


def _log(rule: LogRule, view: BundleView) -> Found:
    if view.log is None:
        return None, [], "no engine.log in the bundle"
    hits = [(i, line) for i, line in enumerate(view.log, 1) if _line_hit(line, rule)]
    if len(hits) >= rule.min_count and rule.only_with_requests:
        work = in_flight(view)
        if work.busy is None:
            return None, [], "the line alone is no hang, and nothing says requests were in flight"
        if not work.busy:
            return False, [], f"no request running or waiting ({work.file}, {work.detail})"
        line_ev = _log_evidence(hits, len(view.log))
        return True, [*line_ev, Evidence(work.file, f"requests in flight: {work.detail}")], ""
    ev = _log_evidence(hits, len(view.log))
    return len(hits) >= rule.min_count, ev, f"{len(hits)} matching line(s)"


def _log_evidence(hits: list[tuple[int, str]], total: int) -> list[Evidence]:
    shown = hits[:2] + hits[-1:] if len(hits) > 3 else hits
    ev = [Evidence("engine.log", f"line {i} of {total}: {line.strip()[:240]}") for i, line in shown]
    if len(hits) > 3:
        ev.insert(2, Evidence("engine.log", f"... {len(hits)} matching lines in all"))
    return ev


def _with_cmdline(view: BundleView, role: str) -> list[ProcView]:
    return [p for p in _roles(view.procs, role) if p.cmdline]


def _flag(rule: FlagRule, view: BundleView) -> Found:
    procs = _with_cmdline(view, rule.role)
    if not procs:
        return None, [], "no command line in processes.json"
    for p in procs:
        found = cl.flag_check(p.cmdline, rule.names, rule.value_contains, rule.min_value)
        if found is not None:
            return True, [Evidence("processes.json", f"PID {p.pid} ({p.role}): {found}")], ""
    return False, [], "not on the command line"


def _cmdline(rule: CmdlineRule, view: BundleView) -> Found:
    procs = _with_cmdline(view, rule.role)
    if not procs:
        return None, [], "no command line in processes.json"
    for p in procs:
        word = cl.contains_any(p.cmdline, rule.any_of)
        if word is not None:
            return True, [Evidence("processes.json", f"PID {p.pid} ({p.role}): {word}")], ""
    return False, [], "not on the command line"


def _env(rule: EnvRule, view: BundleView) -> Found:
    procs = [p for p in _roles(view.procs, rule.role) if p.environ]
    if not procs:
        return None, [], "no environment in processes.json"
    for p in procs:
        value = p.environ.get(rule.name)
        if value is not None and (rule.equals is None or value == rule.equals):
            return True, [Evidence("processes.json", f"PID {p.pid}: {rule.name}={value}")], ""
    return False, [], f"{rule.name} not set that way"


def _version(rule: VersionRule, view: BundleView) -> Found:
    if rule.component == "nccl":
        return _nccl_version(rule, view)
    if not view.engine_version:
        return None, [], "the engine's version is not in the bundle"
    ok = in_range(view.engine_version, rule.min_version, rule.max_version)
    if ok is None:
        return None, [], f"version {view.engine_version!r} not comparable"
    return ok, [Evidence("engine.log", f"engine version {view.engine_version}")], ""


def _nccl_version(rule: VersionRule, view: BundleView) -> Found:
    if not view.nccl_version:
        return None, [], "NCCL's version is not in the bundle"
    ok = in_range(view.nccl_version, rule.min_version, rule.max_version)
    if ok is None:
        return None, [], f"NCCL version {view.nccl_version!r} not comparable"
    return ok, [Evidence("engine.log", f"NCCL version {view.nccl_version}")], ""


def _multi_node(rule: MultiNodeRule, view: BundleView) -> Found:
    ok, found, note = several_nodes(view)
    return ok, [Evidence(f, d) for f, d in found], note


_EVALUATORS: dict[type[Rule], Callable[..., Found]] = {
    FrameRule: _frames,
    MultiNodeRule: _multi_node,
    GpuModelRule: _gpu_model,
    FlightRecorderRule: _flight,
    LogRule: _log,
    FlagRule: _flag,
    CmdlineRule: _cmdline,
    EnvRule: _env,
    VersionRule: _version,
}
