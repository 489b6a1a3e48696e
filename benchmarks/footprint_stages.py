"""Where ``watch``'s memory goes: one process importing and starting the GPU probe stage by
stage, its RSS (and the anonymous part of it) after each, then the largest mappings; last, a
real ``watch`` (the command line, in a child process) against the simulator: its RSS after
``--watch-seconds`` and the modules it holds that the staged process does not.

    python3 -m benchmarks.footprint_stages [--reads 50] [--top 12] [--watch-seconds 15]

Run it where NVML has a GPU (the device machine); without one the NVML stages say why they
stopped. ``MALLOC_ARENA_MAX=1`` in the environment shows how much of NVML's share is glibc's
per-thread arenas (NVML starts threads of its own).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RUNNER = ("engine_watchdog.runtime.runner",)
"""What the ``watch`` command imports when it runs, beyond its command line; the guard, capture,
the peers and the other commands are imported only when a flag or an incident needs them."""


def rollup() -> dict[str, float]:
    """/proc/self/smaps_rollup in MB: Rss, Anonymous, and the file-backed rest."""
    fields: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def largest_mappings(top: int) -> list[tuple[float, str]]:
    """The ``top`` mappings by RSS (MB, name), anonymous ones named by their size."""
    rows: list[tuple[float, str]] = []
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            low, _, high = parts[0].partition("-")
            size = (int(high, 16) - int(low, 16)) / 2**20
            name = parts[5] if len(parts) > 5 else f"[anon {size:.0f} MB]"
        elif parts[:1] == ["Rss:"]:
            rows.append((int(parts[1]) / 1024, name))
    merged: dict[str, float] = {}
    for rss, what in rows:
        merged[what] = merged.get(what, 0.0) + rss
    return sorted(((v, k) for k, v in merged.items()), reverse=True)[:top]


def stages(reads: int) -> list[tuple[str, Callable[[dict[str, Any]], object]]]:
    def nvml_init(s: dict[str, Any]) -> object:
        return s["nvml"].nvmlInit()

    def probe_start(s: dict[str, Any]) -> object:
        from engine_watchdog.probes.nvml import GpuProbe

        s["probe"] = GpuProbe(s["nvml"])
        return s["probe"].start()

    def read_n(n: int) -> Callable[[dict[str, Any]], object]:
        return lambda s: [s["probe"].read() for _ in range(n)]

    def trim(_: dict[str, Any]) -> object:
        return ctypes.CDLL(None).malloc_trim(0)

    return [
        ("engine_watchdog.cli.main", lambda s: importlib.import_module("engine_watchdog.cli.main")),
        ("watch's imports (runtime.runner)", lambda s: [*map(importlib.import_module, RUNNER)]),
        ("import pynvml", lambda s: s.update(nvml=importlib.import_module("pynvml"))),
        ("nvmlInit()", nvml_init),
        ("probe started (handles, GPM buffers, Xid set)", probe_start),
        ("one read", read_n(1)),
        (f"{reads} more reads", read_n(reads)),
        ("malloc_trim(0)", trim),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="watch's RSS, stage by stage")
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--watch-seconds", type=float, default=15, help="0: no real watch")
    args = parser.parse_args(argv)
    arenas = os.environ.get("MALLOC_ARENA_MAX", "glibc's default")
    print(f"Python {sys.version.split()[0]}, MALLOC_ARENA_MAX={arenas}")
    print("| stage | RSS MB | anonymous MB | threads | s |\n|---|---|---|---|---|")
    state: dict[str, Any] = {}
    bare = rollup()
    print(f"| bare interpreter | {bare['Rss']:.1f} | {bare['Anonymous']:.1f} | 1 | |")
    for name, step in stages(args.reads):
        start = time.monotonic()
        try:
            step(state)
        except Exception as exc:  # a stage that cannot run here is a finding, not a crash
            print(f"| {name} | stopped: {type(exc).__name__}: {exc} | | | |")
            break
        fields = rollup()
        took = time.monotonic() - start
        rss, anon = fields["Rss"], fields["Anonymous"]
        print(f"| {name} | {rss:.1f} | {anon:.1f} | {threads()} | {took:.2f} |")
    print("\nlargest mappings (RSS MB):")
    for rss, what in largest_mappings(args.top):
        print(f"  {rss:6.1f}  {what}")
    if args.watch_seconds > 0:
        staged = set(sys.modules)  # before the simulator's launcher comes in
        from benchmarks.footprint_watch import report_real_watch

        report_real_watch(args.watch_seconds, staged)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
