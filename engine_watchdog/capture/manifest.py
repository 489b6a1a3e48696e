"""The bundle's ``manifest.json`` (schema in docs/bundle.md): what was captured, and every file.

:func:`draft_manifest` describes the capture; :func:`finish_manifest` adds each file's size,
SHA-256 and step once the steps are done, writes the manifest and locks the bundle down.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine_watchdog import __version__
from engine_watchdog.capture.step import StepResult
from engine_watchdog.core.model import ProcInfo, Verdict, incident_id
from engine_watchdog.host.tools import write_private

SCHEMA = "engine-watchdog/bundle"
SCHEMA_VERSION = 1


def cause_of(verdict: Verdict | None) -> str:
    """The bundle's cause: the verdict's (or its state), ``manual`` without one."""
    if verdict is None:
        return "manual"
    return verdict.cause or verdict.state.value


def _verdict_dict(verdict: Verdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    d = asdict(verdict)
    d["state"] = verdict.state.value
    return d


def draft_manifest(
    name: str,
    created: float,
    engine: str,
    destructive: bool,
    verdict: Verdict | None,
    procs: Sequence[ProcInfo],
    steps: Sequence[StepResult],
    elapsed: float,
) -> dict[str, Any]:
    """Everything but ``files`` (hashed later, off the loop)."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "engine_watchdog": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        "created_unix": created,
        "engine": engine,
        "cause": cause_of(verdict),
        "trigger": "on-demand" if verdict is None else "verdict",
        "incident": incident_id(verdict) if verdict is not None else None,
        "destructive": destructive,
        "verdict": _verdict_dict(verdict),
        "processes": [asdict(p) for p in procs],
        "steps": [
            {
                "name": st.name,
                "status": st.status,
                "detail": st.detail,
                "elapsed_s": round(st.elapsed_s, 3),
                "files": list(st.files),
            }
            for st in steps
        ],
        "elapsed_s": round(elapsed, 3),
    }


def finish_manifest(tmp: Path, draft: Mapping[str, Any]) -> dict[str, Any]:
    """Hash every file into the manifest, write it, lock the tree down. Blocking."""
    owners = {f: st["name"] for st in draft["steps"] for f in st["files"]}
    manifest = {**draft, "files": _sha256_files(tmp, owners)}
    write_private(tmp / "manifest.json", json.dumps(manifest, indent=2).encode())
    _lock_down(tmp)
    return manifest


def _sha256_files(root: Path, owners: Mapping[str, str]) -> list[dict[str, Any]]:
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        files.append(
            {
                "path": rel,
                "size": path.stat().st_size,
                "sha256": digest.hexdigest(),
                "step": owners.get(rel, "bundle"),
            }
        )
    return files


def _lock_down(root: Path) -> None:
    """0700 dirs, 0600 files: steps may have written with the process umask."""
    os.chmod(root, 0o700)
    for path in root.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
