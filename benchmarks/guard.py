"""The guard's cost on the data path: streams through the guard against straight to the engine,
side by side in one run (phases alternate direct, guard, direct, guard at each load).

    .venv/bin/python -m benchmarks.guard [--streams 64,256,1024] [--rate 25] [--seconds 10]
    .venv/bin/python -m benchmarks.guard --streams 64,256,1024 --rate 25,25,5
    .venv/bin/python -m benchmarks.guard --url http://127.0.0.1:8000 --model tiny --streams 16,64
    .venv/bin/python -m benchmarks.guard --vllm --streams 16,64 --naive   # starts the CPU vLLM

Against the simulator (the default) every chunk carries the Unix time the simulator wrote it
(``sim --stamp-events``), so a client's latency per event is its arrival minus that; the
guard's added latency is the difference of the two phases' percentiles. A real engine stamps
nothing: there the latency column is the time to the first event instead. The guard is the
product itself (``engine-watchdog guard``, its detector included) in its own process; its CPU
per event is its CPU time over the events it passed, its RSS per 1,000 streams the growth of
its RSS with the streams open, from the idle guard (one data path: the aiohttp-streams path it
was measured against, 32.2 us/event vs 25.3 at 256 streams, is gone). ``--asyncio`` the guard
on asyncio's loop instead of uvloop (``--guard-loop asyncio``), ``--naive`` a 30-line aiohttp
pass-through, ``--floor`` the byte relays that do only what every proxy must (benchmarks/relays.py);
``--rate`` takes one rate, or one per load (a simulator of its own for each rate).
``--baseline DIR`` also the guard run from another checkout's code (``guard-baseline``: e.g. a
``git worktree`` of the commit before a change), in the same run: a before/after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
from yarl import URL

from benchmarks import clients, profile, proxy_peers, relays
from engine_watchdog.guard.proxy import raise_open_files_limit
from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.cli import CONSOLE_SCRIPT
from tests.tools.guard import wait_listening

WARMUP_S = 3.0
MAX_TOKENS = [100_000]
"""Tokens per request (a real engine's context bounds it: --max-tokens)."""


@dataclass
class Phase:
    """What the clients of one phase saw."""

    events: int = 0
    latencies: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    seconds: float = 0.0
    guard_cpu_s: float = 0.0
    guard_sys_s: float = 0.0
    """Of guard_cpu_s, the kernel's part."""
    guard_rss_mb: float = 0.0
    errors: int = 0
    client_cpu_s: float = 0.0
    client_cpu_pct: float = 0.0
    """The busiest client process's CPU share of one core in the window (it keeps up: < 100)."""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_stream(
    session: aiohttp.ClientSession, url: str, model: str, phase: Phase, window: list[float]
) -> None:
    """One stream at a time per client, again and again until the window ends."""
    while time.time() < window[1]:
        if not await one_request(session, url, model, phase, window):
            return


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, phase: Phase, window: list[float]
) -> bool:
    body = {"model": model, "prompt": "go", "max_tokens": MAX_TOKENS[0], "stream": True}
    body |= {"ignore_eos": True, "temperature": 0.0}
    start = time.time()
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                phase.errors += 1
                return False
            async for line in resp.content:
                now = time.time()
                if not line.startswith(b"data: {"):
                    continue
                if start:
                    phase.first.append(now - start)
                    start = 0.0
                if window[0] <= now <= window[1]:
                    phase.events += 1
                    at = line.rfind(b'"sim_t":')
                    if at > 0:
                        phase.latencies.append(now - float(line[at + 8 : line.rfind(b"}")]))
                elif now > window[1]:
                    return False
    except (aiohttp.ClientError, TimeoutError, ValueError):
        phase.errors += 1
        return False
    return True


async def run_phase(
    url: str, model: str, streams: int, seconds: float, guard: psutil.Process | None
) -> Phase:
    phase = Phase()
    begin = time.time() + WARMUP_S + streams / 100  # room to open every stream first
    window = [begin, begin + seconds]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [
            asyncio.create_task(one_stream(session, url, model, phase, window))
            for _ in range(streams)
        ]
        await asyncio.sleep(max(0.0, begin - time.time()))
        cpu0 = guard.cpu_times() if guard else None
        client0 = time.process_time()
        await asyncio.sleep(seconds)
        phase.client_cpu_pct = 100 * (time.process_time() - client0) / seconds
        if guard is not None and cpu0 is not None:
            cpu = guard.cpu_times()
            phase.guard_cpu_s = cpu.user + cpu.system - cpu0.user - cpu0.system
            phase.guard_sys_s = cpu.system - cpu0.system
            phase.guard_rss_mb = guard.memory_info().rss / 2**20
        await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    phase.seconds = seconds
    return phase


PROXIES = {
    "guard": (),
    "guard-asyncio": ("--guard-loop", "asyncio"),
}
"""The guard's options: as installed, on asyncio's loop; also measured: the
naive pass-through and the floor relays (benchmarks/relays.py)."""
BASELINE = [""]
"""--baseline: the checkout whose code ``guard-baseline`` runs."""


