"""Write an incident bundle: ``<incident dir>/<UTC time>-<engine>-<cause>/`` (or ``.tar.gz``).

The bundle is built in a hidden sibling directory (locked while it is built, so a dead writer's
is told from a live one's: capture/retention.py) and renamed into place, so a reader never sees
half a bundle; a write that fails (a full disk) removes the temporary directory and raises
:class:`BundleError`. Steps run concurrently, each under its own timeout; a failed step is
recorded in the manifest and the others go on. File I/O of any size runs in threads: the watch
loop that calls :func:`write_bundle` is never blocked. The manifest schema is in docs/bundle.md.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine_watchdog.capture import evidence
from engine_watchdog.capture.known_hangs import KnownHangs, known_hangs
from engine_watchdog.capture.manifest import draft_manifest, finish_manifest
from engine_watchdog.capture.retention import (
    cannot_write,
    fallback_dir,
    new_tmp_dir,
    prune,
    release,
    tar_into_place,
)
from engine_watchdog.capture.step import (
    SAMPLES_AGAIN,
    WAKES_THE_ENGINE,
    CaptureContext,
    CaptureStep,
    StepResult,
)
from engine_watchdog.capture.summary import SummaryInput, load_groups, render_summary, source_reader
from engine_watchdog.core.model import ProcInfo, Verdict, incident_id
from engine_watchdog.core.redact import Masker
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.hangs.group import GROUP_FILE, culprit_lines, group_of
from engine_watchdog.host.tools import resolve_tools, write_private

_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
log = logging.getLogger(__name__)


class BundleError(Exception):
    """The bundle could not be written; nothing partial was left. The message names the fix."""


@dataclass(frozen=True)
class BundleSettings:
    """One bundle's job: the operator's capture settings, and what this capture adds."""

    capture: CaptureSettings = field(default_factory=CaptureSettings)
    """Where and how bundles are written (the --incident-dir, --engine-log, --tar options)."""
    engine: str = "vllm"
    target: str = ""
    """The engine's URL as every report shows it (credentials redacted), into the manifest:
    a report reads the action history of this target's incident only."""
    destructive: bool = False
    """True only as part of a restart (lets a CUDA core dump run)."""
    step_grace_s: float = 2.0
    """Extra time before a step that overruns its own bound is abandoned."""
    tools: Mapping[str, str] | None = None
    """Tool paths (py-spy, cuda-gdb); None resolves them from PATH."""
    proc_root: Path = Path("/proc")
    clock: Callable[[], float] = time.time
    """Wall-clock seconds (tests pin it)."""
    engine_version: Callable[[], Awaitable[str | None]] | None = None
    """Asks the engine its version (bounded), while the steps run; None: not asked."""
    pod_log: Callable[[], Awaitable[bytes]] | None = None
    """Reads the engine container's log through the Kubernetes API (capture/pod_log.py), while
    the steps run, for engine.log when no --engine-log file is named; None: not read."""

    @property
    def incident_dir(self) -> Path:
        return self.capture.incident_dir


@dataclass(frozen=True)
class BundleResult:
    path: Path
    """The bundle directory, or the ``.tar.gz`` with ``tar``."""
    manifest: dict[str, Any]
    steps: tuple[StepResult, ...]
    elapsed_s: float
    removed: tuple[str, ...] = field(default_factory=tuple)
    """Old bundles removed by retention."""
    signature: str = "none"
    """The known hang it resembles most (a signature id), or "none"."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def bundle_name(created: float, engine: str, cause: str) -> str:
    """``20261130T055012Z-vllm-stopped``: sorts by time, safe in any file system."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(created))
    return f"{stamp}-{_slug(engine)}-{_slug(cause)}"


async def _run_step(step: CaptureStep, ctx: CaptureContext, grace_s: float) -> StepResult:
    """Run one step under its bound. Disk-full errors propagate (the bundle is lost anyway)."""
    name = getattr(step, "__name__", "step")
    t0 = time.monotonic()
    try:
        res = await asyncio.wait_for(step(ctx), ctx.timeout_s + grace_s)
    except asyncio.TimeoutError:
        return StepResult(
            name,
            "timeout",
            detail=f"no result within {ctx.timeout_s:.0f} s",
            elapsed_s=time.monotonic() - t0,
        )
    except OSError as e:
        if e.errno in _DISK_ERRNOS:
            raise
        res = StepResult(name, "failed", detail=f"{type(e).__name__}: {e}")
    except Exception as e:  # a buggy step must not cost the other steps' evidence
        res = StepResult(name, "failed", detail=f"{type(e).__name__}: {e}")
    return res if res.elapsed_s else replace(res, elapsed_s=time.monotonic() - t0)


