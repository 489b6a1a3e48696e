"""Which events are progress (guard/sse.h: the rules; guard/sse.c and guard/tokens.py: the two
readers): every shape of event stream the WHATWG standard allows, each reader, whole and cut
into reads anywhere. (tests/unit/test_scan_diff.py fuzzes the two against each other.)"""

from __future__ import annotations

from typing import Any

import pytest

from engine_watchdog.core.wire import GAP_BOUNDS
from engine_watchdog.guard.tokens import PyHist, PyProgress

try:
    from engine_watchdog.guard import _relay
except ImportError:  # no compiler: the twin alone
    _relay = None  # type: ignore[assignment]


def python() -> tuple[Any, Any]:
    hist = PyHist(GAP_BOUNDS)
    return PyProgress(hist), hist


def compiled() -> tuple[Any, Any]:
    hist = _relay.Hist(GAP_BOUNDS)
    return _relay.Progress(hist), hist


def readers() -> list[Any]:
    """A stream's Progress and its guard's Hist, from each reader built here."""
    out: list[Any] = [pytest.param(python, id="python")]
    if _relay is not None:
        out.append(pytest.param(compiled, id="c"))
    return out


TOKEN = b'{"id":"cmpl-1","choices":[{"index":0,"text":" the"}]}'
SHAPES: dict[str, tuple[bytes, int]] = {
    "LF": (b"data: " + TOKEN + b"\n\n", 1),
    "CRLF (sse-starlette's default)": (b"data: " + TOKEN + b"\r\n\r\n", 1),
    "CR": (b"data: " + TOKEN + b"\r\r", 1),
    "mixed line ends": (b"data: " + TOKEN + b"\r\n\n", 1),
    "no space after data:": (b"data:" + TOKEN + b"\n\n", 1),
    "other fields first": (
        b"event: delta\r\nid: 3\r\nretry: 100\r\ndata: " + TOKEN + b"\r\n\r\n",
        1,
    ),
    "a comment before": (b": ping\ndata: " + TOKEN + b"\n\n", 1),
    "a comment inside": (b"event: x\n: ping\ndata: " + TOKEN + b"\n\n", 1),
    "JSON split over data lines": (b'data: {"choices":[{"text":\ndata: " a"}]}\n\n', 1),
    "a leading BOM": (b"\xef\xbb\xbfdata: " + TOKEN + b"\n\n", 1),
    "chat content": (b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', 1),
    "reasoning": (b'data: {"choices":[{"delta":{"reasoning_content":"x"}}]}\n\n', 1),
    "tool arguments": (b'data: {"delta":{"tool_calls":[{"function":{"arguments":"{"}}]}}\n\n', 1),
    "Messages API text delta": (b'event: content_block_delta\ndata: {"delta":{"text":"x"}}\n\n', 1),
    "spaces around the colon": (b'data: {"text" :\t" a"}\n\n', 1),
    "a keepalive comment": (b": keepalive\n\n", 0),
    "[DONE]": (b"data: [DONE]\n\n", 0),
    "an empty delta": (b'data: {"choices":[{"text":""}]}\n\n', 0),
    "role only": (b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n', 0),
    "usage only": (b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n', 0),
    "the key in a comment": (b': {"text":"x"}\n\n', 0),
    "the key in another field": (b'event: {"text":"x"}\n\n', 0),
    "an escaped key in a value": (b'data: {"text":"","note":"\\"text\\":\\"x"}\n\n', 0),
    "an event never ended": (b"data: " + TOKEN + b"\n", 0),
    "a BOM not at the start": (b"\n\xef\xbb\xbfdata: " + TOKEN + b"\n\n", 0),
    "a field named data2": (b"data2: " + TOKEN + b"\n\n", 0),
}


@pytest.mark.parametrize("make", readers())
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_counts_its_tokens_whole_and_cut_anywhere(make: Any, shape: str) -> None:
    data, tokens = SHAPES[shape]
    stream = data + 2 * data.removeprefix(b"\xef\xbb\xbf")  # (a BOM only at the start)
    assert make()[0].feed(stream, 1.0) == 3 * tokens
    for cut in range(len(stream) + 1):
        p, _ = make()
        assert p.feed(stream[:cut], 1.0) + p.feed(stream[cut:], 2.0) == 3 * tokens, cut


@pytest.mark.parametrize("make", readers())
def test_the_boundary_is_where_a_line_written_now_begins_an_event_of_its_own(make: Any) -> None:
    p, _ = make()
    assert p.boundary
    for piece, boundary in [
        (b"data: " + TOKEN, False),  # a line under way
        (b"\n", False),  # the event's data buffered: a data line now would join it
        (b"\n", True),
        (b"event: x\r\n", False),  # its type would be the next data's
        (b"\r\n", True),
        (b": ping\n", True),  # a comment opens nothing
        (b"data: x\r", False),
        (b"\n\r", True),  # the CR's LF was its own; the next CR ends the event
    ]:
        p.feed(piece, 1.0)
        assert p.boundary == boundary, piece


@pytest.mark.parametrize("make", readers())
def test_a_read_with_tokens_is_one_gap_and_the_first_token_none(make: Any) -> None:
    p, hist = make()
    event = b"data: " + TOKEN + b"\n\n"
    assert p.feed(event, 10.0) == 1
    assert hist.snapshot() == ((0,) * (len(GAP_BOUNDS) + 1), 0.0)
    assert p.feed(event * 3, 10.2) == 3
    assert p.feed(b": keepalive\n\n", 11.0) == 0  # no token: no gap, the last token's time kept
    assert p.feed(event, 12.0) == 1
    counts, total = hist.snapshot()
    assert counts[GAP_BOUNDS.index(0.25)] == 1 and counts[GAP_BOUNDS.index(2.5)] == 1
    assert sum(counts) == 2 and total == pytest.approx(2.0)
