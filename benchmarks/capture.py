"""Capture wall time: a non-destructive bundle of the simulator's processes, measured end to end.

Run: .venv/bin/python -m benchmarks.capture [--runs N] [--url URL]   (prints a markdown table).
With ``--url`` it measures captures of an engine already running there (a real vLLM) instead.

Scenarios: a healthy simulator, a deadlocked one (engine core blocked on a lock), two data-parallel
ranks (three processes), and a SIGSTOPped engine core (the --nonblocking path). Each run
discovers the processes from the URL (``sample_procs``) and writes a bundle with the py-spy step;
"discover" and "bundle" are the two wall times, "py-spy" the step's own time (every process dumped
in parallel). Real vLLM numbers come from the e2e fixture (the lead adds them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from engine_watchdog.capture.bundle import BundleSettings, write_bundle
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.sim.launcher import SimProcess

FIRE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]
    deadlock: bool = False
    stop_core: bool = False


SCENARIOS = (
    Scenario("healthy, idle", ()),
    Scenario("deadlocked engine core", ("--fault", "deadlock"), deadlock=True),
    Scenario("2 DP ranks (3 processes)", ("--data-parallel-size", "2")),
    Scenario("SIGSTOPped engine core", (), stop_core=True),
)


@dataclass
class Sample:
    procs: int
    discover_s: float
    pyspy_s: float
    bundle_s: float
    modes: str


async def _fire_deadlock(sim: SimProcess, http: aiohttp.ClientSession) -> asyncio.Task[None]:
    """Send a streaming request (the fault fires on the next step) and wait until it fired."""

    async def stream() -> None:
        body = {"prompt": "hi", "max_tokens": 50, "stream": True}
        async with http.post(sim.url + "/v1/completions", json=body) as resp:
            async for _ in resp.content:
                pass

    task = asyncio.create_task(stream())
    deadline = time.monotonic() + FIRE_TIMEOUT_S
    while time.monotonic() < deadline:
        async with http.get(sim.url + "/sim/fault") as resp:
            doc = await resp.json()
        if doc["engines"]["0"]["state"] == "fired":
            return task
        await asyncio.sleep(0.05)
    task.cancel()
    raise RuntimeError("the deadlock did not fire")


async def _one_capture(url: str, incident_dir: Path) -> Sample:
    t0 = time.monotonic()
    obs = await sample_procs_async(url)
    t1 = time.monotonic()
    res = await write_bundle(
        BundleSettings(CaptureSettings(incident_dir=incident_dir, keep_count=1000)),
        None,
        obs.procs,
        [],
        [pyspy_step()],
    )
    t2 = time.monotonic()
    step = res.steps[0]
    if step.status != "ok":
        raise RuntimeError(f"py-spy step {step.status}: {step.detail}")
    modes = sorted({m for m in ("native", "plain", "nonblocking") if f"{m} dump" in step.detail})
    return Sample(len(obs.procs), t1 - t0, step.elapsed_s, t2 - t1, "+".join(modes))


async def run_scenario(sc: Scenario, runs: int, incident_dir: Path) -> list[Sample]:
    samples: list[Sample] = []
    async with (
        SimProcess(*sc.args) as sim,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        task = await _fire_deadlock(sim, http) if sc.deadlock else None
        cores = sim.engine_pids()
        if sc.stop_core:
            os.kill(cores[0], signal.SIGSTOP)
        try:
            for _ in range(runs):
                samples.append(await _one_capture(sim.url, incident_dir))
        finally:
            if sc.stop_core:
                os.kill(cores[0], signal.SIGCONT)
            if task is not None:
                task.cancel()
    return samples


def _cell(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} / {max(values):.3f}"


def _row(name: str, s: Sequence[Sample]) -> str:
    return (
        f"| {name} | {s[0].procs} | {s[0].modes} | {_cell([x.discover_s for x in s])} | "
        f"{_cell([x.pyspy_s for x in s])} | {_cell([x.bundle_s for x in s])} |"
    )


async def main(runs: int, url: str | None) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"capture wall time, median / max of {runs} runs, seconds ({os.cpu_count()} CPUs, "
        f"load average {load} at start: other work on the host inflates the max)\n"
    )
    print("| scenario | processes | py-spy modes | discover | py-spy step | whole bundle |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="capture-bench-") as tmp:
        if url:
            samples = [await _one_capture(url, Path(tmp) / "url") for _ in range(runs)]
            print(_row(url, samples), flush=True)
            return
        for sc in SCENARIOS:
            s = await run_scenario(sc, runs, Path(tmp) / sc.name.replace(" ", "_"))
            print(_row(sc.name, s), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", help="measure the engine already serving here instead")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.url))