@contextlib.asynccontextmanager
async def guard_process(upstream: str, name: str) -> AsyncIterator[tuple[str, psutil.Process]]:
    """One of PROXIES (``naive``: the 30-line pass-through the guard is measured against)."""
    port = free_port()
    argv = [str(CONSOLE_SCRIPT), "guard", upstream, "--guard-listen", f"127.0.0.1:{port}"]
    argv += ["--listen", f"127.0.0.1:{free_port()}", "--no-gpu", "--action", "none"]
    argv += PROXIES.get(name, ())
    env, cwd = None, None
    if name == "guard-baseline":  # the same guard, another checkout's code
        argv[:1] = [sys.executable, "-m", "engine_watchdog"]
        env, cwd = {**os.environ, "PYTHONPATH": BASELINE[0]}, BASELINE[0]
    if name == "naive":
        argv = [sys.executable, "-m", "benchmarks.naive_proxy", upstream, str(port)]
    elif name in relays.NAMES:
        argv = relays.argv(name, URL(upstream).port or 80, port)
    elif name in proxy_peers.NAMES:
        argv = proxy_peers.argv(name, URL(upstream).port or 80, port)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True, env=env, cwd=cwd,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_listening(url, 30)
        tree = name in proxy_peers.NAMES  # nginx: master and worker, counted together
        yield url, proxy_peers.Tree(proc.pid) if tree else psutil.Process(proc.pid)  # type: ignore[misc]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


@dataclass
class Row:
    streams: int
    direct: list[Phase]
    guard: list[Phase]
    idle_rss_mb: float
    proxy: str = "guard"

    def cells(self, stamped: bool) -> list[str]:
        d_rate = statistics.mean(p.rate for p in self.direct)
        g_rate = statistics.mean(p.rate for p in self.guard)
        lat = "latencies" if stamped else "first"
        d = [x for p in self.direct for x in getattr(p, lat)]
        g = [x for p in self.guard for x in getattr(p, lat)]
        events = sum(p.events for p in self.guard)
        per_event = 1e6 / events if events else float("nan")
        cpu = sum(p.guard_cpu_s for p in self.guard) * per_event
        kernel = sum(p.guard_sys_s for p in self.guard) * per_event
        rss = max(p.guard_rss_mb for p in self.guard) - self.idle_rss_mb
        return [
            self.proxy,
            str(self.streams),
            f"{d_rate:.0f}",
            f"{g_rate:.0f}",
            f"{g_rate / d_rate:.3f}" if d_rate else "-",
            f"{(pct(g, 0.5) - pct(d, 0.5)) * 1e3:+.2f}",
            f"{(pct(g, 0.99) - pct(d, 0.99)) * 1e3:+.2f}",
            f"{pct(d, 0.5) * 1e3:.2f} / {pct(d, 0.99) * 1e3:.2f}",
            f"{cpu:.1f} ({cpu - kernel:.1f} + {kernel:.1f})",
            f"{rss / self.streams * 1000:.1f}",
            str(sum(p.errors for p in (*self.direct, *self.guard))),
            f"{max(p.client_cpu_pct for p in (*self.direct, *self.guard)):.0f}",
        ]


HEAD = [
    "proxy",
    "streams",
    "direct events/s",
    "proxied events/s",
    "ratio",
    "added p50 ms",
    "added p99 ms",
    "direct p50 / p99 ms",
    "proxy CPU µs/event (user + sys)",
    "proxy RSS MB per 1000 streams",
    "errors",
    "client CPU % (busiest process)",
]


async def bench(
    upstream: str, model: str, loads: Sequence[int], seconds: float, rounds: int, names: list[str]
) -> list[Row]:
    rows = []
    async with contextlib.AsyncExitStack() as stack:
        proxies = {n: await stack.enter_async_context(guard_process(upstream, n)) for n in names}
        for streams in loads:
            await asyncio.sleep(2)
            idle = {name: p.memory_info().rss / 2**20 for name, (_, p) in proxies.items()}
            direct: list[Phase] = []
            through: dict[str, list[Phase]] = {name: [] for name in proxies}
            for _ in range(rounds):
                for name, (url, proc) in proxies.items():
                    direct.append(await phase_of(upstream, model, streams, seconds, None))
                    through[name].append(await phase_of(url, model, streams, seconds, proc))
            for name in proxies:
                rows.append(Row(streams, direct, through[name], idle[name], name))
                print(" | ".join(rows[-1].cells(True)), flush=True)
            await profiled(proxies, model, streams, seconds)
    return rows


PROFILE_DIR: list[Path] = []
"""--profile: where the py-spy profiles go (benchmarks/profile.py); none when empty."""


async def profiled(
    proxies: dict[str, tuple[str, psutil.Process]], model: str, streams: int, seconds: float
) -> None:
    """One more phase through each Python proxy, sampled by py-spy (not a measured one)."""
    for name, (url, proc) in proxies.items() if PROFILE_DIR else ():
        if name in profile.PYTHON_PROXIES:
            out = PROFILE_DIR[0] / f"{name}-{streams}.txt"
            async with profile.recording(proc.pid, WARMUP_S + streams / 100, seconds, out):
                await phase_of(url, model, streams, seconds, None)
            print(profile.summary(out), flush=True)


