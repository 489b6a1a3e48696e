"""The guard's token scan (guard/tokens.py): its one-event fast path counts what the general
path counts, however an engine cuts its stream into reads, whatever shape its events have."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_watchdog.guard.tokens import Scan

COMPLETION = b'data: {"id":"cmpl-1","choices":[{"index":0,"text":%b,"logprobs":null}]}\n\n'
CHAT = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":%b}}]}\n\n'
REASONING = b'data: {"choices":[{"delta":{"reasoning_content":%b}}]}\n\n'
TWO_LINES = b'event: delta\ndata: {"choices":[{"delta":{"content":%b}}]}\n\n'
NO_TOKEN = (
    b": keepalive\n\n",
    b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
    b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n',
    b"data: [DONE]\n\n",
)
SHAPES = (COMPLETION, CHAT, REASONING, TWO_LINES)
VALUES = (b'" the"', b'""', b'"\\"text\\":\\"x"', b'"\\n"')
"""A token, an empty string (no token), a quoted key inside a value, an escaped newline."""


def event(shape: int, value: int) -> bytes:
    return SHAPES[shape] % VALUES[value]


def carries(value: int) -> bool:
    return VALUES[value] != b'""'


events = st.one_of(
    st.tuples(st.integers(0, len(SHAPES) - 1), st.integers(0, len(VALUES) - 1)),
    st.integers(0, len(NO_TOKEN) - 1),
)


def encoded(picked: object) -> tuple[bytes, int]:
    """An event's bytes and its tokens (1 or 0)."""
    if isinstance(picked, tuple):
        return event(*picked), int(carries(picked[1]))
    assert isinstance(picked, int)
    return NO_TOKEN[picked], 0


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=12), st.lists(st.integers(1, 400), max_size=12))
def test_any_cut_of_a_stream_counts_its_tokens_once(picked: list[object], cuts: list[int]) -> None:
    parts = [encoded(p) for p in picked]
    stream = b"".join(data for data, _ in parts)
    scan, counted, at = Scan(), 0, 0
    for size in [*cuts, len(stream)]:
        if at < len(stream):
            counted += scan.count(stream[at : at + size])
            at += size
    assert counted == sum(tokens for _, tokens in parts)
    assert scan.pending == b""


def test_a_stream_that_changes_shape_is_still_counted() -> None:
    scan = Scan()
    assert scan.count(event(0, 0)) == 1  # completions' "text"
    assert scan.count(event(1, 0)) == 1  # then chat's "content": the remembered key misses
    assert scan.count(event(1, 1)) == 0  # an empty delta is no token
    assert scan.count(event(2, 0)) == 1  # reasoning, only the expression finds it
    assert [scan.count(e) for e in NO_TOKEN] == [0, 0, 0, 0]


def test_an_empty_last_key_does_not_hide_an_earlier_token() -> None:
    both = b'data: {"choices":[{"text":" a"},{"text":""}]}\n\n'
    assert Scan().count(both) == 1
