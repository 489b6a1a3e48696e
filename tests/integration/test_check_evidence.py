"""`check` exits 0 only on evidence, through the installed console script.

A wedged core stops publishing, so /metrics read ``num_requests_running 0`` and the engine looks
idle (vLLM #46811's incident). Before, `check` printed ``idle`` and exited 0 on such an engine,
with and without ``--timeout 3``. The simulator's core paused with SIGSTOP (its API process still
answering) is that engine.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from engine_watchdog.sim.launcher import SimProcess
from tests.integration.conftest import SimFactory
from tests.tools.cli import run_cli

STALL = "10"


@contextmanager
def core_paused(sim: SimProcess) -> Iterator[None]:
    """The engine core alone stopped; resumed whatever happens (the fixture then stops it)."""
    core = sim.engine_pids()[0]
    os.kill(core, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(core, signal.SIGCONT)


async def test_check_on_a_wedged_idle_core_says_stalled(sim_factory: SimFactory) -> None:
    sim = await sim_factory()
    with core_paused(sim):
        ran = await run_cli("check", sim.url, "--json", "--stall-seconds", STALL)
    doc = ran.json()
    assert ran.code == 1, ran.out + ran.err
    assert (doc["state"], doc["cause"]) == ("stalled", "wedged-idle"), doc
    # A canary's timeout (8 s) and a few rounds, within the default budget.
    assert ran.seconds < float(STALL) + 10 + 10


async def test_check_on_a_healthy_idle_engine_is_0_by_its_canary(sim_factory: SimFactory) -> None:
    sim = await sim_factory()
    ran = await run_cli("check", sim.url, "--json", "--stall-seconds", STALL)
    doc = ran.json()
    assert (ran.code, doc["evidence"]) == (0, "canary"), ran.out + ran.err
    assert ran.seconds < 15


async def test_check_without_a_canary_on_an_idle_engine_is_undecided(
    sim_factory: SimFactory,
) -> None:
    sim = await sim_factory()
    ran = await run_cli("check", sim.url, "--no-canary", "--timeout", "4", "--stall-seconds", STALL)
    assert ran.code == 3, ran.out + ran.err
    assert ran.out.startswith(f"{sim.url}: undecided: idle") and "--no-canary" in ran.out
    assert ran.out.count("\n") == 1 and "Traceback" not in ran.err


async def test_check_with_a_budget_too_short_says_how_long_it_needs(
    sim_factory: SimFactory,
) -> None:
    sim = await sim_factory()
    with core_paused(sim):  # the canary cannot answer: only a longer budget would tell
        ran = await run_cli("check", sim.url, "--timeout", "3", "--stall-seconds", STALL)
    assert ran.code == 3, ran.out + ran.err
    assert "undecided" in ran.out and "a verdict needs about 12 s (--timeout 12)" in ran.out
    assert ran.out.count("\n") == 1 and "Traceback" not in ran.err
