"""Bundle placement on disk: hidden temporary directories, tarballs, retention. Blocking."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tarfile
import time
from pathlib import Path

from engine_watchdog.capture.tools import make_private_dirs

TMP_PREFIX = ".tmp-"
# Bundles are "<YYYYmmddTHHMMSSZ>-<engine>-<cause>[-n]" directories or the same + ".tar.gz".
BUNDLE_RE = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9-]+(\.tar\.gz)?$")
STALE_TMP_S = 3600.0


def new_tmp_dir(incident_dir: Path, name: str) -> Path:
    """A fresh 0700 directory next to where the bundle will land (same file system: the final
    rename is atomic). Hidden, so readers and retention skip it."""
    make_private_dirs(incident_dir)
    tmp = incident_dir / f"{TMP_PREFIX}{name}-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    os.chmod(tmp, 0o700)
    return tmp


def tar_into_place(tmp: Path, incident_dir: Path, name: str) -> Path:
    """Pack ``tmp`` as ``<name>.tar.gz`` (top folder ``name``), rename it into place, drop tmp."""
    part = incident_dir / f"{TMP_PREFIX}{name}-{secrets.token_hex(4)}.tar.gz"
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            tar.add(tmp, arcname=name)
            tar.close()
            raw.flush()
            os.fsync(raw.fileno())
        final = incident_dir / f"{name}.tar.gz"
        n = 1
        while final.exists():
            n += 1
            final = incident_dir / f"{name}-{n}.tar.gz"
        os.rename(part, final)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def prune(incident_dir: Path, keep_count: int, keep_bytes: int, keep: str) -> list[str]:
    """Remove the oldest bundles beyond ``keep_count`` or ``keep_bytes`` in total; ``keep`` (the
    bundle just written) always stays. Also removes temporary leftovers of a crashed writer."""
    removed: list[str] = []
    try:
        entries = sorted(p for p in incident_dir.iterdir() if BUNDLE_RE.match(p.name))
        for p in incident_dir.iterdir():
            if p.name.startswith(TMP_PREFIX) and time.time() - p.stat().st_mtime > STALE_TMP_S:
                _remove(p)
    except OSError:
        return removed
    sizes = {p: _size(p) for p in entries}
    total = sum(sizes.values())
    count = len(entries)
    for p in entries:  # oldest first: names start with the UTC time
        if count <= keep_count and total <= keep_bytes:
            break
        if p.name == keep:
            continue
        _remove(p)
        removed.append(p.name)
        count -= 1
        total -= sizes[p]
    return removed
