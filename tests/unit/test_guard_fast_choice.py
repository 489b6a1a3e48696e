"""Which requests take the guard's fast path (guard/fast.py): streams to a plain http://
engine, from HTTP/1.1 clients; everything else keeps the aiohttp path."""

from __future__ import annotations

import pytest
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11
from aiohttp.test_utils import make_mocked_request

from engine_watchdog.core.settings import GuardSettings
from engine_watchdog.guard.fast import Target, wants_stream
from engine_watchdog.guard.proxy import Guard


@pytest.mark.parametrize(
    ("upstream", "target"),
    [
        ("http://127.0.0.1:8000", Target("127.0.0.1", 8000, "127.0.0.1:8000", "")),
        ("http://engine/base/", Target("engine", 80, "engine", "/base")),
        ("http://[::1]:9000", Target("::1", 9000, "[::1]:9000", "")),
        ("https://127.0.0.1:8000", None),
        ("http://user:pw@127.0.0.1:8000", None),
        ("http://127.0.0.1:8000/?q=1", None),
        ("unix:///run/engine.sock", None),
    ],
)
def test_only_a_plain_http_engine_has_a_fast_path(upstream: str, target: Target | None) -> None:
    assert Target.of(upstream) == target


def test_the_option_turns_the_fast_path_off() -> None:
    assert Guard(GuardSettings(), "http://127.0.0.1:8000")._fast is not None
    assert Guard(GuardSettings(fast_path=False), "http://127.0.0.1:8000")._fast is None
    assert Guard(GuardSettings(), "https://127.0.0.1:8000")._fast is None


@pytest.mark.parametrize(
    ("method", "version", "body", "fast"),
    [
        ("POST", HttpVersion11, b'{"model":"m","stream": true}', True),
        ("POST", HttpVersion11, b'{"model":"m","stream":true,"x":1}', True),
        ("POST", HttpVersion11, b'{"model":"m","stream":false}', False),
        ("POST", HttpVersion11, b'{"model":"m"}', False),
        ("POST", HttpVersion10, b'{"stream":true}', False),  # no chunked answers in 1.0
        ("GET", HttpVersion11, b'{"stream":true}', False),
    ],
)
def test_which_requests_are_streams(
    method: str, version: HttpVersion, body: bytes, fast: bool
) -> None:
    request = make_mocked_request(method, "/v1/completions", version=version)
    assert wants_stream(request, body) is fast
