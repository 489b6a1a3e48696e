"""deploy/ensure-tools.sh: idempotent, quiet, and leaves every tool the deploy tests use."""

from __future__ import annotations

import subprocess
import time

from tests.deploy.tools import DEPLOY, tool


def test_ensure_tools_is_a_quiet_noop_once_installed() -> None:
    proc = subprocess.run(
        ["bash", str(DEPLOY / "ensure-tools.sh")],
        capture_output=True,
        text=True,
        timeout=900,  # a first run installs from Debian's packages
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    second = time.monotonic()
    again = subprocess.run(
        ["bash", str(DEPLOY / "ensure-tools.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    assert time.monotonic() - second < 5, "a second run must not touch apt"
    for names in (
        ("promtool",),
        ("prometheus",),
        ("alertmanager", "prometheus-alertmanager"),
        ("podman",),
        ("runc",),
        ("debootstrap",),
    ):
        tool(*names)
