"""The fast path's HTTP/1.1 framing (guard/http1.py), pure: a body decodes to the same bytes
however TCP cuts it, a response head is read as aiohttp would, and what is not HTTP/1.1 the
guard can pass is refused rather than passed wrong."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from engine_watchdog.guard.http1 import (
    BadFraming,
    Body,
    Chunked,
    Head,
    Sized,
    UntilClose,
    body_of,
    frame,
    parse_head,
    request_head,
)


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    """``pieces`` as a chunked body, the way an engine's server writes one."""
    return (
        b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n" + trailers + b"\r\n"
    )


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(at)]


def decode(body: Body, parts: list[bytes]) -> tuple[bytes, int]:
    """The decoded body, and how many parts it took to complete."""
    out, used = [], 0
    for part in parts:
        if body.done:
            break
        out.append(body.feed(part))
        used += 1
    return b"".join(out), used


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
    ext=st.booleans(),
)
def test_a_chunked_body_decodes_the_same_however_it_is_cut(
    pieces: list[bytes], cuts: list[int], ext: bool
) -> None:
    raw = chunked(pieces, b"X-Trailer: 1\r\n" if ext else b"")
    if ext:  # a chunk extension on every size line: ignored
        raw = raw.replace(b"\r\n", b";name=value\r\n", 1)
    body = Chunked()
    got, _used = decode(body, split(raw + b"HTTP/1.1 200 OK\r\n", cuts))
    assert got == b"".join(pieces)
    assert body.done


def test_a_chunked_body_cut_at_every_byte() -> None:
    """Every single-byte split: the size line, its CR and LF, the data, the CRLF after it, the
    last chunk and the blank line, with events ending across chunks."""
    events = [b"data: one\n", b"\n", b"data: two\n\nda", b"ta: three\n\n", b"x" * 40]
    raw = chunked(events)
    body = Chunked()
    got, _ = decode(body, [raw[i : i + 1] for i in range(len(raw))])
    assert got == b"".join(events) and body.done


def relay(body: Chunked, parts: list[bytes]) -> tuple[bytes, list[bytes]]:
    """What the fast path does with each part: a whole chunk passes as it came, anything else
    is decoded and framed again. The decoded body, and what the client was sent."""
    got, sent = [], []
    for part in parts:
        if body.done:
            break
        piece = body.one_chunk(part)
        if piece is not None:
            got.append(piece)
            sent.append(part)
        else:
            got.append(body.feed(part))
            sent.append(frame(got[-1]) if got[-1] else b"")
    return b"".join(got), sent


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
    whole=st.booleans(),
)
def test_whole_chunks_pass_as_they_came_and_the_body_reads_the_same(
    pieces: list[bytes], cuts: list[int], whole: bool
) -> None:
    """However TCP cuts the body (or, ``whole``, one chunk a read, as engines write events),
    the client gets the same data in valid chunks, and the end is still found."""
    raw = chunked(pieces)
    parts = [frame(p) for p in pieces if p] + [b"0\r\n\r\n"] if whole else split(raw, cuts)
    body = Chunked()
    got, sent = relay(body, parts)
    assert got == b"".join(pieces) and body.done
    client = Chunked()
    assert client.feed(b"".join(sent) + b"0\r\n\r\n") == got and client.done
    if whole:  # every event passed untouched
        assert sent[: len(parts) - 1] == parts[:-1]


@pytest.mark.parametrize(
    "part",
    [
        b"0\r\n\r\n",  # the last chunk: feed() ends the body
        b"4;x=1\r\ndata\r\n",  # an extension: decoded, not passed
        b"4\r\ndata\r\n4\r\ndata\r\n",  # two chunks in one read
        b"4\r\ndat",  # a chunk not yet whole
        b"5\r\ndata\r\n",  # its size is not its length
        b"0x4\r\ndata\r\n",  # a prefix int() would take
        b"04\r\ndata\r\n",  # valid, but not as frame() writes it: feed() decodes it
        b"A\r\n0123456789\r\n",  # valid uppercase hex: the same
        b"\r\n\r\n",  # no size
    ],
)
def test_what_is_not_exactly_one_whole_chunk_is_left_to_feed(part: bytes) -> None:
    assert Chunked().one_chunk(part) is None
    mid = Chunked()
    mid.feed(b"4\r\nda")  # inside a chunk: nothing is a whole chunk
    assert mid.one_chunk(b"4\r\ndata\r\n") is None


