"""A port in use, through the console script: one line naming the option,
the port and the fix, exit 64, no 'never awaited' warning, nothing left running."""

from __future__ import annotations

import socket
import subprocess

import pytest

from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import run_cli_sync

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("flag", ["--listen", "--guard-listen"])
def test_a_busy_port_is_one_line_and_exit_64(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = f"http://127.0.0.1:{free_port()}"
        others = ["--listen", ""] if flag == "--guard-listen" else []
        ran = run_cli_sync("watch", engine, *others, flag, f"127.0.0.1:{port}", timeout=60)
    lines = ran.err.strip().splitlines()
    assert ran.code == 64, ran
    assert lines[-1].startswith(f"error: {flag} 127.0.0.1:{port}: "), lines
    assert "free host:port" in lines[-1], lines
    assert "never awaited" not in ran.err and "Traceback" not in ran.err, ran.err


def test_run_on_a_busy_port_starts_no_engine(tmp_path: object) -> None:
    marker = f"busy-port-engine-{free_port()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = f"http://127.0.0.1:{free_port()}"
        ran = run_cli_sync(
            "run", engine, "--listen", f"127.0.0.1:{port}", "--incident-dir", str(tmp_path),
            "--", "sh", "-c", f"sleep 60 # {marker}", timeout=60,
        )  # fmt: skip
    assert ran.code == 64 and f"--listen 127.0.0.1:{port}: " in ran.err, ran
    assert "never awaited" not in ran.err and "Traceback" not in ran.err, ran.err
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=10)
    assert marker not in ps.stdout  # the engine was never started
