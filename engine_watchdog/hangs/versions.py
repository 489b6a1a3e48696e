"""The engine, NCCL and CUDA versions a bundle reveals, and version comparison.

The bundle format (docs/bundle.md) records engine-watchdog's own versions; the engine's come from
its log, in the lines the engines print themselves (vLLM: ``vLLM API server version X``,
``Initializing a V1 LLM engine (vX)``, ``vLLM is using nccl==X``; NCCL: ``NCCL version X``;
``collect_env`` output pasted into a log: ``vLLM Version: X``, ``CUDA runtime version: X``).
A manifest or versions.json field ``engine_version`` (``nccl_version``, ``cuda_version``) wins
when a bundle writer records one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_ENGINE = (
    re.compile(r"vLLM API server version (\S+)"),
    re.compile(r"LLM engine \(v([0-9][^)\s]*)\)"),
    re.compile(r"vLLM [Vv]ersion\s*:?\s*v?([0-9][\w.+-]*)"),
    re.compile(r"\bsglang(?: version)?\s*[:=]+\s*v?([0-9][\w.+-]*)", re.I),
)
_NCCL = (re.compile(r"using nccl==(\S+)"), re.compile(r"\bNCCL version ([0-9][\w.+-]*)"))
_CUDA = (
    re.compile(r"CUDA runtime version\s*:\s*([0-9][\w.]*)"),
    re.compile(r"CUDA Version:?\s*([0-9][\w.]*)"),
)
SCAN_LINES = 5000
"""Versions are printed at start-up: the first lines of the kept log tail are searched first."""


@dataclass(frozen=True)
class FoundVersions:
    engine: str
    nccl: str
    cuda: str


def engine_versions(
    manifest: Mapping[str, Any], versions: Mapping[str, Any], log: Sequence[str]
) -> FoundVersions:
    lines = list(log[:SCAN_LINES]) + list(log[-SCAN_LINES:])

    def pick(key: str, patterns: Iterable[re.Pattern[str]]) -> str:
        explicit = manifest.get(key) or versions.get(key)
        return str(explicit)[:80] if explicit else _first(patterns, lines)

    return FoundVersions(
        engine=pick("engine_version", _ENGINE),
        nccl=pick("nccl_version", _NCCL),
        cuda=pick("cuda_version", _CUDA),
    )


def _first(patterns: Iterable[re.Pattern[str]], lines: Sequence[str]) -> str:
    for pat in patterns:
        for line in lines:
            m = pat.search(line)
            if m:
                return m.group(1).rstrip(".,;")[:80]
    return ""


def version_key(text: str) -> tuple[int, ...] | None:
    """``0.19.1rc1.dev391+g80b`` -> (0, 19, 1): the leading numeric release; None if none."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def in_range(version: str, low: str, high: str) -> bool | None:
    """Whether ``version`` lies in [low, high] (either bound may be empty); None if unparsable.
    Release numbers only: a pre-release of 0.6.1 compares as 0.6.1."""
    v = version_key(version)
    if v is None:
        return None
    lo = version_key(low) if low else None
    hi = version_key(high) if high else None
    if lo is not None and _pad(v, lo) < _pad(lo, v):
        return False
    return not (hi is not None and _pad(v, hi) > _pad(hi, v))


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return a + (0,) * max(0, len(b) - len(a))