async def _run_steps(
    steps: Sequence[CaptureStep], ctx: CaptureContext, grace_s: float
) -> list[StepResult]:
    """The steps in phases, each phase's steps concurrently; results in the steps' order."""
    results: dict[int, StepResult] = {}
    for phase in step_phases(steps, ctx.destructive):
        done = await _run_together([steps[i] for i in phase], ctx, grace_s)
        results.update(zip(phase, done, strict=True))
    return [results[i] for i in range(len(steps))]


def step_phases(steps: Sequence[CaptureStep], destructive: bool) -> list[list[int]]:
    """Indices of the steps to run together, phase by phase: those that only look; then those
    that sample the same processes again (:data:`SAMPLES_AGAIN`); then those that wake the
    engine (:data:`WAKES_THE_ENGINE`); in a destructive capture, last, the last step (the CUDA
    core dump, which ends the process) once the others are done with it."""
    last = len(steps) - 1 if destructive and len(steps) > 1 else None
    rest = [i for i in range(len(steps)) if i != last]
    names = {i: getattr(steps[i], "__name__", "") for i in rest}
    again = [i for i in rest if names[i] in SAMPLES_AGAIN]
    wakes = [i for i in rest if names[i] in WAKES_THE_ENGINE]
    looks = [i for i in rest if i not in wakes and i not in again]
    phases = (looks, again, wakes, [last] if last is not None else [])
    return [phase for phase in phases if phase]


async def _run_together(
    steps: Sequence[CaptureStep], ctx: CaptureContext, grace_s: float
) -> list[StepResult]:
    """If one step hits a full disk the others are cancelled and awaited before the caller
    removes the directory, so none writes into it afterwards."""
    tasks = [asyncio.ensure_future(_run_step(st, ctx, grace_s)) for st in steps]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class _Processes:
    records: list[dict[str, Any]]
    masker: Masker


def _read_processes(procs: Sequence[ProcInfo], proc_root: Path) -> _Processes:
    """The processes' records and the engine log's masker, from /proc. Blocking."""
    return _Processes(
        evidence.process_records(procs, proc_root), evidence.masker_for(procs, proc_root)
    )


def _write_evidence(
    tmp: Path,
    s: BundleSettings,
    seen: _Processes,
    timeline: Sequence[Mapping[str, Any]],
    vers: Mapping[str, Any],
    pod_log: bytes | None,
) -> None:
    """Everything the writer adds itself but summary.md. Blocking; OSError propagates."""
    write_private(tmp / "processes.json", json.dumps(seen.records, indent=2).encode())
    write_private(tmp / "versions.json", json.dumps(vers, indent=2).encode())
    write_private(tmp / "timeline.jsonl", evidence.timeline_jsonl(timeline))
    log = s.capture.engine_log
    if log is not None:
        try:
            tail = evidence.log_tail(log, s.capture.log_tail_bytes)
            tail = seen.masker.data(tail)
        except OSError as e:
            tail = f"[engine-watchdog] could not read {log}: {e.strerror}\n".encode()
        write_private(tmp / "engine.log", tail)
    elif pod_log is not None:  # the same masking: vLLM logs its non-default args, --api-key too
        write_private(tmp / "engine.log", seen.masker.data(pod_log))


def _write_summary(tmp: Path, s: BundleSettings, info: SummaryInput, hangs: KnownHangs) -> None:
    """summary.md: the story, where each thread is stuck, the ranks' last collectives, and the
    known hangs it resembles."""
    groups = load_groups(tmp, info.procs, source_reader(s.proc_root))
    summary = render_summary(replace(info, groups=groups))
    culprit = culprit_lines(group_of(_read_small(tmp / GROUP_FILE)))
    if culprit:  # a multi-node bundle: who stopped the group, first
        title, rest = summary.split("\n", 1)
        summary = "\n".join([title, "", "## Culprit", "", *culprit, rest])
    for section in (hangs.collectives, hangs.section):
        if section:
            summary = summary.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    write_private(tmp / "summary.md", summary.encode())


