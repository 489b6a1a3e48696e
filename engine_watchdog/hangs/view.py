"""A bundle as the matcher and the report see it, built from the raw bytes of its files.

Pure: :func:`build_view` takes what :func:`~engine_watchdog.hangs.files.read_bundle_files` read
and never raises for what the files hold. Bad JSON, a wrong shape, a huge list: each becomes a
note, and what it would have said becomes "unknown" to the rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine_watchdog.hangs.collectives import CollectiveView, parse_collectives
from engine_watchdog.hangs.files import ACTIONS, RawBundle
from engine_watchdog.hangs.group import GROUP_FILE, group_of
from engine_watchdog.hangs.versions import engine_versions

MAX_THREADS = 2000
MAX_FRAMES = 400
MAX_TEXT = 300
MAX_LOG_LINES = 50_000
MAX_LINE = 2000
MAX_RECORDS = 20_000


@dataclass(frozen=True)
class FrameView:
    name: str
    file: str
    short: str
    line: int
    native: bool
    func: str = ""
    """The function's own name (``Thread.run`` -> ``run``)."""

    def text(self) -> str:
        return (
            f"{self.name} ({self.short}:{self.line})"
            if self.line
            else f"{self.name} ({self.short})"
        )


@dataclass(frozen=True)
class ThreadView:
    tid: int
    name: str
    active: bool
    frames: tuple[FrameView, ...]


@dataclass(frozen=True)
class ProcView:
    pid: int
    role: str
    title: str
    state: str
    cmdline: tuple[str, ...]
    environ: Mapping[str, str]
    threads: tuple[ThreadView, ...] | None
    """None: no stacks for this process (py-spy failed or was not run)."""

    @property
    def stacks_file(self) -> str:
        return f"pyspy/{self.pid}.json"


@dataclass(frozen=True)
class GpuView:
    index: int
    name: str
    classification: str
    util_pct: float | None
    power_w: float | None
    mem_util_pct: float | None = None
    """NVML's memory-controller utilisation (DRAM traffic), read on every GPU NVML supports."""
    sm_clock_mhz: float | None = None
    power_limit_w: float | None = None
    gpm: bool = False
    """GPM figures were read (Hopper and later): the classification can tell a spin from work."""


@dataclass(frozen=True)
class BundleView:
    name: str
    engine: str
    manifest: Mapping[str, Any]
    procs: tuple[ProcView, ...]
    gpus: tuple[GpuView, ...] | None
    """None: no usable GPU snapshot (no NVML, no GPU, or the step failed)."""
    gpu_driver: str
    collectives: tuple[CollectiveView, ...] | None
    log: tuple[str, ...] | None
    versions: Mapping[str, Any]
    timeline: tuple[Mapping[str, Any], ...]
    actions: tuple[Mapping[str, Any], ...]
    summary_md: str
    engine_version: str
    nccl_version: str
    cuda_version: str
    notes: tuple[str, ...]
    group: Mapping[str, Any] | None = None
    """A multi-node bundle's nodes/group.json (every node's answer, the culprit); None else."""


def build_view(raw: RawBundle) -> BundleView:
    """Everything the rules and the report read, from the files' bytes."""
    notes = list(raw.notes)
    manifest = _json(raw, "manifest.json", notes)
    manifest = manifest if isinstance(manifest, dict) else {}
    versions = _json(raw, "versions.json", notes)
    versions = versions if isinstance(versions, dict) else {}
    log = _log_lines(raw.files.get("engine.log"))
    gpus, driver = _gpus(_json(raw, "gpu.json", notes), notes)
    found = engine_versions(manifest, versions, log or ())
    procs = _procs(raw, manifest, notes)
    return BundleView(
        name=str(manifest.get("name") or raw.name),
        engine=str(manifest.get("engine") or "") or engine_of(procs),
        manifest=manifest,
        procs=procs,
        gpus=gpus,
        gpu_driver=driver,
        collectives=parse_collectives(raw.files, notes),
        log=log,
        versions=versions,
        timeline=_jsonl(raw.files.get("timeline.jsonl"), "timeline.jsonl", notes),
        actions=_jsonl(raw.files.get(ACTIONS), "actions.jsonl", notes),
        summary_md=raw.files.get("summary.md", b"").decode("utf-8", "replace"),
        engine_version=found.engine,
        nccl_version=found.nccl,
        cuda_version=found.cuda,
        notes=tuple(notes),
        group=group_of(raw.files.get(GROUP_FILE)),
    )


_ENGINE_WORDS = (
    ("vllm", ("vllm", "VLLM::")),
    ("sglang", ("sglang",)),
    ("llamacpp", ("llama-server",)),
    ("trtllm", ("trtllm-serve", "tritonserver", "tensorrt_llm")),
)


def engine_of(procs: tuple[ProcView, ...]) -> str:
    """The engine a bundle without a manifest's ``engine`` runs, from its processes' command
    lines and titles ("" when none says)."""
    for p in procs:
        text = " ".join((p.title, *p.cmdline[:3]))
        for engine, words in _ENGINE_WORDS:
            if any(w in text for w in words):
                return engine
    return ""


def _json(raw: RawBundle, rel: str, notes: list[str]) -> Any:
    data = raw.files.get(rel)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        cut = " (cut at the size limit)" if rel in raw.truncated else ""
        notes.append(f"{rel}: not valid JSON{cut}, ignored")
        return None


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return str(value)[:limit] if value is not None else ""


