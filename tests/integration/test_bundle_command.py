"""``--bundle-command``: each finished bundle goes to the operator's command (to copy it off the
node), bounded in time, its result in actions.jsonl, while the watchdog goes on watching."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil

from engine_watchdog.sim.api import VERSION
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import run_cli
from tests.tools.scenarios import frozen_under_load
from tests.waiting import eventually


def records(incidents: Path, action: str = "bundle-command") -> list[dict[str, Any]]:
    path = incidents / "actions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [d for d in map(json.loads, lines) if d["action"] == action]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def stall_with(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any, incidents: Path, *args: str
) -> list[dict[str, Any]]:
    """A stall under --action capture with ``args``; the bundle-command record it led to."""
    sim = await sim_factory("--tokens-per-second", "30")
    watch = await watch_factory(
        sim.url, "--stall-seconds", "8", "--action", "capture",
        "--incident-dir", str(incidents), *args,
    )  # fmt: skip
    async with frozen_under_load(sim, sim_http, watch):
        found: list[dict[str, Any]] = await eventually(
            lambda: records(incidents), 90, 0.2, what="its record"
        )
    assert watch.proc.returncode is None  # the command never ended or blocked the watchdog
    return found


async def test_each_bundle_is_handed_to_the_command_and_its_result_recorded(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any, tmp_path: Path
) -> None:
    incidents, copies = tmp_path / "incidents", tmp_path / "bucket"
    copies.mkdir()
    # cp -r -t DIR BUNDLE: the bundle's path comes last, as the command's argument.
    found = await stall_with(
        sim_factory, sim_http, watch_factory, incidents, "--bundle-command", f"cp -r -t {copies}"
    )
    (bundle,) = [p for p in incidents.glob("2*") if p.is_dir()]
    assert found[0]["result"] == "ok", found
    assert found[0]["detail"].startswith(f"{bundle.name}: exit 0 in "), found
    original, copy = tree(bundle), tree(copies / bundle.name)
    assert "manifest.json" in copy and copy == original  # the whole bundle, byte for byte
    assert f"Engine version: {VERSION}" in copy["summary.md"].decode()  # asked on every capture


async def test_a_command_that_hangs_is_killed_at_its_timeout_and_recorded(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any, tmp_path: Path
) -> None:
    incidents, pidfile = tmp_path / "incidents", tmp_path / "upload.pid"
    script = tmp_path / "upload.sh"
    script.write_text(f"#!/bin/sh\necho \"$ENGINE_WATCHDOG_BUNDLE\" > {pidfile}.bundle\n"
                      f"echo $$ > {pidfile}\nsleep 600 & wait\n")  # fmt: skip
    script.chmod(0o700)
    pid = 0
    try:
        found = await stall_with(
            sim_factory, sim_http, watch_factory, incidents,
            "--bundle-command", str(script), "--bundle-command-timeout", "2",
        )  # fmt: skip
        pid = int(pidfile.read_text())
        assert found[0]["result"] == "timeout", found
        assert "ran past 2 s; its process group was killed" in found[0]["detail"], found
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        (bundle,) = [p for p in incidents.glob("2*") if p.is_dir()]
        assert Path(f"{pidfile}.bundle").read_text().strip() == str(bundle)
    finally:
        if pid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


async def test_a_command_that_is_not_there_is_a_one_line_usage_error(tmp_path: Path) -> None:
    ran = await run_cli(
        "watch", "http://127.0.0.1:1", "--action", "capture", "--incident-dir", str(tmp_path),
        "--bundle-command", "no-such-uploader --bucket s3://x",
    )  # fmt: skip
    assert ran.code == 64, ran
    assert len(ran.err.strip().splitlines()) == 1 and "Traceback" not in ran.err, ran.err
    assert "--bundle-command 'no-such-uploader' is not an executable program" in ran.err
