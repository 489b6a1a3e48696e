"""The per-event rules in C (guard/sse.c, through guard/_relay.c) against their Python twin
(guard/tokens.py), and both against a reading of the WHATWG event-stream rules written here
from the standard's text alone: the same streams, cut into reads at random places, give the
same tokens read by read, the same gaps, the same boundary.

The streams are built from the pieces that matter to the rules: every line end (CRLF, LF, CR,
and a CRLF cut between reads), ``data`` with and without its space, other fields, comments, a
leading U+FEFF, keys and near-keys, quotes, whitespace runs, empty and non-empty values, UTF-8
cut inside a character, and events far larger than a read. ``ENGINE_WATCHDOG_FUZZ_SECONDS``
sets how long the timed run goes on (``make sanitize`` gives it longer, under each sanitizer).
"""

from __future__ import annotations

import os
import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_watchdog.core.wire import GAP_BOUNDS
from engine_watchdog.guard.tokens import KEYS, PyHist, PyProgress

relay = pytest.importorskip("engine_watchdog.guard._relay")

ATOMS = [
    b"data", b"data:", b"data: ", b"dat", b"ata", b"event: delta", b"id: 7", b"retry: 10",
    b": keepalive", b":", b" ", b"  ", b"\t", b"\x0b", b"\x0c", b"\n", b"\r", b"\r\n",
    b'"', b'":"', b'" : "', b"{", b"}", b",", b"x", b"\\", b'\\"', b"\xef\xbb\xbf", b"\xef",
    b"\xc3\xa9", b"\xe2\x82", b"\xac", b"\xf0\x9f\x98", b"\x80",
    *KEYS, b"texts", b"reasoning_conten", b"_content",
    b'"text":" a"', b'"content":""', b'"delta":"x"', b'{"text":\n"y"}',
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" the"}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\n',
    b'data:{"choices":[{"delta":{"role":"assistant"}}]}\r\r',
    b"data: [DONE]\n\n",
]  # fmt: skip
SPEC_TOKEN = re.compile(rb'"(?:' + b"|".join(KEYS) + rb')"[ \t\n\r\f\v]*:[ \t\n\r\f\v]*"[^"]')


def spec_tokens(stream: bytes) -> int:
    """The events of a whole stream that carry a token, read as the standard says: one
    leading U+FEFF dropped; lines end at CRLF, LF or CR; an unfinished last line is dropped;
    comments skipped; a field's value less one leading space; each data value plus LF into the
    buffer; an empty line dispatches a non-empty buffer, less its last LF."""
    stream = stream.removeprefix(b"\xef\xbb\xbf")
    lines = re.split(rb"\r\n|\r|\n", stream)[:-1]
    count, data = 0, None
    for line in lines:
        if not line:
            if data is not None and SPEC_TOKEN.search(data[:-1]):
                count += 1
            data = None
        elif not line.startswith(b":"):
            name, _, value = line.partition(b":")
            if name == b"data":
                data = (data or b"") + value.removeprefix(b" ") + b"\n"
    return count


def stream_of(rng: random.Random, atoms: int) -> bytes:
    parts = [rng.choice(ATOMS) for _ in range(atoms)]
    if rng.random() < 0.05:  # an event far larger than a read
        parts.insert(
            rng.randrange(len(parts) + 1), b"data: " + b"z" * rng.randrange(70_000, 200_000)
        )
    return b"".join(parts)


def cuts_of(rng: random.Random, n: int) -> list[int]:
    return sorted({rng.randrange(n + 1) for _ in range(rng.randrange(8))} | {n})


def compare(stream: bytes, cuts: list[int]) -> None:
    """C and twin read for read (tokens, boundary), gaps at the end; the total is the spec's."""
    c_hist, py_hist = relay.Hist(GAP_BOUNDS), PyHist(GAP_BOUNDS)
    c, py = relay.Progress(c_hist), PyProgress(py_hist)
    at, total = 0, 0
    for i, cut in enumerate(cuts):
        part, now = stream[at:cut], 1.0 + 0.37 * i
        got = (c.feed(part, now), c.boundary)
        want = (py.feed(part, now), py.boundary)
        assert got == want, (stream, cuts, i)
        total += got[0]
        at = cut
    assert c_hist.snapshot() == py_hist.snapshot(), (stream, cuts)
    assert total == spec_tokens(stream), (stream, cuts)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(ATOMS), max_size=60), st.lists(st.integers(0, 10_000), max_size=8))
def test_c_and_its_twin_agree_on_every_cut_of_every_stream(
    atoms: list[bytes], at: list[int]
) -> None:
    stream = b"".join(atoms)
    compare(stream, sorted({min(a, len(stream)) for a in at} | {len(stream)}))


def test_c_and_its_twin_agree_for_as_long_as_the_fuzz_is_given() -> None:
    """A timed run of random streams (seeded, so a failure names its seed)."""
    budget = float(os.environ.get("ENGINE_WATCHDOG_FUZZ_SECONDS", "3"))
    seed = int(os.environ.get("ENGINE_WATCHDOG_FUZZ_SEED", time.time_ns() % 1_000_000))
    rng, streams, size = random.Random(seed), 0, 0
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        stream = stream_of(rng, rng.randrange(1, 120))
        try:
            compare(stream, cuts_of(rng, len(stream)))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, stream {streams}") from exc
        streams += 1
        size += len(stream)
    print(f"\n[fuzz] seed {seed}: {streams} streams, {size} bytes compared in {budget:g} s")
    assert streams > 100


def test_the_readers_agree_on_a_multi_megabyte_event_cut_into_reads() -> None:
    event = b'data: {"choices":[{"text":"' + b"w" * 3_000_000 + b'"}]}\r\n\r\n'
    compare(event * 2, [*range(65_536, 2 * len(event), 65_536), 2 * len(event)])
