"""The benchmark upstream (benchmarks/upstream.c): vLLM's streaming shapes, byte for byte, at a
set pace per stream, from several processes behind SO_REUSEPORT, so that at thousands of
streams the engine side is not what a proxy benchmark measures (the simulator, one Python
process, is: docs/performance.md). Built here with the system's C compiler.

    python -m benchmarks.upstream PORT [--procs 2] [--rate 25] [--stream-tokens 0]

Its controls, over HTTP on the same port: ``freeze``, ``thaw`` and ``config`` below.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.proxy_peers import Tree
from engine_watchdog.sim.launcher import free_port

SOURCE = Path(__file__).with_name("upstream.c")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
"""A served name of a common length: the events are as long as a real deployment's."""
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")
PREBUILT = "ENGINE_WATCHDOG_BENCH_UPSTREAM"


def built() -> Path:
    """benchmarks/upstream.c compiled (again when the source is newer); $PREBUILT instead where
    set (a machine without a compiler: benchmarks/scale_device.sh)."""
    if prebuilt := os.environ.get(PREBUILT):
        return Path(prebuilt)
    binary = Path(tempfile.gettempdir()) / "engine-watchdog-bench-upstream"
    if binary.exists() and binary.stat().st_mtime >= SOURCE.stat().st_mtime:
        return binary
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("the benchmark upstream needs a C compiler (cc) for benchmarks/upstream.c")
    part = binary.with_suffix(f".{os.getpid()}")
    build = [cc, *CFLAGS, "-o", str(part), str(SOURCE)]
    subprocess.run(build, check=True, timeout=120)  # noqa: S603 (the compiler found, our source)
    part.replace(binary)
    return binary


@dataclass
class Upstream:
    """A running upstream: its URL and its whole process tree (CPU, RSS)."""

    url: str
    port: int
    tree: Tree
    proc: asyncio.subprocess.Process

    async def post(self, path: str, doc: dict[str, float] | None = None) -> None:
        """One control request (raw HTTP/1.1, no client library in the way)."""
        await post(self.port, path, doc)

    async def freeze(self) -> None:
        """No event, no answer leaves it (a hung engine: /metrics frozen, /health 200)."""
        await self.post("/bench/freeze")

    async def thaw(self) -> None:
        await self.post("/bench/thaw")

    async def config(self, tokens_per_s: float, stream_tokens: int = 0) -> None:
        """The pace and length of the streams that start after it (0: the request's
        max_tokens)."""
        await self.post(
            "/bench/config", {"tokens_per_s": tokens_per_s, "stream_tokens": stream_tokens}
        )


async def post(port: int, path: str, doc: dict[str, float] | None = None) -> bytes:
    body = json.dumps(doc or {}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        return await asyncio.wait_for(reader.readuntil(b"{}"), 10)
    finally:
        writer.close()


async def wait_ready(
    port: int, timeout: float, proc: asyncio.subprocess.Process | None = None, name: str = ""
) -> None:
    """Until ``GET /health`` on ``port`` answers 200 (through a proxy: the upstream's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"{name or 'the upstream'} exited with {proc.returncode} at start")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), 2)
            writer.close()
            if line.startswith(b"HTTP/1.1 200"):
                return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{name or 'the upstream'}: no answer on port {port} in {timeout:.0f} s")


@contextlib.asynccontextmanager
async def running(
    procs: int = 2, rate: float = 25.0, stream_tokens: int = 0, cpus: str | None = None
) -> AsyncIterator[Upstream]:
    """The upstream started (its processes pinned to ``cpus``, a taskset list, if given) and
    stopped, with its whole process group, on the way out."""
    port = free_port()
    argv = [str(built()), str(port), str(procs), f"{rate:g}", str(stream_tokens), MODEL]
    if cpus and shutil.which("taskset"):
        argv = ["taskset", "-c", cpus, *argv]
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    try:
        await wait_ready(port, 10, proc)
        tree = Tree(proc.pid)
        deadline = time.monotonic() + 10
        while len(tree.members()) < procs + 1 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # (the processes forked: no event tells of them)
        yield Upstream(f"http://127.0.0.1:{port}", port, tree.pin(), proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("port", type=int)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--rate", type=float, default=25.0, help="events/s of each stream")
    parser.add_argument("--stream-tokens", type=int, default=0, help="0: the request's max_tokens")
    args = parser.parse_args()
    argv = [str(built()), str(args.port), str(args.procs), f"{args.rate:g}"]
    os.execv(argv[0], [*argv, str(args.stream_tokens), MODEL])


if __name__ == "__main__":
    sys.exit(main())