async def phase_of(
    url: str, model: str, streams: int, seconds: float, proxy: psutil.Process | None
) -> Phase:
    """One phase: its clients in this process, or spread over CLIENT_PROCS (benchmarks/clients)."""
    if CLIENT_PROCS[0] > 1:
        procs, tokens = CLIENT_PROCS[0], MAX_TOKENS[0]
        return await clients.run_phase(url, model, streams, seconds, proxy, procs, tokens)
    return await run_phase(url, model, streams, seconds, proxy)


CLIENT_PROCS = [1]


def table(rows: list[Row], stamped: bool) -> str:
    head = list(HEAD)
    if not stamped:
        head[5:8] = ["added TTFE p50 ms", "added TTFE p99 ms", "direct TTFE p50 / p99 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join([*lines, *("| " + " | ".join(r.cells(stamped)) + " |" for r in rows)])


async def main_async(args: argparse.Namespace) -> None:
    raise_open_files_limit()  # 1,024 streams: more sockets than the usual soft limit
    loads = [int(n) for n in args.streams.split(",")]
    MAX_TOKENS[0] = args.max_tokens
    names = ["guard", *(["guard-asyncio"] * args.asyncio)]
    if args.baseline:
        BASELINE[0] = str(Path(args.baseline).resolve())  # noqa: ASYNC240 (at start only)
        names.append("guard-baseline")
    names += ["naive"] * args.naive
    names += list(relays.NAMES) if args.floor else []
    CLIENT_PROCS[0] = args.client_procs
    if args.profile:
        PROFILE_DIR[:] = [Path(args.profile)]
        PROFILE_DIR[0].mkdir(parents=True, exist_ok=True)
    if args.peers:
        try:
            await asyncio.to_thread(proxy_peers.ensure_installed)
        except proxy_peers.Missing as exc:
            raise SystemExit(f"--peers: {exc}") from None
        names += list(proxy_peers.NAMES)
    if args.vllm:
        await asyncio.to_thread(bench_vllm, args, loads, names)
        return
    if args.url:
        rows = await bench(args.url, args.model, loads, args.seconds, args.rounds, names)
        print(table(rows, stamped=False))
        return
    rates = [float(r) for r in args.rate.split(",")]
    rates = rates * len(loads) if len(rates) == 1 else rates
    if len(rates) != len(loads):
        raise SystemExit("--rate: one rate, or one per load of --streams")
    rows = []
    for rate in dict.fromkeys(rates):  # each rate its simulator, in the order given
        mine = [n for n, r in zip(loads, rates, strict=True) if r == rate]
        sim_args = ["--served-model-name", "bench", "--tokens-per-second", str(rate)]
        sim_args += ["--max-num-seqs", "4096", "--kv-capacity-tokens", "1000000000"]
        sim_args += ["--stamp-events", "--no-preemption"]  # (KV accounting: quadratic a step)
        async with SimProcess(*sim_args, startup_timeout=60) as sim:
            rows += await bench(sim.url, "bench", mine, args.seconds, args.rounds, names)
    print(table(rows, stamped=True))


def bench_vllm(args: argparse.Namespace, loads: list[int], names: list[str]) -> None:
    """The real vLLM of the e2e tests (CPU, tiny model), started and stopped here."""
    from tests.tools.vllm_env import ensure_vllm_env
    from tests.tools.vllm_server import start_server, stop_server

    MAX_TOKENS[0] = min(MAX_TOKENS[0], 1500)  # --max-model-len 2048
    server = start_server(ensure_vllm_env(), Path(tempfile.mkdtemp()) / "vllm.log")
    try:
        run = bench(server.base_url, "tiny", loads, args.seconds, args.rounds, names)
        print(table(asyncio.run(run), stamped=False))
    finally:
        stop_server(server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The guard's cost per event, side by side.")
    parser.add_argument("--streams", default="64,256,1024")
    parser.add_argument("--rate", default="25", help="events/s of each stream (sim), or per load")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--rounds", type=int, default=2, help="direct+guard pairs per load")
    parser.add_argument("--url", help="a real engine instead of the simulator")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--naive", action="store_true", help="also the naive pass-through")
    parser.add_argument("--asyncio", action="store_true", help="also the guard on asyncio's loop")
    parser.add_argument("--floor", action="store_true", help="also the byte relays (C, asyncio)")
    parser.add_argument("--peers", action="store_true", help="also nginx and HAProxy")
    parser.add_argument("--baseline", help="also the guard of this checkout's code")
    parser.add_argument("--client-procs", type=int, default=1, help="client processes")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS[0])
    parser.add_argument("--vllm", action="store_true", help="start the e2e tests' CPU vLLM")
    parser.add_argument("--profile", help="also a py-spy profile of each Python proxy, here")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
