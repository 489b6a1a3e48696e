"""Where a proxy's CPU goes under load (benchmarks/guard.py ``--profile DIR``): after a load's
measured rounds, one more phase through each Python proxy while ``py-spy record --native``
samples it; the raw stacks land in DIR and a summary (the busiest frames, by their own samples
and by the samples under them) is printed. The profiled phase is not one of the measured ones:
py-spy pauses the process to sample it (``--native`` needs that), which costs the proxy time.

    python -m benchmarks.profile DIR/guard-256.txt      # the summary of one recorded profile
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

RATE_HZ = 200
PYTHON_PROXIES: tuple[str, ...] = ("guard", "guard-asyncio", "guard-baseline", "naive")
PYTHON_PROXIES += ("relay-asyncio", "relay-uvloop")
"""The proxies py-spy can read (the others are C: nginx, HAProxy, relay-c)."""


@contextlib.asynccontextmanager
async def recording(pid: int, delay: float, seconds: float, out: Path) -> AsyncIterator[None]:
    """py-spy samples ``pid`` for ``seconds`` from ``delay`` seconds into the body (the phase's
    measured window, after its streams opened), raw stacks into ``out``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [spy, "record", "--pid", str(pid), "--native", "--format", "raw", "--output"]
    argv += [str(out), "--duration", str(max(1, int(seconds))), "--rate", str(RATE_HZ)]

    async def start() -> asyncio.subprocess.Process:
        await asyncio.sleep(delay)
        return await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )

    starting = asyncio.create_task(start())
    try:
        yield
    finally:
        proc = await starting
        try:
            await asyncio.wait_for(proc.wait(), seconds + 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


IDLE_LEAVES = ("epoll_wait (", "epoll_pwait (", "select_epoll_poll_impl (")
"""A loop waiting for its sockets: idle, though py-spy's native mode samples it."""


def idle(frames: list[str]) -> bool:
    """A waiting loop, or a worker thread parked in libc (an unnamed address under thread_run:
    the default executor's idle threads)."""
    leaf = frames[-1]
    waits = ("thread_run", "PyThread_acquire_lock")
    parked = leaf.startswith("0x") and any(f.startswith(waits) for f in frames)
    return parked or leaf.startswith(IDLE_LEAVES)


def frame_name(frame: str) -> str:
    """``function (file:line)`` without the line: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rstrip(')')})" if where else name


def summary(raw: Path, top: int = 20) -> str:
    """The ``top`` functions by their own samples and by the samples under them, in % of the
    busy samples (idle ones left out: :func:`idle`)."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";")]
        if idle(frames):
            continue
        total += int(count)
        own[frames[-1]] += int(count)
        for name in set(frames):
            under[name] += int(count)
    if not total:
        return f"{raw.name}: no samples"
    lines = [f"{raw.name}: {total} busy samples"]
    for title, counter in (("own", own), ("under", under)):
        lines.append(f"  by {title} samples:")
        lines += [f"    {100 * n / total:5.1f} %  {name}" for name, n in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Summarise py-spy raw profiles.")
    parser.add_argument("raw", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    for raw in args.raw:
        print(summary(raw, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
