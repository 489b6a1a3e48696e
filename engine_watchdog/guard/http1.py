"""HTTP/1.1 on the wire, the little the guard's fast path needs (docs/guard.md, "The fast
path"): a request head written out, a response head read, and a response body's framing
decoded as its bytes arrive, in whatever pieces TCP cuts them (RFC 9112). Pure: bytes in,
bytes out, no I/O, so every split of every body is testable.

Only the framing is read, never the body: a decoder hands back the body's own bytes, as they
came, for the guard to pass on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD_BYTES = 65536
"""A response head larger than this is refused (aiohttp's client allows 8 KiB a line)."""
MAX_LINE_BYTES = 4096
"""A chunk-size or trailer line longer than this is refused (a size is at most 16 hex digits)."""
NO_BODY_STATUS = frozenset({204, 304})
"""RFC 9112 6.3: these responses (and every 1xx) have no body, whatever their headers say."""
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,18}")
_STATUS_LINE = re.compile(r"HTTP/1\.[01] (\d{3})(?: (.*))?")


class BadFraming(ValueError):
    """The engine's bytes are not an HTTP/1.1 response the guard can pass on."""


@dataclass(frozen=True)
class Head:
    """A response's status line and headers."""

    status: int
    reason: str
    headers: CIMultiDictProxy[str]


def request_head(
    method: str, target: str, host: str, headers: CIMultiDict[str], size: int
) -> bytes:
    """The request line and headers of a request with a body of ``size`` bytes.

    Header text is what aiohttp's server parsed (undecodable bytes kept as surrogates), so it is
    written back byte for byte; a CR or LF in it would split the request and is refused, as
    aiohttp's client refuses it."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {size}")
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a CR or LF in the request line or a request header")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def parse_head(raw: bytes) -> Head:
    """A response head, without the blank line that ends it."""
    status_line, *fields = raw.decode("utf-8", "surrogateescape").split("\r\n")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise BadFraming(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for field in fields:
        name, colon, value = field.partition(":")
        if not colon or not name or name != name.strip() or "\n" in field or "\r" in field:
            raise BadFraming(f"not a header line: {field[:80]!r}")
        headers.add(name, value.strip(" \t"))
    return Head(int(match.group(1)), match.group(2) or "", CIMultiDictProxy(headers))


class Body:
    """A response body's framing, decoded incrementally: ``feed`` takes the bytes as they
    arrive and returns the body's bytes among them; ``done`` once the body is complete."""

    done = False
    ends_at_close = False
    """True when the engine closing its connection is the body's end (no length, no chunks)."""

    def feed(self, data: bytes) -> bytes:
        raise NotImplementedError


class UntilClose(Body):
    """No length and no chunks: the body is everything until the connection closes."""

    ends_at_close = True

    def feed(self, data: bytes) -> bytes:
        return data


class Sized(Body):
    """``Content-Length`` bytes."""

    def __init__(self, length: int) -> None:
        self.left = length
        self.done = length == 0

    def feed(self, data: bytes) -> bytes:
        if len(data) >= self.left:
            data, self.left, self.done = data[: self.left], 0, True
        else:
            self.left -= len(data)
        return data


class Chunked(Body):
    """``Transfer-Encoding: chunked`` (RFC 9112 7.1): size lines, data, a last chunk of size 0
    and trailer lines (dropped) up to a blank one. Any split of the bytes decodes the same."""

    def __init__(self) -> None:
        self.left = 0
        """Data bytes of the current chunk still to come."""
        self.line = b""
        """The start of a line not yet ended (its end is in a later piece)."""
        self.expect = "size"
        """The next line: a chunk's "size", the "end" of its data (empty), or a "trailer"."""

    def one_chunk(self, data: bytes) -> bytes | None:
        """The data of ``data`` when ``data`` is exactly one whole chunk, not the last, from a
        chunk boundary, its size written as servers write it (lowercase hex, no extension):
        the common piece of a stream (the engine writes an event, TCP brings it whole), passed
        on as it came. None otherwise, with nothing consumed: ``feed`` it. (No int() or regex:
        the size line must be exactly what ``frame`` would write for the data that follows.)"""
        if self.left or self.line or self.expect != "size":
            return None
        eol = data.find(b"\r\n", 0, 18)
        size = len(data) - eol - 4
        if eol <= 0 or size <= 0 or data[:eol] != b"%x" % size or data[-2:] != b"\r\n":
            return None
        return data[eol + 2 : -2]

    def feed(self, data: bytes) -> bytes:
        parts: list[bytes] = []
        at, end = 0, len(data)
        while at < end and not self.done:
            if self.left:
                take = min(self.left, end - at)
                parts.append(data[at : at + take])
                at += take
                self.left -= take
                continue
            eol = data.find(b"\n", at)
            if eol < 0:
                self._hold(data[at:])
                break
            self._line_ended(self.line + data[at:eol])
            self.line, at = b"", eol + 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _hold(self, start: bytes) -> None:
        self.line += start
        if len(self.line) > MAX_LINE_BYTES:
            raise BadFraming(f"a chunk line over {MAX_LINE_BYTES} bytes")

    def _line_ended(self, line: bytes) -> None:
        if not line.endswith(b"\r"):
            raise BadFraming("a chunk line not ended by CRLF")
        line = line[:-1]
        if self.expect == "size":
            digits = line.split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(digits):
                raise BadFraming(f"not a chunk size: {line[:40]!r}")
            self.left = int(digits, 16)
            self.expect = "end" if self.left else "trailer"
        elif self.expect == "end":
            if line:
                raise BadFraming("chunk data longer than its size")
            self.expect = "size"
        elif not line:  # the blank line after the last chunk's trailers
            self.done = True


def body_of(head: Head, method: str) -> Body:
    """How the body of this response is framed (RFC 9112 6.3)."""
    if method == "HEAD" or head.status in NO_BODY_STATUS or head.status < 200:
        return Sized(0)
    codings = head.headers.getall("Transfer-Encoding", [])
    if codings:
        if ",".join(codings).replace(" ", "").lower() != "chunked":
            raise BadFraming(f"transfer coding {', '.join(codings)!r} is not passed")
        return Chunked()
    lengths = set(head.headers.getall("Content-Length", []))
    if not lengths:
        return UntilClose()
    length = lengths.pop()
    if lengths or not _DIGITS.fullmatch(length):
        raise BadFraming("an invalid Content-Length")
    return Sized(int(length))


def frame(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)
