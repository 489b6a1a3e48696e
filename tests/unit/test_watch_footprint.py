"""What a plain ``watch`` holds in memory: only what a round needs (docs/performance.md,
"Footprint of watch"). The guard, capture, the peers, the Kubernetes and Alertmanager clients,
the other commands and aiohttp's server are imported when a flag, an incident or a command asks
for them; each held from the start costs RSS in a sidecar that runs for weeks.

The real command line runs in a child process (a fresh interpreter: this one has imported
everything), starts, probes a few rounds, stops on SIGTERM; its ``sys.modules`` is read after
the stop, so what start-up and the stop import both count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from benchmarks import footprint_watch

NOT_AT_START = (
    # the guard: its proxy, data path and loop (only with --guard-listen; its parser,
    # httptools, also reads the own server's requests: runtime/endpoints.py)
    "engine_watchdog.guard.proxy",
    "engine_watchdog.guard.fast",
    "engine_watchdog.guard.drain",
    "engine_watchdog.guard.stats",
    "uvloop",
    # capture: the bundle writer and its steps (at the first incident)
    "engine_watchdog.capture.bundle",
    "engine_watchdog.capture.steps",
    "engine_watchdog.capture.pyspy",
    "engine_watchdog.capture.pyspy_text",
    "engine_watchdog.capture.summary",
    "engine_watchdog.capture.known_hangs",
    "engine_watchdog.hangs",
    "tarfile",
    # multi-node (--peers or LeaderWorkerSet) and the services beside the engine
    "engine_watchdog.runtime.peering",
    "engine_watchdog.peers.endpoint",
    "engine_watchdog.peers.fanout",
    "engine_watchdog.net.k8s_api",
    "engine_watchdog.capture.pod_log",
    "engine_watchdog.report.alertmanager",
    "engine_watchdog.report.k8s_events",
    "engine_watchdog.report.readiness",
    # the other commands, and aiohttp's server (runtime/endpoints.py serves /metrics without it)
    "engine_watchdog.sim",
    "engine_watchdog.cli.demo",
    "engine_watchdog.cli.capture",
    "engine_watchdog.cli.hangscmd",
    "engine_watchdog.cli.tracecmd",
    "engine_watchdog.cli.peercmd",
    "aiohttp.web",
)
"""Modules (and the packages under them) a plain ``watch`` never imports."""
RAN = (
    "engine_watchdog.runtime.watch.watcher",
    "engine_watchdog.core.detector",
    "engine_watchdog.runtime.act.supervisor",
    "engine_watchdog.recovery.actions",
    "engine_watchdog.runtime.endpoints",
)
"""It did run a watch: the probes, the detector, the supervisor of --action's default, its
own server."""

CHILD = (
    "import os, signal, threading\n"
    "threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n" + footprint_watch.CHILD
)
"""benchmarks/footprint_watch.py's child (a real command line that lists its modules once it
stops), stopped by SIGTERM after 3 s."""


def watch_modules(tmp_path: Path) -> dict[str, object]:
    """``watch`` of an engine that does not answer (a round is made either way), with its own
    server listening: the exit code and every module it imported."""
    out = tmp_path / "modules.json"
    args = ["watch", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--incident-dir",
            str(tmp_path / "incidents")]  # fmt: skip
    # Neither LeaderWorkerSet's variables nor a ConfigMap's options of the machine running this.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LWS_", "ENGINE_WATCHDOG_"))}
    subprocess.run([sys.executable, "-c", CHILD, str(out), *args], env=env, timeout=60,
                   check=True, capture_output=True, cwd=Path(__file__).parents[2])  # fmt: skip
    doc: dict[str, object] = json.loads(out.read_text())
    return doc


def test_a_plain_watch_imports_only_what_a_round_needs(tmp_path: Path) -> None:
    doc = watch_modules(tmp_path)
    modules = doc["modules"]
    assert isinstance(modules, list)
    assert doc["code"] == 128 + signal.SIGTERM  # stopped in order by SIGTERM: it says so
    assert set(RAN) <= set(modules)
    held = [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_AT_START)]
    assert held == []
