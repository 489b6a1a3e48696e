"""The guard's trust in its clients, through the installed console script: ``watch URL
--guard-listen`` in front of a real loopback aiohttp engine (tests/tools/stub_engine.py).

- 3: the engine URL carries ``user:password@``. The guard adds no credential of its own: a
  client that brings its own ``Authorization`` gets the engine's answer and the engine receives
  that header untouched; a client without any gets the engine's own 401. Neither the URL's
  password nor ``redacted`` ever reaches the engine from the guard, and the password appears in
  nothing the watchdog prints.
- 4: an https engine whose certificate a private CA (made here by openssl) signed, watched with
  ``--ca-file``: requests through the guard are answered 200 and stream.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import aiohttp

from tests.integration.conftest import StubFactory
from tests.integration.test_engine_connection import private_ca
from tests.tools.guard import GuardProcess, start_guard, stop_guard
from tests.tools.stub_engine import Body, server_tls

USER, PASSWORD = "probe-user", "pw-case3-s3cr3t"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SSE = b"".join(b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i for i in range(5))
SSE += b"data: [DONE]\n\n"


def _stream() -> Body:
    return Body(SSE, chunk=48, delay_s=0.05, content_type="text/event-stream")


async def _post(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/completions",
            json={"model": "stub-model", "prompt": "x", "stream": True},
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=20),
        ) as r,
    ):
        return r.status, await r.read()


async def _stop_and_output(guard: GuardProcess) -> str:
    await stop_guard(guard)
    assert guard.proc.stderr is not None
    err = await asyncio.wait_for(guard.proc.stderr.read(), 10)
    return err.decode(errors="replace") + repr(guard.lines)


async def test_the_guard_adds_no_credential_and_passes_the_clients_own(
    stub_engine: StubFactory,
) -> None:
    engine = await stub_engine({"/v1/completions": _stream}, basic=BASIC)
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{engine.port}"
    # No canary: every /v1/completions the engine sees is then one a client sent.
    guard = await start_guard("watch", url, "--no-canary", log=True)
    try:
        status, body = await _post(guard.guard_url, {"Authorization": BASIC})
        assert status == 200, body  # was 500: the guard built from the redacted display URL
        assert body == SSE
        mine = {"Authorization": "Bearer the-clients-own-token"}
        status, body = await _post(guard.guard_url, mine)
        assert status == 401, body  # the engine's own answer to that header, not the guard's
        status, body = await _post(guard.guard_url, {})
        assert status == 401, body  # no open door: the engine's own 401
        assert b"Unauthorized" in body
    finally:
        output = await _stop_and_output(guard)
    through = [auth for _, path, auth in engine.seen if path == "/v1/completions"]
    assert through == [BASIC, "Bearer the-clients-own-token", ""]
    assert not any("redacted" in auth for _, _, auth in engine.seen)
    assert PASSWORD not in output


async def test_an_https_engine_with_a_private_ca_streams_through_the_guard(
    stub_engine: StubFactory, tmp_path: Path
) -> None:
    ca, cert, key = private_ca(tmp_path)
    engine = await stub_engine({"/v1/completions": _stream}, tls=server_tls(cert, key))
    guard = await start_guard("watch", engine.url, "--ca-file", str(ca))
    try:
        for _ in range(3):
            status, body = await _post(guard.guard_url, {})
            assert status == 200, body  # was 503 "the engine is not listening": no TLS
            assert body == SSE
    finally:
        await stop_guard(guard)