def test_a_chunked_body_is_not_done_before_its_last_chunk() -> None:
    body = Chunked()
    raw = chunked([b"data: x\n\n"])
    assert body.feed(raw[:-5]) == b"data: x\n\n"
    assert not body.done
    body.feed(raw[-5:])
    assert body.done


@pytest.mark.parametrize(
    "raw",
    [
        b"zz\r\ndata\r\n",  # not hex
        b"0x4\r\ndata\r\n",  # a prefix int() would take
        b"1_0\r\n",  # an underscore int() would take
        b"4\r\ndata and more\r\n",  # data longer than its size
        b"4\ndata\r\n",  # a bare LF
        b"4" * 5000,  # a size line that never ends
    ],
)
def test_bad_chunked_framing_is_refused(raw: bytes) -> None:
    with pytest.raises(BadFraming):
        Chunked().feed(raw)


def test_a_sized_body_ends_at_its_length_and_until_close_never() -> None:
    body = Sized(10)
    assert body.feed(b"0123") == b"0123" and not body.done
    assert body.feed(b"456789HTTP/1.1") == b"456789" and body.done
    assert Sized(0).done
    forever = UntilClose()
    assert forever.feed(b"abc") == b"abc" and not forever.done and forever.ends_at_close


def head(status: int = 200, **fields: str) -> Head:
    headers = CIMultiDict((k.replace("_", "-"), v) for k, v in fields.items())
    return Head(status, "OK", CIMultiDictProxy(headers))


def test_how_a_response_body_is_framed() -> None:
    assert isinstance(body_of(head(Transfer_Encoding="chunked"), "POST"), Chunked)
    assert isinstance(
        body_of(head(Transfer_Encoding="Chunked", Content_Length="5"), "POST"), Chunked
    )
    sized = body_of(head(Content_Length="12"), "POST")
    assert isinstance(sized, Sized) and sized.left == 12
    assert isinstance(body_of(head(), "POST"), UntilClose)
    for no_body in (body_of(head(204), "POST"), body_of(head(304), "GET"), body_of(head(), "HEAD")):
        assert no_body.done
    for bad in (head(Transfer_Encoding="gzip, chunked"), head(Content_Length="-1")):
        with pytest.raises(BadFraming):
            body_of(bad, "POST")


def test_a_response_head_is_read_as_sent() -> None:
    got = parse_head(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Empty:\r\nx-odd: caf\xc3\xa9 \xff"
    )
    assert (got.status, got.reason) == (200, "OK")
    assert got.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert got.headers.getall("set-cookie") == ["a=1", "b=2"]
    assert got.headers["X-Empty"] == ""
    assert got.headers["X-Odd"].encode("utf-8", "surrogateescape") == b"caf\xc3\xa9 \xff"
    assert parse_head(b"HTTP/1.0 404").reason == ""
    for bad in (b"HTTP/2 200 OK", b"ICY 200 OK", b"HTTP/1.1 200 OK\r\n folded: no"):
        with pytest.raises(BadFraming):
            parse_head(bad)


def test_a_request_head_carries_what_the_client_sent() -> None:
    headers = CIMultiDict([("X-Request-Id", "r-1"), ("Accept", "a"), ("Accept", "b")])
    headers["X-Odd"] = b"\xff".decode("utf-8", "surrogateescape")
    raw = request_head("POST", "/v1/completions?x=1", "127.0.0.1:8000", headers, 7)
    assert raw == (
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nX-Request-Id: r-1\r\n"
        b"Accept: a\r\nAccept: b\r\nX-Odd: \xff\r\nContent-Length: 7\r\n\r\n"
    )
    with pytest.raises(ValueError, match="CR or LF"):
        request_head("POST", "/", "h", CIMultiDict({"X-Evil": "a\r\nHost: other"}), 0)


def test_a_frame_is_one_chunk() -> None:
    body = Chunked()
    assert body.feed(frame(b"data: x\n\n") + frame(b"y" * 300) + b"0\r\n\r\n") == (
        b"data: x\n\n" + b"y" * 300
    )
    assert body.done
