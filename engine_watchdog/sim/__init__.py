"""A vLLM-compatible engine simulator with injectable faults (``engine-watchdog sim``).

Two kinds of process, as in vLLM: an API process (HTTP, metrics) and engine-core children
titled ``VLLM::EngineCore``. Public API: :class:`SimSettings`, :func:`run_sim`, and
``engine_watchdog.sim.cli.sim_command`` / ``engine_watchdog.sim.launcher.SimProcess``.
"""

from __future__ import annotations

from engine_watchdog.sim.settings import FAULT_NAMES, SimSettings

__all__ = ["FAULT_NAMES", "SimSettings", "run_sim"]


def run_sim(settings: SimSettings) -> int:
    """Run a simulated vLLM server in this process until SIGTERM/SIGINT or engine death.

    Blocking; returns the exit code (0 on a signal and on engine death, as vLLM; 1 if it
    could not start)."""
    # Imported here so the engine-core children, which import this package, skip aiohttp.
    from engine_watchdog.sim.api import run_sim as _run

    return _run(settings)
