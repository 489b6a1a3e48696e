"""A URL that reaches no engine: ``check`` says what it met and where to look, in one short
line. A plain web server (Python's http.server): the status and "a web page" (before: "found 3
series of no known engine (<!DOCTYPE, <html, )" and about 600 characters of fixes for every
engine's metrics, never "404"). A host name that does not resolve: ``dns``, naming the host
(before: connection-refused). Through the console script. (A URL ending in /v1:
tests/data/bad_input/cases.json.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import run_cli_sync
from tests.tools.vllm_server import http_get


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while http_get(url + "/", timeout=1)[0] != 200:  # listening: the condition, bounded
            assert time.monotonic() < deadline, "http.server not listening after 10 s"
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("engine", ["auto", "vllm"])
def test_a_web_server_s_404_page_is_said_as_such(web_server: str, engine: str) -> None:
    ran = run_cli_sync("check", web_server, "--engine", engine, timeout=60)
    assert ran.code == 2, ran
    (line,) = ran.out.strip().splitlines()
    assert "/metrics answered HTTP 404" in line and "check the URL" in line, line
    assert "series" not in line and "--disable-log-stats" not in line, line
    assert len(line) < 300, line


def test_a_host_name_that_does_not_resolve_is_said_as_dns() -> None:
    ran = run_cli_sync("check", "http://no-such-host.invalid:8000", timeout=60)
    assert ran.code == 2, ran
    (line,) = ran.out.strip().splitlines()
    assert ": dns (cannot resolve the host name 'no-such-host.invalid'" in line, line
    assert "connection-refused" not in line, line
