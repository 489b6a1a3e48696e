"""Live detection latency on a REAL vLLM (CPU): SIGSTOP of ``VLLM::EngineCore`` under streaming
load, time until ``engine-watchdog watch --json`` prints ``stalled``.

    .venv/bin/python -m benchmarks.live_detection [--runs 5] [--modes canary,no-canary]

One vLLM server (tests/tools/vllm_server.py; the venv and tiny model of tests/tools/vllm_env.py)
under 4 streaming clients for the whole measurement. Per mode, one ``watch`` process
(``--action none --listen '' --no-gpu``, plus the mode's flags); per run: wait until the
watcher says progressing and the load has streamed again, SIGSTOP the engine core, read the
watcher's JSON lines until ``stalled``, SIGCONT. The latency is the stalled verdict's own time
(``t``, the observation that decided it) minus the SIGSTOP time; the wall time until the line
was read is printed too. Modes: ``canary`` (the defaults), ``no-canary`` (``--no-canary``),
``metrics-only`` (``--no-canary`` and ``--pid`` of a process that does not exist: a sidecar
that cannot see the engine's processes). Every process started here is killed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.sim.loadgen import StreamingLoad

REPO = Path(__file__).resolve().parents[1]
MODES = {
    "canary": [],
    "no-canary": ["--no-canary"],
    "metrics-only": ["--no-canary", "--pid", "2147483646"],
}
STALL_WAIT_S = 120.0
RECOVER_WAIT_S = 90.0
SETTLE_S = 5.0
"""Progress observed after a recovery before the next SIGSTOP (an observation window)."""


@dataclass(frozen=True)
class Run:
    mode: str
    latency_s: float
    wall_s: float
    cause: str | None


class WatchProcess:
    """``engine-watchdog watch URL --json`` in its own process group; its verdict lines."""

    def __init__(self, url: str, flags: list[str]) -> None:
        self.argv = [sys.executable, "-m", "engine_watchdog", "watch", url, "--json"]
        self.argv += ["--action", "none", "--listen", "", "--no-gpu", *flags]
        self.proc: asyncio.subprocess.Process | None = None
        self.states: dict[str, str] = {}

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )

    async def next_verdict(self, timeout: float) -> dict[str, Any]:
        """The next transition the watcher prints (bounded)."""
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            if not line:
                raise RuntimeError(f"watch exited ({await self.proc.wait()})")
            with contextlib.suppress(ValueError):
                rec: dict[str, Any] = json.loads(line)
                self.states[rec["engine"]] = rec["state"]
                return rec

    async def until(self, state: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            rec = await self.next_verdict(max(0.1, deadline - time.monotonic()))
            if rec["state"] == state:
                return rec

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 10.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await asyncio.wait_for(self.proc.wait(), 10.0)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def one_run(mode: str, watch: WatchProcess, load: StreamingLoad, pids: list[int]) -> Run:
    if watch.states.get("0") != "progressing":
        await watch.until("progressing", RECOVER_WAIT_S)
    await load.wait_for(chunks=20, in_flight=1, timeout=RECOVER_WAIT_S)
    await asyncio.sleep(SETTLE_S)  # an observation window of healthy progress
    stopped_at, started = time.time(), time.monotonic()
    signal_all(pids, signal.SIGSTOP)
    try:
        rec = await watch.until("stalled", STALL_WAIT_S)
        wall = time.monotonic() - started
    finally:
        signal_all(pids, signal.SIGCONT)
    run = Run(mode, round(rec["t"] - stopped_at, 2), round(wall, 2), rec["cause"])
    print(f"  {mode}: stalled ({run.cause}) {run.latency_s:.1f} s after SIGSTOP", flush=True)
    return run


@contextlib.asynccontextmanager
async def vllm_server() -> AsyncIterator[Any]:
    sys.path.insert(0, str(REPO))
    from tests.tools.vllm_env import ensure_vllm_env
    from tests.tools.vllm_server import start_server, stop_server

    log = Path(tempfile.mkdtemp(prefix="live-detection-")) / "server.log"
    server = await asyncio.to_thread(start_server, ensure_vllm_env(), log)
    print(f"vLLM ready on {server.base_url} in {server.startup_s:.0f} s (log {log})", flush=True)
    try:
        yield server
    finally:
        await asyncio.to_thread(stop_server, server)


async def measure(modes: list[str], runs: int) -> list[Run]:
    results: list[Run] = []
    async with vllm_server() as server:
        load = StreamingLoad(server.base_url, clients=4, max_tokens=200, model="tiny")
        load.start()
        try:
            pids = server.engine_core_pids()
            for mode in modes:
                watch = WatchProcess(server.base_url, MODES[mode])
                await watch.start()
                try:
                    for _ in range(runs):
                        results.append(await one_run(mode, watch, load, pids))
                finally:
                    await watch.stop()
        finally:
            await load.stop(drain_s=0.0)
    return results


def report(results: list[Run], modes: list[str]) -> str:
    lines = ["| mode | runs | median | max | causes |", "|---|---|---|---|---|"]
    for mode in modes:
        got = [r for r in results if r.mode == mode]
        if not got:
            continue
        lat = [r.latency_s for r in got]
        causes = ", ".join(sorted({str(r.cause) for r in got}))
        median, worst = statistics.median(lat), max(lat)
        lines.append(f"| {mode} | {len(got)} | {median:.1f} s | {worst:.1f} s | {causes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="canary,no-canary", help=f"of {', '.join(MODES)}")
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    results = asyncio.run(measure(modes, args.runs))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2) + "\n")
    print(report(results, modes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
