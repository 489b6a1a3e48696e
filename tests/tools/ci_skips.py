"""In CI a skipped test fails the run, unless its reason names what no CI machine has: a GPU.

A skip is a test that did not run, and a skip that nobody reads hides a test that never runs
(the deploy tests once skipped on every machine but one, for a path that machine alone had).
So where ``CI`` is set (``.ci/run`` sets it), tests/conftest.py counts every skip whose reason
does not match :data:`ALLOWED`, prints one line per test and makes the exit status 1. A test
that needs a GPU says so in its reason: ``pytest.skip("needs a GPU: ...")``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import pytest

ALLOWED = re.compile(r"\bneeds (?:a|an|one|two|three|four|eight|\d+) (?:NVIDIA )?GPUs?\b", re.I)
"""What no CI machine has (its machines have no accelerator): a GPU, two GPUs, N GPUs."""
SKIPPED_PREFIX = "Skipped: "


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """``CI`` set to anything but empty, 0 or false (GitHub Actions and most CI set CI=true)."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def reason_of(longrepr: object) -> str:
    """The reason of a skip report (pytest keeps it as (path, line, "Skipped: reason"))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    text = str(text)
    return text[len(SKIPPED_PREFIX) :] if text.startswith(SKIPPED_PREFIX) else text


def allowed_in_ci(reason: str) -> bool:
    return ALLOWED.search(reason) is not None


def offence(nodeid: str, reason: str) -> str:
    return f"CI: {nodeid} skipped ({reason}): in CI only a missing GPU may skip a test"


class CiSkips:
    """The pytest plugin: registered by tests/conftest.py in CI, in the process that reports
    (xdist's controller, which receives every worker's reports, or a plain run)."""

    def __init__(self) -> None:
        self.offences: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self._note(report.nodeid, reason_of(report.longrepr))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module skipped whole (importorskip, allow_module_level)
            self._note(report.nodeid, reason_of(report.longrepr))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.offences and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.offences:
            terminalreporter.section("skips in CI", sep="=", red=True, bold=True)
            for line in self.offences:
                terminalreporter.line(line)

    def _note(self, nodeid: str, reason: str) -> None:
        if not allowed_in_ci(reason):
            self.offences.append(offence(nodeid, reason))
