"""Footprint of `watch` at 1 s intervals against a loaded simulator: CPU and peak RSS.

Run: .venv/bin/python -m benchmarks.footprint [--seconds 600] [--gpu] [--baseline DIR]
The simulator and its streaming load run beside it; only the watch process is measured. The
watch process's CPU is also shown relative to the simulator's API process, measured over the
same window (a ratio is what survives a noisy machine). ``--gpu``: the simulator computes on
the GPU (``sim --gpu``: a CUDA process NVML lists), so the watch's NVML, GPM and GPU process
probes have real work each round. ``--baseline DIR``: also a watch run from another checkout's
code (``PYTHONPATH=DIR``, e.g. a ``git worktree`` of the commit before), against the same load
in the same window: a before/after that shares one machine's noise.
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

WARMUP_S = 10.0
"""Start-up is not the steady state (with --gpu: the first GPM pair, NVML's own start)."""


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def start_watch(url: str, code_root: str | None) -> asyncio.subprocess.Process:
    cmd = [sys.executable, "-m", "engine_watchdog", "watch", url, "--listen", ""]
    env = dict(os.environ)
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join([code_root, env.get("PYTHONPATH", "")])
    return await asyncio.create_subprocess_exec(
        *cmd, "--action", "none", env=env, cwd=code_root,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


async def measure(seconds: float, gpu: bool, roots: list[str | None]) -> list[list[float]]:
    """Per watch: CPU share of a core, the sim API's share, peak RSS MB, window s."""
    sim_args = ["--tokens-per-second", "30", *(["--gpu"] * gpu)]
    async with SimProcess(*sim_args, startup_timeout=120 if gpu else 20) as sim:
        watches = [await start_watch(sim.url, root) for root in roots]
        try:
            async with StreamingLoad(sim.url, clients=4, max_tokens=100, model="sim-model"):
                await asyncio.sleep(WARMUP_S)
                procs, api = [psutil.Process(w.pid) for w in watches], psutil.Process(sim.pid)
                c0, a0, t0 = [cpu_s(p) for p in procs], cpu_s(api), time.monotonic()
                peak = [0.0] * len(procs)
                while time.monotonic() - t0 < seconds:
                    peak = [
                        max(m, p.memory_info().rss / 2**20)
                        for m, p in zip(peak, procs, strict=True)
                    ]
                    await asyncio.sleep(1)
                wall = time.monotonic() - t0
                api_share = (cpu_s(api) - a0) / wall
                return [
                    [(cpu_s(p) - c) / wall, api_share, m, wall]
                    for p, c, m in zip(procs, c0, peak, strict=True)
                ]
        finally:
            for w in watches:
                os.killpg(w.pid, signal.SIGTERM)
                await w.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--gpu", action="store_true", help="the simulator computes on the GPU")
    parser.add_argument("--baseline", help="also measure the watch of this checkout's code")
    args = parser.parse_args()
    roots: list[str | None] = [None, *([args.baseline] if args.baseline else [])]
    results = asyncio.run(measure(args.seconds, args.gpu, roots))
    head = ("watch", "window s", "watch CPU %", "sim API CPU %", "ratio", "peak RSS MB")
    print(f"{head[0]:>9} {head[1]:>9} {head[2]:>12} {head[3]:>14} {head[4]:>6} {head[5]:>12}")
    for name, (cpu, api, peak, wall) in zip(["this", "baseline"], results, strict=False):
        print(
            f"{name:>9} {wall:>9.0f} {cpu * 100:>12.2f} {api * 100:>14.2f} {cpu / api:>6.2f}"
            f" {peak:>12.1f}"
        )


if __name__ == "__main__":
    main()
