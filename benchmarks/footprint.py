"""Footprint of `watch` at 1 s intervals against a loaded simulator: CPU and peak RSS.

Run: .venv/bin/python -m benchmarks.footprint [--seconds 600]
The simulator and its streaming load run beside it; only the watch process is measured. The
watch process's CPU is also shown relative to the simulator's API process, measured over the
same window (a ratio is what survives a noisy machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

import psutil

from engine_watchdog.sim.launcher import SimProcess
from engine_watchdog.sim.loadgen import StreamingLoad


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def measure(seconds: float) -> tuple[float, float, float, float]:
    async with SimProcess("--tokens-per-second", "30") as sim:
        cmd = [sys.executable, "-m", "engine_watchdog", "watch", sim.url, "--listen", ""]
        cmd += ["--action", "none"]
        watch = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            async with StreamingLoad(sim.url, clients=4, max_tokens=100, model="sim-model"):
                await asyncio.sleep(10)  # start-up is not the steady state
                p, api = psutil.Process(watch.pid), psutil.Process(sim.pid)
                c0, a0, t0 = cpu_s(p), cpu_s(api), time.monotonic()
                peak = 0.0
                while time.monotonic() - t0 < seconds:
                    peak = max(peak, p.memory_info().rss / 2**20)
                    await asyncio.sleep(1)
                wall = time.monotonic() - t0
                return (cpu_s(p) - c0) / wall, (cpu_s(api) - a0) / wall, peak, wall
        finally:
            os.killpg(watch.pid, signal.SIGTERM)
            await watch.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args()
    cpu, api, peak, wall = asyncio.run(measure(args.seconds))
    head = ("window s", "watch CPU %", "sim API CPU %", "ratio", "peak RSS MB")
    print(f"{head[0]:>9} {head[1]:>12} {head[2]:>14} {head[3]:>6} {head[4]:>12}")
    print(f"{wall:>9.0f} {cpu * 100:>12.2f} {api * 100:>14.2f} {cpu / api:>6.2f} {peak:>12.1f}")


if __name__ == "__main__":
    main()
