"""An https engine. A real aiohttp server on loopback with a self-signed
certificate made here by Debian's openssl: untrusted, the watchdog says `tls` and names the fix
(it said `too-large`, naming an option that did not exist); with --ca-file (or
ENGINE_WATCHDOG_CA_FILE) it judges the engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import StubFactory
from tests.tools.cli import run_cli, run_cli_sync
from tests.tools.stub_engine import StubEngine, self_signed, server_tls

NO_GPU = "--no-gpu"


@pytest.fixture
async def https_engine(stub_engine: StubFactory, tmp_path: Path) -> tuple[StubEngine, Path]:
    cert, key = self_signed(tmp_path)
    return await stub_engine(tls=server_tls(cert, key)), cert


async def test_an_untrusted_certificate_is_a_tls_error_naming_the_fix(
    https_engine: tuple[StubEngine, Path],
) -> None:
    engine, _ = https_engine
    ran = await run_cli("check", engine.url, "--json", NO_GPU, "--timeout", "5")
    doc = ran.json()
    assert ran.code == 2, ran.out + ran.err  # unreachable, at once: waiting will not help
    assert ran.seconds < 4.0, ran.seconds
    assert doc["engines"][0]["cause"] == "tls", doc
    assert "too-large" not in ran.out
    assert "self-signed certificate" in doc["error"] and "--ca-file" in doc["error"], doc


async def test_with_its_ca_the_https_engine_is_judged(
    https_engine: tuple[StubEngine, Path],
) -> None:
    engine, cert = https_engine
    ran = await run_cli("check", engine.url, "--json", NO_GPU, "--ca-file", str(cert))
    assert (ran.code, ran.json()["evidence"]) == (0, "canary"), ran.out + ran.err
    env = {**os.environ, "ENGINE_WATCHDOG_CA_FILE": str(cert)}
    by_env = await run_cli("check", engine.url, "--json", NO_GPU, env=env)
    assert (by_env.code, by_env.json()["evidence"]) == (0, "canary"), by_env.out + by_env.err


async def test_https_to_a_plain_http_engine_says_so(stub_engine: StubFactory) -> None:
    engine = await stub_engine()
    url = engine.url.replace("http://", "https://")
    ran = await run_cli("check", url, "--json", NO_GPU, "--timeout", "5")
    doc = ran.json()
    assert ran.code == 2 and doc["engines"][0]["cause"] == "tls", ran.out + ran.err
    assert "is the engine serving https" in doc["error"], doc


async def test_a_certificate_for_another_host_says_so(
    stub_engine: StubFactory, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "DNS:engine.example")
    engine = await stub_engine(tls=server_tls(cert, key))
    ran = await run_cli("check", engine.url, "--json", NO_GPU, "--ca-file", str(cert))
    doc = ran.json()
    assert ran.code == 2 and doc["engines"][0]["cause"] == "tls", ran.out + ran.err
    assert "put the host name the certificate names in the URL" in doc["error"], doc


@pytest.mark.parametrize("content", [None, "not a certificate\n"], ids=["missing", "not-pem"])
def test_a_ca_file_that_cannot_be_loaded_is_a_usage_error(
    tmp_path: Path, content: str | None
) -> None:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_text(content)
    ran = run_cli_sync("check", "http://127.0.0.1:9", "--ca-file", str(ca), timeout=60)
    assert ran.code == 64, ran.out + ran.err
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --ca-file"), ran.err