async def write_bundle(
    settings: BundleSettings,
    verdict: Verdict | None,
    procs: Sequence[ProcInfo],
    timeline: Sequence[Mapping[str, Any]],
    steps: Sequence[CaptureStep],
) -> BundleResult:
    """Capture and write one bundle; raises :class:`BundleError` (nothing left) if it cannot."""
    t0, created = time.monotonic(), float(settings.clock())
    settings = await asyncio.to_thread(_writable, settings)
    # A stall's bundle is named by its incident (the log lines' and action records' too).
    name = incident_id(verdict) if verdict else bundle_name(created, settings.engine, "manual")
    tools = dict(settings.tools) if settings.tools is not None else resolve_tools()
    tmp = await asyncio.to_thread(_make_tmp, settings.incident_dir, name)
    try:
        # The steps act (py-spy attaches, a signal, a pipe written, a core dump ends the
        # process): never on an orphan that may be another engine's. The records keep it.
        ours = tuple(p for p in procs if not p.orphan)
        ctx = CaptureContext(
            tmp, ours, settings.destructive, settings.capture.step_timeout_s, tools
        )
        # Before the steps: a destructive step (the CUDA core dump) ends the engine, and with it
        # the command lines and environments the records and the log's masking read.
        seen = await asyncio.to_thread(_read_processes, procs, settings.proc_root)
        results, vers, version, pod_log = await asyncio.gather(
            _run_steps(steps, ctx, settings.step_grace_s),
            evidence.versions(tools.get("py-spy")),
            _engine_version(settings),
            _pod_log(settings),
        )
        vers = {**vers, "engine_version": version} if version else vers
        info = SummaryInput(
            created, settings.engine, verdict, procs, results, timeline, engine_version=version
        )
        await asyncio.to_thread(_write_evidence, tmp, settings, seen, timeline, vers, pod_log)
        elapsed = time.monotonic() - t0
        draft = draft_manifest(
            name, created, settings.engine, settings.destructive, verdict, procs, results, elapsed
        )
        draft |= {"engine_version": version} if version else {}
        draft |= {"target": settings.target} if settings.target else {}
        hangs = await asyncio.to_thread(known_hangs, tmp, draft, settings.capture.signatures)
        await asyncio.to_thread(_write_summary, tmp, settings, info, hangs)
        manifest = await asyncio.to_thread(
            finish_manifest, tmp, {**draft, "known_hangs": hangs.listed}
        )
        final = await asyncio.to_thread(_into_place, tmp, settings, name)
    except OSError as e:
        await asyncio.to_thread(shutil.rmtree, tmp, True)
        raise BundleError(_explain(e, settings.incident_dir)) from e
    except BaseException:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
        raise
    finally:
        release(tmp)  # in place or removed: no longer a temporary anyone builds
    removed = await asyncio.to_thread(_prune, settings, final)
    return BundleResult(
        final, manifest, tuple(results), time.monotonic() - t0, tuple(removed), hangs.top
    )


async def _engine_version(s: BundleSettings) -> str | None:
    return await s.engine_version() if s.engine_version is not None else None


def _read_small(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.stat().st_size < 8 << 20 else None
    except OSError:
        return None


async def _pod_log(s: BundleSettings) -> bytes | None:
    return await s.pod_log() if s.pod_log is not None else None


def _prune(s: BundleSettings, final: Path) -> list[str]:
    return prune(s.incident_dir, s.capture.keep_count, s.capture.keep_bytes, final.name)


def _writable(s: BundleSettings) -> BundleSettings:
    """The settings with an incident dir that can be written: checked again before each
    bundle (a volume gone read-only, a folder removed or its mode changed since the start),
    else a private temporary folder, said in a log line: evidence is never lost in silence."""
    why = cannot_write(s.incident_dir)
    if why is None:
        return s
    fallback = fallback_dir()
    log.error(
        "cannot write bundles in %s (%s): this bundle goes to %s instead; give --incident-dir "
        "a folder this user may write",
        s.incident_dir,
        why,
        fallback,
    )
    return replace(s, capture=replace(s.capture, incident_dir=fallback))


def _make_tmp(incident_dir: Path, name: str) -> Path:
    try:
        return new_tmp_dir(incident_dir, name)
    except OSError as e:
        raise BundleError(_explain(e, incident_dir)) from e


def _into_place(tmp: Path, s: BundleSettings, name: str) -> Path:
    if s.capture.tar:
        return tar_into_place(tmp, s.incident_dir, name)
    final = s.incident_dir / name
    n = 1
    while final.exists():
        n += 1
        final = s.incident_dir / f"{name}-{n}"
    os.rename(tmp, final)
    return final


def _explain(e: OSError, incident_dir: Path) -> str:
    if e.errno in _DISK_ERRNOS:
        return (
            f"no space left for the bundle in {incident_dir} ({e.strerror}); nothing was "
            "kept: free space there, point --incident-dir at a larger volume or lower "
            "the retention (keep_bytes)"
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write bundles in {incident_dir} ({e.strerror}): choose a writable "
            "--incident-dir"
        )
    return f"could not write the bundle in {incident_dir}: {e}"
