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
