"""An engine on loopback that answers with exactly the bytes a test scripts, cut where the
test cuts them: the guard's reading of HTTP/1.1 framing (chunk sizes split across reads,
events split across chunks, a connection closed or reset mid-stream) is tested against bytes
no HTTP library would choose to send."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"x-engine: raw\r\ntransfer-encoding: chunked\r\n\r\n"
)
PIECE_GAP_S = 0.01
"""Between two pieces: each arrives in a read of its own (TCP_NODELAY on loopback)."""


def chunks(*pieces: bytes) -> bytes:
    """``pieces`` as chunks of a chunked body (no last chunk: add LAST to end it)."""
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)


LAST = b"0\r\n\r\n"


def dechunk(raw: bytes) -> bytes:
    """A whole chunked body, decoded (independently of the guard's parser)."""
    out: list[bytes] = []
    at = 0
    while True:
        eol = raw.index(b"\r\n", at)
        size = int(raw[at:eol], 16)
        if not size:
            return b"".join(out)
        out.append(raw[eol + 2 : eol + 2 + size])
        assert raw[eol + 2 + size : eol + 4 + size] == b"\r\n"
        at = eol + 4 + size


def cut(data: bytes, *at: int) -> list[bytes]:
    """``data`` cut at these offsets."""
    bounds = [0, *at, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass
class RawEngine:
    """Every request gets ``pieces``, one write each; then the connection is closed
    (``then="close"``), reset (``"reset"``), held until the other side closes it
    (``"hold"``) or kept for the next request (``"keep"``, as uvicorn keeps it)."""

    pieces: list[bytes]
    then: str = "close"
    url: str = ""
    requests: list[bytes] = field(default_factory=list)
    """Each request's head and body as the engine got them."""
    closed_by_peer: int = 0
    """Held connections the other side closed."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(60):
                await self._answer(reader, writer)
                while self.then == "keep":
                    await self._answer(reader, writer)
            if self.then == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif self.then == "hold":
                async with asyncio.timeout(60):
                    await reader.read()  # b"": the guard closed its side
                self.closed_by_peer += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        self.requests.append(head + await reader.readexactly(length))
        for piece in self.pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(PIECE_GAP_S)


@contextlib.asynccontextmanager
async def raw_engine(pieces: list[bytes], then: str = "close") -> AsyncIterator[RawEngine]:
    engine = RawEngine(pieces, then)
    tasks: set[asyncio.Task[None]] = set()

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(engine.serve(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(connected, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield engine
    finally:
        server.close()
        for task in list(tasks):  # every connection's task ended before the loop is
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        await server.wait_closed()
