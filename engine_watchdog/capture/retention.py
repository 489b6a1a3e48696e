"""Bundle placement on disk: hidden temporary directories, tarballs, retention. Blocking.

A bundle is built in a hidden ``.tmp-*`` entry that its writer holds an ``flock`` on from the
moment it has that name (it is created as ``.new-*``, locked, then renamed), so a temporary
entry nobody holds is one whose writer died (``kill -9`` mid-capture): :func:`remove_abandoned`
removes those, at start and after every bundle, and never one a live writer (this process or
another watchdog sharing the directory) still builds. The kernel drops a dead writer's locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from engine_watchdog.host.tools import make_private_dirs

TMP_PREFIX = ".tmp-"
NEW_PREFIX = ".new-"
# Bundles are "<YYYYmmddTHHMMSSZ>-<engine>-<cause>[-n]" directories or the same + ".tar.gz".
BUNDLE_RE = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9-]+(\.tar\.gz)?$")
STALE_NEW_S = 3600.0
"""A ``.new-*`` entry lives for microseconds; one this old was left by a writer killed then."""
_held: dict[str, int] = {}
"""Temporary entry -> the descriptor holding its lock (this process's writers)."""


def new_tmp_dir(incident_dir: Path, name: str) -> Path:
    """A fresh 0700 directory next to where the bundle will land (same file system: the final
    rename is atomic), locked until :func:`release`. Hidden, so readers and retention skip it."""
    make_private_dirs(incident_dir)
    token = secrets.token_hex(4)
    staging = incident_dir / f"{NEW_PREFIX}{token}"
    staging.mkdir(mode=0o700)
    os.chmod(staging, 0o700)
    return _lock_and_name(staging, incident_dir / f"{TMP_PREFIX}{name}-{token}")


def cannot_write(incident_dir: Path, keep: bool = True) -> str | None:
    """Why bundles cannot be written in ``incident_dir``, or None: it is created (0700, its
    missing parents too) and an empty probe file is made in it and removed. An empty file, so
    that a full disk still passes: that failure is the bundle's own, said when it comes.
    ``keep=False`` (doctor): folders this made are removed again."""
    made: list[Path] = []
    try:
        where = incident_dir
        while not where.exists() and where != where.parent:  # (exists: EACCES raises)
            made.append(where)
            where = where.parent
        make_private_dirs(incident_dir)
        fd, probe = tempfile.mkstemp(prefix=f"{NEW_PREFIX}probe-", dir=incident_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        for folder in made if not keep else ():
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


_fallback: Path | None = None


def fallback_dir() -> Path:
    """A private temporary folder of this process's own (made once, 0700, a fresh name: never
    one another user could have made first) for bundles the incident dir cannot take."""
    global _fallback
    if _fallback is None or not _fallback.is_dir():
        _fallback = Path(tempfile.mkdtemp(prefix="engine-watchdog-incidents-"))
    return _fallback


def _lock_and_name(staging: Path, tmp: Path) -> Path:
    fd = os.open(staging, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, tmp)
    except OSError:
        os.close(fd)
        raise
    _held[str(tmp)] = fd
    return tmp


def release(tmp: Path) -> None:
    """The writer is done with ``tmp`` (renamed into place or removed): drop its lock."""
    fd = _held.pop(str(tmp), None)
    if fd is not None:
        os.close(fd)


def tar_into_place(tmp: Path, incident_dir: Path, name: str) -> Path:
    """Pack ``tmp`` as ``<name>.tar.gz`` (top folder ``name``), rename it into place, drop tmp."""
    import tarfile  # an incident's only: watch imports this module at start (remove_abandoned)

    token = secrets.token_hex(4)
    staging = incident_dir / f"{NEW_PREFIX}{token}.tar.gz"
    os.close(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    part = _lock_and_name(staging, incident_dir / f"{TMP_PREFIX}{name}-{token}.tar.gz")
    try:
        with part.open("r+b") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
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
    finally:
        release(part)
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def remove_abandoned(incident_dir: Path) -> list[str]:
    """Remove the temporary entries no live writer holds; their names."""
    try:
        entries = [p for p in incident_dir.iterdir() if p.name.startswith((TMP_PREFIX, NEW_PREFIX))]
    except OSError:
        return []
    return [p.name for p in entries if _remove_if_abandoned(p)]


def _remove_if_abandoned(path: Path) -> bool:
    try:
        if path.name.startswith(NEW_PREFIX):
            if time.time() - path.lstat().st_mtime < STALE_NEW_S:
                return False
            _remove(path)
            return True
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live writer: not ours to take
    except OSError:
        return False
    else:
        _remove(path)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


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
    bundle just written) always stays. Also removes temporary leftovers of a dead writer."""
    removed: list[str] = []
    remove_abandoned(incident_dir)
    try:
        entries = sorted(p for p in incident_dir.iterdir() if BUNDLE_RE.match(p.name))
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
