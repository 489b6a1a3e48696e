"""Progress is tokens: which server-sent events of a stream carry generated content.

The rules are written once, in C (guard/sse.h says them in full, guard/sse.c runs them); this is
their Python twin, which runs only where no C compiler built the extension (guard/scan.py picks
one). tests/unit/test_scan_diff.py checks the two against each other, count for count, over
random streams cut at random places.

The stream is read as the WHATWG HTML standard defines an event stream: lines end in CRLF, LF or
CR, a comment is a line that begins with ':', ``data`` values (one leading space dropped) make
an event's data, an empty line dispatches it. An event counts when its data holds what the model
generated: completions ``choices[].text``, chat ``delta.content``, ``reasoning_content`` /
``reasoning``, ``tool_calls[].function.arguments``, and the Responses and Messages APIs'
``delta``, ``partial_json``, ``thinking``: the key, a colon, and a string that is not empty.
Not progress: comments (``: keepalive``, which proxies and gateways send during silence,
LiteLLM PR #34821), ``data: [DONE]``, role-only, usage-only and empty deltas.

This twin reads the same bytes with ``bytes.find`` and regular expressions where the C reads
byte by byte: a line's parts are sliced, and a data value is searched with the token pattern
over the event's data so far with each run of whitespace cut to one byte (which changes no
match: the pattern's keys hold none, and ``\\s*`` takes any number), of which only the last
``TAIL`` bytes are kept: no match is longer.
"""

from __future__ import annotations

import re
from bisect import bisect_left

KEYS = (
    b"text",
    b"content",
    b"reasoning_content",
    b"reasoning",
    b"arguments",
    b"delta",
    b"partial_json",
    b"thinking",
)
"""The generated-content keys (the C's KEYS: the same, in the same order)."""
TOKEN = re.compile(rb'"(?:' + b"|".join(KEYS) + rb')"[ \t\n\r\f\v]*:[ \t\n\r\f\v]*"[^"]')
"""A generated-content key with a non-empty string value."""
COMMON = (b'"text":"', b'"content":"')
"""vLLM's two keys, compact: looked for first (the C's ``common_token``)."""
SPACE = re.compile(rb"[ \t\n\r\f\v]+")
TAIL = len(b'"" : "x') + max(map(len, KEYS)) - 1
"""The longest match (``"key" : "x``, whitespace runs cut to one byte), less one byte."""
BOM = b"\xef\xbb\xbf"
START, NAME, VALUE0, VALUE, SKIP = range(5)
EVENT_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


