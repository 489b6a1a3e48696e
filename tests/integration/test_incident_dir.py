"""An incident dir that cannot be written is said at start (one line, exit 73), by ``doctor``
too, and a bundle it can no longer take goes to a temporary folder with a line saying where:
never lost in silence. An incident dir shared by incidents and targets: a report lists what
was tried in its own incident, and the incident has one name, in the log lines and on its
bundle. Through the console script. (An uncreatable path under /proc, for watch, guard, run
and capture: tests/data/bad_input/cases.json.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from engine_watchdog.sim.launcher import SimProcess
from tests.integration.test_bad_input import one_line_error
from tests.tools.cli import run_cli_sync
from tests.tools.guard import GuardProcess, Log, completion, start_guard, stop_guard, stream
from tests.waiting import eventually

NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


def _as_unprivileged() -> tuple[str, ...]:
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot run as an unprivileged user")
    return AS_NOBODY


def test_a_read_only_incident_dir_is_refused_at_start_as_an_unprivileged_user() -> None:
    """Mode 0555, the watchdog not its owner's root: it started without a word before."""
    prefix = _as_unprivileged()
    top = Path(tempfile.mkdtemp(prefix="incident-dir-"))  # pytest's own is its owner's alone
    try:
        _refused_read_only(top, prefix)
    finally:
        shutil.rmtree(top)


def _refused_read_only(top: Path, prefix: tuple[str, ...]) -> None:
    top.chmod(0o755)
    folder = top / "incidents"
    folder.mkdir(mode=0o555)
    args = ["watch", "http://127.0.0.1:9", "--listen", "", "--incident-dir", str(folder)]
    ran = run_cli_sync(*args, prefix=prefix, timeout=30)
    assert ran.code == 73, ran
    one_line_error(ran)
    assert f"--incident-dir {folder}: cannot create or write it (Permission denied)" in ran.err
    with pytest.raises(subprocess.TimeoutExpired):  # --action none writes nothing there:
        run_cli_sync(*args, "--action", "none", prefix=prefix, timeout=3)  # it watches on


def test_doctor_says_whether_the_incident_dir_can_be_written(tmp_path: Path) -> None:
    bad = run_cli_sync("doctor", "--json", "--incident-dir", "/proc/engine-watchdog/x")
    good_dir = tmp_path / "not" / "yet"
    good = run_cli_sync("doctor", "--json", "--incident-dir", str(good_dir))
    checks = {c["name"]: c for c in json.loads(bad.out)["checks"]}
    assert bad.code == 1, bad
    assert checks["incident dir"]["status"] == "missing", checks["incident dir"]
    assert "--incident-dir" in checks["incident dir"]["fix"]
    ok = {c["name"]: c for c in json.loads(good.out)["checks"]}["incident dir"]
    assert ok["status"] == "ok", ok
    assert not (tmp_path / "not").exists()  # the doctor leaves nothing behind


async def first_capture(folder: Path, before: Callable[[], object]) -> tuple[GuardProcess, str]:
    """``watch --guard-listen`` on an idle simulator; ``before()``; then its engine core
    stopped and a request sent (stalled (stopped) at once: docs/guard.md); the watchdog and its
    log up to the capture's line."""
    async with SimProcess("--served-model-name", "m") as sim:
        guard = await start_guard("watch", sim.url, "--incident-dir", str(folder), log=True)
        log = Log(guard)
        try:
            await guard.wait_state("idle", 30)
            before()
            core = sim.engine_pids()[0]
            os.kill(core, signal.SIGSTOP)
            try:
                async with aiohttp.ClientSession() as s:
                    await stream(s, guard.guard_url, completion("m", 2), timeout=30)
                text = await eventually(lambda: log.once("action capture"), 30, 0.2, "capture")
            finally:
                os.kill(core, signal.SIGCONT)
        finally:
            await stop_guard(guard)
    return guard, text


async def test_a_bundle_the_incident_dir_no_longer_takes_goes_elsewhere_and_says_where(
    tmp_path: Path,
) -> None:
    """The folder taken away after the start (a file in its place): the first stall's bundle
    is written in a temporary folder, and the log line names it. Before: "action capture:
    failed could not write the bundle", and the evidence was lost."""
    folder = tmp_path / "incidents"

    def replaced() -> None:
        shutil.rmtree(folder, ignore_errors=True)  # (made at start, or not yet)
        folder.write_text("not a folder\n")

    _, text = await first_capture(folder, replaced)
    went = [json.loads(line)["msg"] for line in text.splitlines() if "goes to" in line]
    assert went and went[0].startswith(f"cannot write bundles in {folder}"), text[-3000:]
    fallback = Path(went[0].split("goes to ")[1].split(" instead")[0])
    assert fallback.is_dir() and any(fallback.glob("2*/manifest.json")), went
    assert f"action capture: ok bundle {fallback}/" in text, text[-3000:]
    shutil.rmtree(fallback)


async def test_one_incident_one_name_and_its_report_lists_its_own_actions_only(
    tmp_path: Path,
) -> None:
    """Before: the incident was ``...-0-stopped`` in the log lines and ``...-vllm-stopped`` as
    a directory, and report.md's "What was already tried" held the last 50 records of the
    folder whatever their incident or target (one: "SIGKILL sent to engine core")."""
    folder = tmp_path / "incidents"
    folder.mkdir()
    foreign = {"t": 1796000000.0, "target": "http://127.0.0.1:1", "action": "restart"}
    foreign |= {"result": "ok", "detail": "SIGKILL sent to engine core [13725]"}
    (folder / "actions.jsonl").write_text(json.dumps(foreign) + "\n")
    guard, text = await first_capture(folder, lambda: None)
    (bundle,) = [p for p in folder.iterdir() if p.is_dir()]
    stalled = next(d for d in guard.lines if d["state"] == "stalled")
    named = {json.loads(line)["incident"] for line in text.splitlines() if '"incident":"' in line}
    assert named == {stalled["incident"]} == {bundle.name}, (named, stalled, bundle.name)
    ran = run_cli_sync("report", str(bundle), timeout=60)
    assert ran.code == 0, ran
    report = (bundle / "report.md").read_text()
    tried = report.split("What was already tried")[1].split("\n\n", 2)[1]
    assert "| answer | ok |" in tried and "| capture | ok |" in tried, tried
    assert "SIGKILL" not in report and "127.0.0.1:1 " not in report, tried
