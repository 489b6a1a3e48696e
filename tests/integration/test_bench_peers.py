"""benchmarks/guard.py --peers cannot rot: nginx and HAProxy are set up, one tiny round runs
through the guard and both peers (clients spread over two processes), and every row of the
table has events and no errors. Skipped, with the reason, where the peers cannot be installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import proxy_peers

ROOT = Path(__file__).resolve().parents[2]


def test_peers_round_through_nginx_and_haproxy() -> None:
    try:
        proxy_peers.ensure_installed()
    except (proxy_peers.Missing, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"nginx/haproxy not installable here: {exc}")
    argv = [sys.executable, "-m", "benchmarks.guard", "--streams", "8", "--seconds", "1"]
    argv += ["--rounds", "1", "--rate", "20", "--peers", "--client-procs", "2"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    by_proxy = {cells[1].strip(): cells for cells in rows[1:]}
    assert set(by_proxy) == {"guard", "nginx", "haproxy"}, out
    for cells in by_proxy.values():
        assert float(cells[4]) > 0, out  # proxied events/s
        assert cells[11].strip() == "0", out  # errors
