"""Thin, bounded readers of a bundle directory: bytes in memory, nothing parsed.

A bundle may come from anywhere (an operator attaches it to a ticket), so every read is bounded
in size, only regular files are read (a FIFO named ``engine.log`` would block), symbolic links are
never followed (an ``engine.log`` linking to another file must not land in a report), and a file
that cannot be read becomes a note instead of an exception.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_JSON_BYTES = 8 << 20
MAX_LOG_BYTES = 4 << 20
MAX_TIMELINE_BYTES = 16 << 20
MAX_SUMMARY_BYTES = 2 << 20
MAX_FR_BYTES = 16 << 20
MAX_LISTED = 64
"""At most this many py-spy and flight-recorder files are read."""

_FIXED: dict[str, tuple[int, bool]] = {
    # relative path -> (cap, keep the tail rather than the head)
    "manifest.json": (MAX_JSON_BYTES, False),
    "processes.json": (MAX_JSON_BYTES, False),
    "versions.json": (MAX_JSON_BYTES, False),
    "gpu.json": (MAX_JSON_BYTES, False),
    "summary.md": (MAX_SUMMARY_BYTES, False),
    "engine.log": (MAX_LOG_BYTES, True),
    "timeline.jsonl": (MAX_TIMELINE_BYTES, True),
    "flight_recorder/index.json": (MAX_JSON_BYTES, False),
    "nodes/group.json": (MAX_JSON_BYTES, False),
}
ACTIONS = "../actions.jsonl"
"""The watchdog's action history sits in the incident directory, beside the bundles."""


class BundleNotFound(ValueError):
    """The path is not a bundle directory (one line, for the CLI)."""


@dataclass
class RawBundle:
    name: str
    files: dict[str, bytes] = field(default_factory=dict)
    """Relative path -> content, as read (capped)."""
    truncated: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    """Files that exist but could not be read, and why."""


def read_capped(path: Path, max_bytes: int, tail: bool = False) -> tuple[bytes, bool]:
    """Up to ``max_bytes`` of a regular file (its end with ``tail``), and whether it was cut.
    Raises OSError for anything that is not a regular file, links included."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name}: not a regular file")
        cut = st.st_size > max_bytes
        if cut and tail:
            os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), cut
    finally:
        os.close(fd)


def read_bundle_files(bundle: Path) -> RawBundle:
    """Read every file the matcher and the report use. Raises BundleNotFound only when the path
    is not a directory at all; everything else becomes a note."""
    try:
        st = os.lstat(bundle)
    except OSError as e:
        raise BundleNotFound(f"{bundle}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BundleNotFound(f"{bundle}: not a bundle directory (unpack a .tar.gz first)")
    raw = RawBundle(bundle.name)
    for rel, (cap, tail) in _FIXED.items():
        _read_one(bundle, rel, cap, tail, raw)
    listed = (("pyspy", ".json", MAX_JSON_BYTES), ("flight_recorder", "", MAX_FR_BYTES))
    for sub, suffix, cap in listed:
        for rel in _listed(bundle, sub, suffix, raw):
            _read_one(bundle, rel, cap, False, raw)
    _read_one(bundle, ACTIONS, MAX_TIMELINE_BYTES, True, raw)
    return raw


def _read_one(bundle: Path, rel: str, cap: int, tail: bool, raw: RawBundle) -> None:
    path = bundle / rel
    try:
        if rel != ACTIONS and _has_link(bundle, rel):
            raw.notes.append(f"{rel}: a symbolic link, not read")
            return
        data, cut = read_capped(path, cap, tail)
    except FileNotFoundError:
        return
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raw.notes.append(f"{rel}: not read ({why})")
        return
    raw.files[rel] = data
    if cut:
        raw.truncated.add(rel)
        part = "last" if tail else "first"
        raw.notes.append(f"{rel}: larger than {cap >> 20} MiB, read the {part} {cap >> 20} MiB")


def _has_link(bundle: Path, rel: str) -> bool:
    """True when a directory between the bundle and the file is a symbolic link."""
    parts = Path(rel).parts[:-1]
    cur = bundle
    for part in parts:
        cur = cur / part
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return True
        except OSError:
            return False
    return False


def _listed(bundle: Path, sub: str, suffix: str, raw: RawBundle) -> list[str]:
    d = bundle / sub
    try:
        if stat.S_ISLNK(os.lstat(d).st_mode):
            raw.notes.append(f"{sub}/: a symbolic link, not read")
            return []
        names = sorted(os.listdir(d))
    except OSError:
        return []
    picked = [n for n in names if n.endswith(suffix) and n != "index.json" and n[:1] != "."]
    if len(picked) > MAX_LISTED:
        raw.notes.append(f"{sub}/: {len(picked)} files, read the first {MAX_LISTED}")
    return [f"{sub}/{n}" for n in picked[:MAX_LISTED]]