def _int(value: Any) -> int:
    try:
        return int(value) if not isinstance(value, bool) else 0
    except (TypeError, ValueError, OverflowError):
        return 0


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _procs(raw: RawBundle, manifest: Mapping[str, Any], notes: list[str]) -> tuple[ProcView, ...]:
    listed = manifest.get("processes")
    records = _json(raw, "processes.json", notes)
    by_pid: dict[int, dict[str, Any]] = {}
    for source in (listed, records):
        for rec in source if isinstance(source, list) else []:
            if isinstance(rec, dict) and _int(rec.get("pid")) > 0:
                by_pid.setdefault(_int(rec["pid"]), {}).update(rec)
    for rel in raw.files:
        if rel.startswith("pyspy/") and rel.endswith(".json"):
            pid = _int(rel[len("pyspy/") : -len(".json")])
            if pid > 0:
                by_pid.setdefault(pid, {"pid": pid})
    return tuple(_proc(pid, rec, raw, notes) for pid, rec in sorted(by_pid.items())[:256])


def _proc(pid: int, rec: Mapping[str, Any], raw: RawBundle, notes: list[str]) -> ProcView:
    cmd = rec.get("cmdline")
    env = rec.get("environ")
    stacks = _json(raw, f"pyspy/{pid}.json", notes)
    return ProcView(
        pid=pid,
        role=_text(rec.get("role") or "other", 40),
        title=_text(rec.get("title")),
        state=_text(rec.get("state"), 40),
        cmdline=tuple(_text(a, 4096) for a in cmd[:512]) if isinstance(cmd, list) else (),
        environ={_text(k): _text(v, 4096) for k, v in list(env.items())[:1024]}
        if isinstance(env, dict)
        else {},
        threads=_threads(stacks) if isinstance(stacks, list) else None,
    )


def _threads(data: list[Any]) -> tuple[ThreadView, ...]:
    out = []
    # Identical stacks share one tuple, so the rules can try each distinct stack once (by id).
    shared: dict[tuple[FrameView, ...], tuple[FrameView, ...]] = {}
    for th in data[:MAX_THREADS]:
        if not isinstance(th, dict):
            continue
        listed = th.get("frames")
        raw = listed[:MAX_FRAMES] if isinstance(listed, list) else []
        frames = tuple(_frame(f) for f in raw if isinstance(f, dict))
        frames = shared.setdefault(frames, frames)
        tid = _int(th.get("os_thread_id") or th.get("thread_id"))
        out.append(ThreadView(tid, _text(th.get("thread_name")), bool(th.get("active")), frames))
    return tuple(out)


def _frame(f: Mapping[str, Any]) -> FrameView:
    raw_line = f.get("line")
    line = raw_line if type(raw_line) is int else _int(raw_line)
    file = _text(f.get("filename"), 1000)
    short = _text(f.get("short_filename")) or file.rsplit("/", 1)[-1]
    native = f.get("module") is not None or line == 0
    name = _text(f.get("name")) or "?"
    return FrameView(name, file, short, line, native, _own_name(name, native))


def _own_name(name: str, native: bool) -> str:
    """The function's own name: ``Thread.run`` -> ``run``; for a native frame also without the
    C++ return type, namespaces, template arguments and parameters, so a pattern can name the
    culprit kernel's launcher (``void flashinfer::sampling::RadixTopKMaskLogitsMultiCTA<float,
    int>(float*, ...)`` -> ``RadixTopKMaskLogitsMultiCTA``)."""
    if not native or ("::" not in name and "<" not in name and "(" not in name):
        return name.rsplit(".", 1)[-1]
    flat, depth = [], 0
    for ch in name:  # drop everything inside <...> and (...), nested or not
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif not depth:
            flat.append(ch)
    own = "".join(flat).strip().rsplit("::", 1)[-1].split()
    return own[-1] if own else name


def _gpus(snap: Any, notes: list[str]) -> tuple[tuple[GpuView, ...] | None, str]:
    if not isinstance(snap, dict):
        return None, ""
    if not snap.get("available"):
        notes.append(f"gpu.json: no GPU data ({_text(snap.get('reason')) or 'not available'})")
        return None, ""
    out = []
    listed = snap.get("gpus")
    for g in listed if isinstance(listed, list) else []:
        if not isinstance(g, dict):
            continue
        util = g.get("utilization_pct")
        util = util if isinstance(util, dict) else {}
        out.append(
            GpuView(
                index=_int(g.get("index")),
                name=_text(g.get("name")),
                classification=_text(g.get("classification") or "unknown", 20),
                util_pct=_num(util.get("gpu")),
                power_w=_num(g.get("power_w")),
                mem_util_pct=_num(util.get("memory")),
                sm_clock_mhz=_num(g.get("sm_clock_mhz")),
                power_limit_w=_num(g.get("power_limit_w")),
                gpm=isinstance(g.get("gpm_pct"), dict) and bool(g.get("gpm_pct")),
            )
        )
    return (tuple(out) or None), _text(snap.get("driver_version"), 60)


def _log_lines(data: bytes | None) -> tuple[str, ...] | None:
    if data is None:
        return None
    lines = data.decode("utf-8", "replace").splitlines()[-MAX_LOG_LINES:]
    return tuple(line[:MAX_LINE] for line in lines)


def _jsonl(data: bytes | None, rel: str, notes: list[str]) -> tuple[Mapping[str, Any], ...]:
    if data is None:
        return ()
    out: list[Mapping[str, Any]] = []
    bad = 0
    for line in data.splitlines()[-MAX_RECORDS:]:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            bad += 1
    if bad:
        notes.append(f"{rel}: {bad} unreadable line(s) skipped")
    return tuple(out)
