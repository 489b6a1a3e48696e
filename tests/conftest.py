"""Scheduling of the suite under pytest-xdist (``make test``: ``-n 3 --dist loadgroup``).

Every real-vLLM test (tests/e2e/) runs in ONE worker, one module after the other: two real
vLLMs at once would starve each other on 2 cores and break their timing bounds. The other two
workers run everything else beside them (three workers on 2 cores: the suite's processes mostly
wait, on windows and verdicts; the e2e chain, about half of the suite's time, is alone in its
worker); the image tests, too, stay in one worker (one build).

xdist's own ``xdist_group`` marker cannot do it here: xdist 3.8 adds the group to a test by
rewriting ``item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid`` comes from
``_id``), so the marker is silently ignored and e2e modules ran in both workers at once.
This scheduler is xdist's own LoadGroupScheduling with the group taken from the path instead
of the node id's ``@group`` suffix (tests/unit/test_scheduling.py keeps it true).

In CI (``CI`` set, as ``.ci/run`` does) a skipped test fails the run unless its reason names a
missing GPU (tests/tools/ci_skips.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tools.ci_skips import CiSkips, in_ci

SAME_WORKER = {
    "tests/e2e/": "e2e",  # real vLLMs: one at a time
    "tests/deploy/test_image_podman.py": "image",  # one image build for the module
    "tests/integration/test_multinode_gloo.py": "gloo",  # pods of one group: one at a time
    "tests/integration/test_multinode_sidecars.py": "gloo",  # the same addresses: after it
}
"""Node id prefix -> group: a group's tests all run in one worker, in collection order."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerForE2E(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return next((g for p, g in SAME_WORKER.items() if nodeid.startswith(p)), nodeid)

    return OneWorkerForE2E(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if in_ci() and not hasattr(config, "workerinput"):  # xdist's controller, or a plain run
        config.pluginmanager.register(CiSkips(), "ci-skips")


# -- the checkout's ./incidents ----------------------------------------------------------------

CHECKOUT_INCIDENTS = Path(__file__).resolve().parents[1] / "incidents"
"""Where a watchdog started from the checkout writes by default (--incident-dir): a user's
bundles and action history. The suite writes nothing there: a report of a real bundle listed
records the suite had written as what was tried."""
INCIDENT_DIR_VAR = "ENGINE_WATCHDOG_INCIDENT_DIR"
_BEFORE = pytest.StashKey[dict[str, tuple[int, int]] | None]()


def listing(folder: Path) -> dict[str, tuple[int, int]] | None:
    """Every file under ``folder`` with its size and mtime; None when there is no folder."""
    if not folder.is_dir():
        return None
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[_BEFORE] = listing(CHECKOUT_INCIDENTS)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails if the checkout's ./incidents changed (checked once, where the run ends:
    under xdist, in the controller, after every worker)."""
    if hasattr(session.config, "workerinput") or _BEFORE not in session.stash:
        return
    after = listing(CHECKOUT_INCIDENTS)
    if after == session.stash[_BEFORE]:
        return
    changed = sorted(set((after or {}).items()) ^ set((session.stash[_BEFORE] or {}).items()))
    names = sorted({name for name, _ in changed}) or ["(the folder itself)"]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "the checkout's ./incidents changed", red=True)
        reporter.write_line(
            f"the suite wrote into {CHECKOUT_INCIDENTS}: {', '.join(names)}; give the test's "
            f"watchdog an incident dir of its own ({INCIDENT_DIR_VAR} is set per test: a "
            "command started without the test's environment, or in a module fixture, escapes "
            "it)",
            red=True,
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _session_incident_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Watchdogs started by session or module fixtures: a folder of the run's own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(INCIDENT_DIR_VAR, str(tmp_path_factory.getbasetemp() / "incidents" / "shared"))
        yield


@pytest.fixture(autouse=True)
def _own_incident_dir(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every test's watchdogs write into a folder of the test's own (made when one writes):
    never the checkout's ./incidents, never another test's."""
    base = tmp_path_factory.getbasetemp()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.nodeid)[-150:]
    monkeypatch.setenv(INCIDENT_DIR_VAR, os.fspath(base / "incidents" / name))
