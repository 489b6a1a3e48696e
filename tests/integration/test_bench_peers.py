"""benchmarks/guard.py --peers cannot rot: nginx and HAProxy are set up, one tiny round runs
through the guard and both peers (clients spread over two processes), and every row of the
table has events and no errors. Skipped, with the reason, where the peers cannot be installed."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import proxy_peers
from tests.tools.bench import guard_round


def test_peers_round_through_nginx_and_haproxy() -> None:
    try:
        proxy_peers.ensure_installed()
    except (proxy_peers.Missing, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"nginx/haproxy not installable here: {exc}")
    by_proxy, out = guard_round("--streams", "8", "--peers", "--client-procs", "2")
    assert set(by_proxy) == {"guard", "nginx", "haproxy"}, out
    for cells in by_proxy.values():
        assert float(cells[4]) > 0, out  # proxied events/s
        assert cells[11].strip() == "0", out  # errors
