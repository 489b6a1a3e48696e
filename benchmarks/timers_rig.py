"""The engines and proxies of benchmarks/timers.py: simulators with their faults, the guard
(``engine-watchdog watch --guard-listen``, one per engine, as users run it) and nginx-light
with a fixed ``proxy_read_timeout`` (benchmarks/proxy_peers.py), all on loopback.

One simulator per case is shared by every path (the same freeze reaches every path's clients
at the same moment), except the long prefill: the simulator stretches only the next prompt it
admits, so each path has a prefill engine of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from benchmarks import gateway, proxy_peers
from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.guard import GuardProcess, post_json, start_guard, stop_guard, wait_listening

MODEL = "m"
CASES = ("freeze", "slow", "keepalive", "prefill")
GUARD_SECONDS = {
    "--interval": 1.0,
    "--scrape-timeout": 10.0,
    "--canary-timeout": 8.0,
    "--stall-seconds": 30.0,
    "--suspect-seconds": 5.0,
    "--fast-stall-seconds": 10.0,
    "--startup-grace": 10.0,
    "--canary-after": 5.0,
    "--idle-canary-interval": 60.0,
    "--stalled-canary-interval": 3.0,
    "--wire-stall-seconds": 5.0,
    "--request-stall-seconds": 20.0,
}
"""Every time-based setting of the watchdog at its default: --scale multiplies them all, so a
shortened run compares the guard and the timers at the same proportions."""
TOKENS_PER_S = 5.0
"""The healthy pace of the simulators (at scale 1; divided by the scale)."""
SLOW_GAP_S = 8.0
PREFILL_S = 90.0
ROOMY = ("--max-num-seqs", "4096", "--kv-capacity-tokens", "1000000000")
"""No request waits for room: every silence in the workload is the case's own."""
KEEPALIVE_S = 15.0
"""How often the gateway comments into a silent stream (well under any read timeout)."""


def guard_args(scale: float) -> list[str]:
    args = ["--action", "answer"]  # the first rung only: no bundle captured in a benchmark
    for option, seconds in GUARD_SECONDS.items():
        args += [option, f"{seconds * scale:g}"]
    return args


@dataclass
class Rig:
    """Where each path's clients go for each case: ``urls[path][case]``."""

    scale: float
    sims: dict[str, SimProcess] = field(default_factory=dict)
    urls: dict[str, dict[str, str]] = field(default_factory=dict)
    guards: dict[str, GuardProcess] = field(default_factory=dict)
    gateway: gateway.Gateway | None = None

    def upstream(self, path: str, case: str) -> SimProcess:
        return self.sims[f"prefill-{path}" if case == "prefill" else case]


async def start_sims(
    rig: Rig, stack: contextlib.AsyncExitStack, paths: list[str], cases: tuple[str, ...]
) -> None:
    rate = f"{TOKENS_PER_S / rig.scale:g}"
    names = [c for c in cases if c != "prefill"]
    names += [f"prefill-{p}" for p in paths if "prefill" in cases]
    args = ("--served-model-name", MODEL, "--tokens-per-second", rate, *ROOMY)
    sims = {n: SimProcess(*args) for n in names}
    results = await asyncio.gather(*(s.start() for s in sims.values()), return_exceptions=True)
    for sim in sims.values():
        stack.push_async_callback(sim.stop)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    rig.sims = sims


async def arm_faults(rig: Rig) -> None:
    """The faults that shape each case before its clients start (the freeze comes later)."""
    s = rig.scale
    slow = {"fault": "slow", "slow_tokens_per_second": 1.0 / (SLOW_GAP_S * s)}
    await post_json(rig.sims["slow"].url + "/sim/fault", slow)
    if "keepalive" in rig.sims:
        stuck = {"fault": "stuck-request", "stuck_after_tokens": 2}
        await post_json(rig.sims["keepalive"].url + "/sim/fault", stuck)
    for name, sim in rig.sims.items():
        if name.startswith("prefill-"):
            await arm_prefill(rig, sim)


async def arm_prefill(rig: Rig, sim: SimProcess) -> None:
    """The next prompt this engine admits prefills for PREFILL_S (one-shot)."""
    prefill = {"fault": "long-prefill", "long_prefill_seconds": PREFILL_S * rig.scale}
    await post_json(sim.url + "/sim/fault", prefill)


@contextlib.asynccontextmanager
async def rig(paths: list[str], scale: float, cases: tuple[str, ...] = CASES) -> AsyncIterator[Rig]:
    """Every engine, the gateway and every path's proxies, started; all stopped on exit."""
    if any(p.startswith("nginx") for p in paths):
        await asyncio.to_thread(proxy_peers.ensure_installed, ("nginx",))
    built = Rig(scale)
    async with contextlib.AsyncExitStack() as stack:
        await start_sims(built, stack, paths, cases)
        keepalive_url = ""
        if "keepalive" in cases:
            keepalive_url, built.gateway = await stack.enter_async_context(
                gateway.serving(built.sims["keepalive"].url, KEEPALIVE_S * scale)
            )
        for path in paths:
            built.urls[path] = {}
            for case in cases:
                sim = built.upstream(path, case)
                upstream = keepalive_url if case == "keepalive" else sim.url
                proxy = guarded if path == "guard" else nginx
                built.urls[path][case] = await stack.enter_async_context(
                    proxy(built, path, case, sim, upstream)
                )
        yield built


@contextlib.asynccontextmanager
async def guarded(
    built: Rig, path: str, case: str, sim: SimProcess, upstream: str
) -> AsyncIterator[str]:
    """``engine-watchdog watch UPSTREAM --guard-listen ...``; behind the gateway the upstream's
    port is not the engine's, so its engine core is named (the simulator's API process is not
    titled as vLLM's is: the watchdog finds it by its port only)."""
    args = guard_args(built.scale)
    if upstream != sim.url:
        args += ["--pid", str(sim.engine_pids()[0])]
    guard = await start_guard("watch", upstream, *args)
    built.guards[case] = guard
    try:
        yield guard.guard_url
    finally:
        await stop_guard(guard)


@contextlib.asynccontextmanager
async def nginx(
    built: Rig, path: str, case: str, sim: SimProcess, upstream: str
) -> AsyncIterator[str]:
    """nginx-light in front of ``upstream`` with ``proxy_read_timeout`` from the path's name
    (nginx-60: 60 s at scale 1)."""
    seconds = float(path.removeprefix("nginx-")) * built.scale
    port = free_port()
    upstream_port = int(upstream.rsplit(":", 1)[1])
    argv = proxy_peers.argv("nginx", upstream_port, port, read_timeout=f"{seconds * 1000:.0f}ms")
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_listening(url, 20.0)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
