"""Alerts for real: simulator freezes -> watchdog says stalled -> alert in a real Alertmanager.

Two paths, each with real processes on free loopback ports, all killed at the end:
- through Prometheus: Prometheus scrapes the watchdog every second and evaluates the
  engine-watchdog group of deploy/prometheus/rules.yml (EngineStalled's `for` cut to 1 s), then
  sends to Alertmanager;
- direct: `engine-watchdog watch --alertmanager URL` pushes EngineStalled itself (API v2) and
  resolves it when the engine progresses again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine_watchdog.sim.launcher import SimProcess, free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.deploy.tools import PROMETHEUS_DIR, process, tool, wait_http
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(120)
WATCHDOG = str(Path(sys.executable).with_name("engine-watchdog"))
STALL_ARGS = ["--interval", "0.5", "--stall-seconds", "3", "--suspect-seconds", "1"]
AM_CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'


def _start_alertmanager(stack: ExitStack, tmp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    (tmp / "alertmanager.yml").write_text(AM_CONFIG)
    port = free_port()
    argv = [
        tool("alertmanager", "prometheus-alertmanager"),
        f"--config.file={tmp / 'alertmanager.yml'}",
        f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    proc = stack.enter_context(process(argv, tmp / "alertmanager.log"))
    return f"http://127.0.0.1:{port}", proc


def _test_rules(tmp: Path) -> Path:
    """rules.yml's watchdog group, as is, but EngineStalled waits 1 s instead of 1 min."""
    groups = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "engine-watchdog"]
    for rule in group["rules"]:
        if rule.get("alert") == "EngineStalled":
            rule["for"] = "1s"
    path = tmp / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def _start_prometheus(stack: ExitStack, tmp: Path, watchdog: str, am: str) -> str:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_test_rules(tmp))],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
        "scrape_configs": [
            {"job_name": "engine-watchdog", "static_configs": [{"targets": [watchdog]}]}
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        tool("prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = stack.enter_context(process(argv, tmp / "prometheus.log"))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/ready", proc, within_s=30)
    return url


def _start_watchdog(stack: ExitStack, tmp: Path, target: str, *extra: str) -> str:
    port = free_port()
    argv = [
        WATCHDOG, "watch", target, *STALL_ARGS, "--startup-grace", "1",
        "--listen", f"127.0.0.1:{port}", "--action", "none", "--no-gpu",
        "--incident-dir", str(tmp / "incidents"), *extra,
    ]  # fmt: skip
    proc = stack.enter_context(process(argv, tmp / "watchdog.log"))
    wait_http(f"http://127.0.0.1:{port}/metrics", proc, within_s=20)
    return f"127.0.0.1:{port}"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return json.load(resp)


def _stalled_alerts(am: str, **labels: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = _get(am + "/api/v2/alerts")
    return [
        a
        for a in found
        if a["labels"].get("alertname") == "EngineStalled"
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


async def _set_fault(sim: SimProcess, fault: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}/sim/fault", json={"fault": fault}, timeout=_t(10)) as resp,
    ):
        assert resp.status == 200, await resp.text()


def _t(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


@asynccontextmanager
async def _frozen(sim: SimProcess) -> Any:
    """One long streaming request, then the seed's freeze under it; unfrozen on exit."""
    async with StreamingLoad(sim.url, clients=1, max_tokens=5000, model="sim-model") as load:
        await eventually(lambda: load.chunks >= 5, timeout=20, what="tokens stream")
        await _set_fault(sim, "freeze-last")
        try:
            yield load
        finally:
            await _set_fault(sim, "none")


def _logs(tmp: Path) -> Iterator[str]:
    for log in sorted(tmp.glob("*.log")):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        yield f"--- {log.name} ---\n{tail}"


async def test_stall_alert_through_prometheus(tmp_path: Path) -> None:
    with ExitStack() as stack:
        am, _ = _start_alertmanager(stack, tmp_path)
        async with SimProcess("--tokens-per-second", "50") as sim:
            try:
                watchdog = _start_watchdog(stack, tmp_path, sim.url)
                prom = await asyncio.to_thread(
                    _start_prometheus, stack, tmp_path, watchdog, am.removeprefix("http://")
                )
                query = urllib.parse.urlencode({"query": 'up{job="engine-watchdog"} == 1'})
                up = f"{prom}/api/v1/query?{query}"
                await eventually(
                    lambda: asyncio.to_thread(lambda: _get(up)["data"]["result"]),
                    timeout=20,
                    what="Prometheus scrapes the watchdog",
                )
                labels = {"job": "engine-watchdog", "target": sim.url, "engine": "0"}
                async with _frozen(sim):
                    found = await eventually(
                        lambda: asyncio.to_thread(_stalled_alerts, am, **labels),
                        timeout=40,
                        what="EngineStalled from Prometheus in Alertmanager",
                    )
                    assert found[0]["labels"]["severity"] == "critical"
                    assert "runbook.md#enginestalled" in found[0]["annotations"]["runbook_url"]
                await eventually(
                    lambda: asyncio.to_thread(lambda: not _stalled_alerts(am, **labels)),
                    timeout=30,
                    what="EngineStalled resolved once the engine progresses",
                )
            except BaseException:
                print("\n".join(_logs(tmp_path)))
                raise


async def test_stall_alert_pushed_by_the_watchdog(tmp_path: Path) -> None:
    with ExitStack() as stack:
        am, _ = _start_alertmanager(stack, tmp_path)
        await asyncio.to_thread(wait_http, am + "/-/ready", None, 20)
        async with SimProcess("--tokens-per-second", "50") as sim:
            try:
                _start_watchdog(stack, tmp_path, sim.url, "--alertmanager", am)
                labels = {"target": sim.url, "engine": "0", "severity": "critical"}
                async with _frozen(sim):
                    found = await eventually(
                        lambda: asyncio.to_thread(_stalled_alerts, am, **labels),
                        timeout=30,
                        what="EngineStalled pushed by the watchdog",
                    )
                    assert found[0]["labels"]["cause"]
                    assert "job" not in found[0]["labels"]
                await eventually(
                    lambda: asyncio.to_thread(lambda: not _stalled_alerts(am, **labels)),
                    timeout=30,
                    what="the watchdog resolves EngineStalled",
                )
            except BaseException:
                print("\n".join(_logs(tmp_path)))
                raise
