"""``doctor --pid`` on another user's process. It said "internal error" (the
py-spy trial could not be started) and its ptrace line blamed Yama, whose setting does not
matter across UIDs. Now: one clear ptrace line, the trial skipped, and exit 77 (EX_NOPERM).

Run as root, the doctor itself runs as nobody (setpriv) against a process of root; run as
another user, against PID 1 when that is not ours."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from engine_watchdog.cli.exits import EXIT_NOPERM
from tests.tools.cli import run_cli_sync

NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


def _uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


@contextlib.contextmanager
def someone_elses_process() -> Iterator[tuple[int, tuple[str, ...]]]:
    """(a PID, the prefix that runs the doctor as a user other than that PID's owner)."""
    if os.geteuid() != 0:
        if _uid_of(1) == os.geteuid():
            pytest.skip("not root, and PID 1 is ours: no other user's process to point at")
        yield 1, ()
        return
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot run the doctor as another user")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc.pid, AS_NOBODY
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_doctor_on_another_users_process_says_so_and_exits_77() -> None:
    with someone_elses_process() as (pid, prefix):
        ran = run_cli_sync("doctor", "--pid", str(pid), prefix=prefix, timeout=60)
        as_json = run_cli_sync("doctor", "--json", "--pid", str(pid), prefix=prefix, timeout=60)
    out = ran.out + ran.err
    assert ran.code == EXIT_NOPERM, ran
    assert "internal error" not in out and "Traceback" not in out
    ptrace = [line for line in ran.out.splitlines() if "ptrace  " in line]
    assert len(ptrace) == 1, ran.out
    assert "cannot read another user's process" in ptrace[0]
    assert "run as that user or with CAP_SYS_PTRACE" in ptrace[0]
    assert "ptrace_scope=0" not in out  # Yama does not help across UIDs: never advised here
    assert (
        ran.out.strip()
        .splitlines()[-1]
        .startswith("capture NOT ready: cannot read another user's process")
    )
    assert as_json.code == EXIT_NOPERM, as_json
    checks = {c["name"]: c for c in json.loads(as_json.out)["checks"]}
    assert checks["ptrace"]["code"] == "other-user"
    if "py-spy trial" in checks:  # py-spy found: not tried on a process it may not read
        assert checks["py-spy trial"]["status"] == "skipped"