class PyScan:
    """One stream's event-stream reader and token rule (guard/sse.c ``struct sse``)."""

    __slots__ = ("bom", "carries", "cr", "data", "fields", "line", "name", "tail")

    def __init__(self) -> None:
        self.bom = 0
        """Bytes of a leading U+FEFF matched; 3 once past the stream's start."""
        self.cr = False
        """The last byte was a CR: an LF now ends no line."""
        self.line = START
        self.name = 0
        """Bytes of ``data`` the field's name matched so far; -1: another name."""
        self.fields = False
        """A field line came since the last empty line (the event is open)."""
        self.data = False
        """The event's data buffer is not empty."""
        self.carries = False
        self.tail = b""
        """The end of the event's data, whitespace runs cut to one byte (no token in it)."""

    def scan(self, buf: bytes) -> int:
        """The events that ``buf`` dispatches which carry a token."""
        if (
            self.line == START
            and not self.fields
            and not self.cr
            and self.bom == 3
            and buf.startswith(b"data:")
            and buf.find(b"\n") == len(buf) - 2
            and buf.endswith(b"\n\n")
            and b"\r" not in buf
        ):  # one whole ``data:`` event alone in the read, at an event's boundary: the usual
            value = buf[6:-2] if buf[5:6] == b" " else buf[5:-2]
            self._token(value)
            carried, self.carries, self.tail = self.carries, False, b""
            return int(carried)
        at, n, count = 0, len(buf), 0
        if self.bom < 3:
            at = self._start(buf)
        lf = cr = -2
        while at < n:
            if self.cr:
                self.cr = False
                if buf[at] == 10:  # CRLF: one line end
                    at += 1
                    continue
            if lf < at and lf != -1:
                lf = buf.find(b"\n", at)
            if cr < at and cr != -1:
                cr = buf.find(b"\r", at)
            eol = min(lf, cr) if lf >= 0 and cr >= 0 else max(lf, cr)
            if eol < 0:
                self._line(buf, at, n)
                break
            self._line(buf, at, eol)
            self.cr = buf[eol] == 13
            count += self._end()
            at = eol + 1
        return count

    @property
    def boundary(self) -> bool:
        """The stream so far ends on an event's boundary: a line written now would begin an
        event of its own (no line under way, no field since the last empty line)."""
        return self.line == START and not self.fields

    def _start(self, buf: bytes) -> int:
        at = 0
        while self.bom < 3 and at < len(buf):
            if buf[at] == BOM[self.bom]:
                self.bom += 1
                at += 1
                continue
            if self.bom:  # its first bytes were not one: they begin a field's name
                self.line, self.name, self.fields = NAME, -1, True
            self.bom = 3
        return at

    def _line(self, buf: bytes, at: int, end: int) -> None:
        """The bytes of one line from ``at`` to ``end`` (no CR or LF among them)."""
        if at >= end:
            return
        line = self.line
        if line == START:
            if buf[at] == 58:  # ':' a comment
                self.line = SKIP
                return
            line, self.fields = NAME, True
        if line == NAME:
            colon = buf.find(b":", at, end)
            stop = end if colon < 0 else colon
            if self.name >= 0:
                rest, part = b"data"[self.name :], buf[at:stop]
                self.name = self.name + len(part) if rest.startswith(part) else -1
            if colon < 0:
                self.line = NAME
                return
            if self.name != 4:
                self.line = SKIP
                return
            self._data_line()
            line, at = VALUE0, colon + 1
            if at >= end:
                self.line = line
                return
        if line == VALUE0:
            line = VALUE
            if buf[at] == 32:
                at += 1
        self.line = line
        if line == VALUE and at < end and not self.carries:
            self._token(buf[at:end])

    def _data_line(self) -> None:
        if self.data and not self.carries:
            self._token(b"\n")
        self.data = True

    def _end(self) -> int:
        dispatched = 0
        if self.line == START:  # an empty line: the event
            dispatched = int(self.data and self.carries)
            self.fields = self.data = self.carries = False
            self.tail = b""
        elif self.line == NAME and self.name == 4:  # "data" alone: an empty value
            self._data_line()
        self.line, self.name = START, 0
        return dispatched

    def _token(self, part: bytes) -> None:
        for key in COMMON:  # (as common_token in C: a match inside the part is a match)
            at = part.find(key)
            while at >= 0:
                after = at + len(key)
                if after < len(part) and part[after] != 34:  # not '"': a non-empty string
                    self.carries, self.tail = True, b""
                    return
                at = part.find(key, after)
        text = SPACE.sub(b" ", self.tail + part)
        if TOKEN.search(text):
            self.carries, self.tail = True, b""
        else:
            self.tail = text[-TAIL:]


class PyHist:
    """Gaps between a stream's tokens (guard/sse.c ``struct hist``): ``counts[i]`` counts gaps
    up to ``bounds[i]``, the last the rest."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def note(self, gap: float) -> None:
        self.counts[bisect_left(self.bounds, gap)] += 1
        self.total += gap

    def snapshot(self) -> tuple[tuple[int, ...], float]:
        return tuple(self.counts), self.total


class PyProgress:
    """One stream's progress (guard/sse.c ``progress_feed``): its reader, its last token's time,
    its gaps into the guard's histogram."""

    __slots__ = ("gaps", "last_t", "scan_")

    def __init__(self, gaps: PyHist) -> None:
        self.gaps = gaps
        self.scan_ = PyScan()
        self.last_t: float | None = None

    @property
    def boundary(self) -> bool:
        return self.scan_.boundary

    def feed(self, buf: bytes, now: float) -> int:
        """The tokens ``buf`` carried; their read's gap noted where it carried any."""
        k = self.scan_.scan(buf)
        if k:
            if self.last_t is not None:
                self.gaps.note(now - self.last_t)
            self.last_t = now
        return k


def engine_id(chunk: bytes) -> str:
    """The engine's id of the request in an event (vLLM: ``cmpl-...``, ``chatcmpl-...``), or
    "" (for the log line of a request the guard ends: the engine's logs name it so)."""
    found = EVENT_ID.search(chunk)
    return found.group(1).decode("utf-8", "replace") if found else ""
