"""The floors the guard is measured against (docs/performance.md): byte relays that do only
what every proxy must, one read from the engine and one write to the client per chunk, and
nothing the guard does (no HTTP, no progress notes, no detector). ``relay-c`` is
benchmarks/relay.c, built here with the system's C compiler: the machine's own floor.
``relay-asyncio`` is the same in Python on asyncio's loop: the floor of a Python proxy;
``relay-uvloop`` the same on uvloop, the guard's loop: the floor of the guard's own design (one
Python callback per read), below which only the work the guard adds can be cut.

    python -m benchmarks.relays UPSTREAM_PORT LISTEN_PORT [--uvloop]    # a Python relay
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

SOURCE = Path(__file__).with_name("relay.c")
NAMES = ("relay-c", "relay-asyncio", "relay-uvloop")


def argv(name: str, upstream_port: int, port: int) -> list[str]:
    """The command of one floor relay, from the engine's port to ``port``."""
    if name in ("relay-asyncio", "relay-uvloop"):
        loop = ["--uvloop"] if name == "relay-uvloop" else []
        return [sys.executable, "-m", "benchmarks.relays", str(upstream_port), str(port), *loop]
    return [str(built()), str(upstream_port), str(port)]


def built() -> Path:
    """benchmarks/relay.c compiled (once a run) with ``cc -O2``."""
    binary = Path(tempfile.gettempdir()) / "engine-watchdog-bench-relay"
    if binary.exists() and binary.stat().st_mtime >= SOURCE.stat().st_mtime:
        return binary
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("--floor needs a C compiler (cc) for benchmarks/relay.c")
    build = [cc, "-O2", "-o", str(binary), str(SOURCE)]
    subprocess.run(build, check=True, timeout=120)  # noqa: S603 (the compiler found, our source)
    return binary


class _Engine(asyncio.Protocol):
    """The relay's engine side: what the engine sends is written to the client at once."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """The relay's client side: one engine connection per client connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.engine: asyncio.Transport | None = None
        self.early: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop, client = asyncio.get_running_loop(), self.transport
        assert client is not None
        try:
            self.engine, _ = await loop.create_connection(
                lambda: _Engine(client), "127.0.0.1", self.upstream_port
            )
        except OSError:
            client.close()
            return
        for data in self.early:
            self.engine.write(data)

    def data_received(self, data: bytes) -> None:
        if self.engine is None:
            self.early.append(data)
        else:
            self.engine.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.engine is not None:
            self.engine.close()


async def serve(upstream_port: int, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(upstream_port), "127.0.0.1", port, backlog=2048
    )
    await server.serve_forever()


if __name__ == "__main__":
    if "--uvloop" in sys.argv:
        import uvloop

        uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
    else:
        asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
