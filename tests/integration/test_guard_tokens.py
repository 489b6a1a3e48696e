"""The guard's token accounting, through the installed console script: ``watch URL --guard-listen``
in front of a real loopback engine (tests/tools/token_engine.py).

- 2: progress is tokens. A stream that sent one token and then only ``: keepalive`` comments
  (or only chunks without a token: empty deltas, role-only, usage-only) is judged stuck and
  ended with the error event while another stream on the same engine moves; that one's tokens
  come in every shape (completions ``text``, chat ``delta.content``, ``reasoning_content``,
  tool-call ``arguments``) and all count. /metrics shows that the gap histogram saw the same
  events as the judge: only the tokens.
- every event-stream shape (tests/tools/token_engine.py SHAPES: CRLF, CR, no space after
  ``data:``, fields and comments first, JSON over two ``data`` lines): a stream that goes
  silent after its first token is ended while the other streams of its shape move, and those
  pass byte-identical with every token counted.
- 12: two clients send the same ``X-Request-Id``, one healthy and one stuck: the stuck one is
  ended, the healthy one completes untouched, and the engine-side abort (its connection closed)
  hits the stuck request only.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.tools.guard import GuardProcess, Stream, start_guard, stop_guard, stream
from tests.tools.token_engine import SHAPES, TokenEngine, token_engine
from tests.tools.watch import metric

STUCK_S = 2.0
MOVING = 80
"""Token events of the moving stream, 0.1 s apart: 8 s, well past STUCK_S and a judge round."""
ARGS = ("--request-stall-seconds", str(STUCK_S), "--no-canary")


async def _pair(
    guard: GuardProcess, stuck: dict[str, object], ids: tuple[str, str]
) -> tuple[Stream, Stream]:
    """The stuck stream and the moving one, side by side through the guard."""
    moving = {"mode": "moving", "events": MOVING, "tag": "moving"}
    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(
            stream(s, guard.guard_url, stuck | {"tag": "stuck"}, ids[0], timeout=60),
            stream(s, guard.guard_url, moving, ids[1], timeout=60),
        )


async def _guarded(engine: TokenEngine) -> GuardProcess:
    return await start_guard("watch", engine.url, *ARGS)


@pytest.mark.parametrize("mode", ["keepalive", "empty"])
async def test_a_stream_without_tokens_is_stuck_while_another_moves(mode: str) -> None:
    async with token_engine() as engine:
        guard = await _guarded(engine)
        try:
            stuck, moving = await _pair(guard, {"mode": mode}, ("quiet-1", "moving-1"))
            text = await guard.metrics()
        finally:
            await stop_guard(guard)
    # was: every keepalive (or empty chunk) counted as progress, the stream never stuck
    assert stuck.error is not None, stuck.events
    assert stuck.done, "the error event is followed by [DONE]"
    assert moving.done and moving.error is None and moving.tokens == MOVING
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 1
    # the judge and the histogram count the same events: tokens only (1 + MOVING)
    assert metric(text, "engine_watchdog_guard_events_total") == 1 + MOVING
    gaps = metric(text, "engine_watchdog_guard_inter_event_seconds_count")
    assert gaps == MOVING - 1, "a keepalive or an empty chunk made a gap"
    assert engine.ended == {"stuck": "cut", "moving": "finished"}


async def test_twins_with_one_request_id_the_stuck_one_alone_is_ended() -> None:
    async with token_engine() as engine:
        guard = await _guarded(engine)
        try:
            stuck, healthy = await _pair(guard, {"mode": "keepalive"}, ("twin", "twin"))
            text = await guard.metrics()
        finally:
            await stop_guard(guard)
    # was: the first open request with that id ended (the healthy twin), the stuck one hung
    assert stuck.error is not None, stuck.events
    assert healthy.done and healthy.error is None and healthy.tokens == MOVING
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 1
    assert engine.ended == {"stuck": "cut", "moving": "finished"}


async def raw(url: str, spec: dict[str, object], request_id: str) -> bytes:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/completions", json=spec, headers={"X-Request-Id": request_id}) as r,
    ):
        return await asyncio.wait_for(r.read(), 60)


async def test_a_silent_stream_of_every_shape_is_ended_while_the_others_move() -> None:
    """Was: events cut at LF-LF alone, so behind a CRLF server (sse-starlette's default) a
    stream silent after its first token was never ended (a client waited 45 s, its own
    timeout, while another stream moved)."""
    shapes = sorted(SHAPES)
    async with token_engine() as engine:
        guard = await _guarded(engine)
        try:
            tags = [f"{mode}-{shape}" for shape in shapes for mode in ("keepalive", "moving")]
            specs = [
                {
                    "mode": tag.split("-")[0],
                    "shape": tag.split("-")[1],
                    "tag": tag,
                    "events": MOVING,
                }
                for tag in tags
            ]
            got = await asyncio.gather(*(raw(guard.guard_url, sp, str(sp["tag"])) for sp in specs))
            bodies = dict(zip(tags, got, strict=True))
            text = await guard.metrics()
        finally:
            await stop_guard(guard)
    for shape in shapes:
        stuck, moving = bodies[f"keepalive-{shape}"], bodies[f"moving-{shape}"]
        assert engine.ended[f"keepalive-{shape}"] == "cut", shape
        assert b"ServiceUnavailableError" in stuck and stuck.endswith(b"data: [DONE]\n\n"), shape
        assert stuck.startswith(engine.sent[f"keepalive-{shape}"][:20]), shape
        assert engine.ended[f"moving-{shape}"] == "finished", shape
        assert moving == engine.sent[f"moving-{shape}"], shape  # byte-identical
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == len(shapes)
    assert metric(text, "engine_watchdog_guard_events_total") == len(shapes) * (1 + MOVING)
