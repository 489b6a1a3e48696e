"""Progress is tokens: which SSE events of a stream carry generated content (docs/guard.md).

An event counts only when it carries what the model generated: completions ``choices[].text``,
chat ``choices[].delta.content``, ``delta.reasoning_content`` / ``delta.reasoning``, or
``delta.tool_calls[].function.arguments``, non-empty (and the Responses and Messages APIs'
text deltas: ``delta``, ``partial_json``, ``thinking``). Not progress: SSE comments
(``: keepalive``, which proxies and gateways send during silence, LiteLLM PR #34821),
``data: [DONE]``, role-only, usage-only and empty deltas.

The scan reads the event's bytes, never JSON: a key of that name whose value is a string that
is not empty. JSON escapes every quote inside a string, so the pattern can only match a real
key, at whatever depth. The two common shapes (vLLM's compact ``"text":"`` and ``"content":"``)
are tried with ``bytes.find`` first, the regular expression only when neither is there. A
stream's events keep one shape, so :class:`Scan` tries the key its last token had first, from
the event's end; an event alone in its read is recognised by one ``memchr`` for its newline
(14 % fewer instructions per relayed event than scanning for the blank line and for each key,
callgrind, benchmarks/hot_path.py). Events are cut at blank lines, also across
chunks (the unfinished event is held, bounded).
"""

from __future__ import annotations

import re

CONTENT = re.compile(
    rb'"(?:text|content|reasoning_content|reasoning|arguments|delta|partial_json|thinking)"'
    rb'\s*:\s*"(?!")'
)
"""A generated-content key with a non-empty string value."""
HOLD_MAX = 65536
"""An unfinished event longer than this is held as a mark (content seen or not) and its tail."""
TAIL = 64
"""What is kept of a long unfinished event: enough for a key cut at the chunk's end."""
SEEN = b'"text":"+'
"""Stands for the part of a long unfinished event that had content (it matches CONTENT)."""
EVENT_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


class Scan:
    """One stream's token scan: its unfinished event, and the content key its events carried
    last (a stream keeps one shape, so that key is tried first, from the event's end, where
    vLLM writes it: one scan of part of the event where a scan per key would cross all of it)."""

    __slots__ = ("key", "pending")

    def __init__(self) -> None:
        self.pending = b""
        """The unfinished event: empty on an event boundary."""
        self.key = b'"text":"'

    def count(self, chunk: bytes) -> int:
        """The events that ``chunk`` ends (after the unfinished one) which carry content."""
        if not self.pending and chunk.find(b"\n") == len(chunk) - 2 and chunk[-1:] == b"\n":
            # the hot path: one whole single-line event (its only newlines end it), found
            # with one memchr; then the key of the last event, from the end
            key = self.key
            at = chunk.rfind(key)
            if at >= 0 and chunk[at + len(key)] != 34:  # (34: '"', an empty string)
                return 1
            return 1 if self._carries(chunk) else 0
        data = self.pending + chunk if self.pending else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self.pending = _held(data)
            return 0
        self.pending = _held(data[end + 2 :])
        return sum(1 for event in data[:end].split(b"\n\n") if self._carries(event))

    def _carries(self, event: bytes) -> bool:
        for key in (b'"text":"', b'"content":"'):
            at = event.find(key)
            if at >= 0 and event[at + len(key) : at + len(key) + 1] != b'"':
                self.key = key
                return True
        return CONTENT.search(event) is not None


def carries(event: bytes) -> bool:
    """Whether one event carries generated content."""
    at = event.find(b'"text":"')
    if at >= 0 and event[at + 8 : at + 9] != b'"':
        return True
    at = event.find(b'"content":"')
    if at >= 0 and event[at + 11 : at + 12] != b'"':
        return True
    return CONTENT.search(event) is not None


def _held(rest: bytes) -> bytes:
    if len(rest) <= HOLD_MAX:
        return rest
    return (SEEN if CONTENT.search(rest) else b"") + rest[-TAIL:]


def engine_id(chunk: bytes) -> str:
    """The engine's id of the request in an event (vLLM: ``cmpl-...``, ``chatcmpl-...``), or
    "" (for the log line of a request the guard ends: the engine's logs name it so)."""
    found = EVENT_ID.search(chunk)
    return found.group(1).decode("utf-8", "replace") if found else ""
