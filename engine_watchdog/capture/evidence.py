"""Evidence the bundle writer adds itself: command lines and environments (secrets redacted),
versions, the engine's log tail (the secrets of the engine's command line and environment
masked: an engine may print its arguments), the metrics timeline. Blocking helpers, run off
the loop."""

from __future__ import annotations

import contextlib
import json
import platform
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from engine_watchdog import __version__
from engine_watchdog.capture.procfs import environ_of
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.core.redact import Masker, redact_argv, redact_env, secret_values
from engine_watchdog.host.tools import run_bounded


def read_cmdline(pid: int, proc_root: Path) -> list[str]:
    raw = (proc_root / str(pid) / "cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def process_records(procs: Iterable[ProcInfo], proc_root: Path) -> list[dict[str, Any]]:
    """Each process with its command line and environment, secrets redacted. Blocking."""
    records: list[dict[str, Any]] = []
    for p in procs:
        rec: dict[str, Any] = asdict(p)
        try:
            rec["cmdline"] = redact_argv(read_cmdline(p.pid, proc_root))
        except OSError as e:
            rec["cmdline_error"] = e.strerror or str(e)
        try:
            env, source = environ_of(proc_root, p.pid)
            rec["environ"] = redact_env(env)
            if source != p.pid:  # zeroed by setproctitle: the parent's, which it inherited
                rec["environ_from_pid"] = source
        except OSError as e:
            # Another UID's environ needs root or the same UID: say so rather than fail.
            rec["environ_error"] = e.strerror or str(e)
        records.append(rec)
    return records


def masker_for(procs: Iterable[ProcInfo], proc_root: Path) -> Masker:
    """A Masker for the engine's own log: the secrets its processes' command lines and
    environments hold. Blocking."""
    values: list[str] = []
    for p in procs:
        with contextlib.suppress(OSError):
            values += secret_values(read_cmdline(p.pid, proc_root))
        with contextlib.suppress(OSError):
            values += secret_values(env=environ_of(proc_root, p.pid)[0])
    return Masker(values)


async def versions(pyspy: str | None) -> dict[str, Any]:
    """engine-watchdog, Python, psutil, py-spy and host versions."""
    out: dict[str, Any] = {
        "engine_watchdog": __version__,
        "python": sys.version.split()[0],
        "psutil": psutil.__version__,
        "host": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "node": platform.node(),
        },
        "py_spy": None,
    }
    if pyspy:
        try:
            res = await run_bounded([pyspy, "--version"], 5.0)
            out["py_spy"] = res.stdout.decode(errors="replace").strip() or None
        except OSError:
            out["py_spy"] = None
    return out


def log_tail(path: Path, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a log, starting on a line boundary. Blocking."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        start = max(size - max_bytes, 0)
        f.seek(start)
        data = f.read(max_bytes)
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return data


def timeline_jsonl(timeline: Iterable[Mapping[str, Any]]) -> bytes:
    """One JSON document per line; values JSON cannot hold are written as strings."""
    return b"".join(
        json.dumps(dict(e), default=str, sort_keys=True).encode() + b"\n" for e in timeline
    )
