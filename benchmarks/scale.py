"""The guard at the seed's scale, beside nginx and HAProxy: 256, 1,536 and 4,096 streams at 25
and 50 events/s each, the seed's arrival (1,536 clients connecting within 2 s), time from
freeze to answer with 1,536 streams open, the guard's judging round and its own /metrics.

    .venv/bin/python -m benchmarks.scale --steps 64x25,256x25,freeze:64:1 --out /tmp/scale
    bash benchmarks/scale_device.sh      # the device run (one call; docs/performance.md)

``--steps``, in order: ``NxR`` N streams at R events/s each; ``NxR/S`` the same, the clients
connecting over S seconds (an arrival); ``direct:NxR`` the upstream alone (its capacity);
``freeze:N:K`` K freezes of the upstream under N streams through the guard. A step that would
end past ``--budget`` is skipped (and said so), so a bounded run always ends with its tables.

The engine is benchmarks/upstream.c (vLLM's bytes, several processes: not the bottleneck, its
CPU in every row), the clients benchmarks/streams.py (raw protocols over processes, their CPU
in every row). Per load, fresh proxies, then one phase straight to the upstream and one through
each proxy, each with a fresh set of streams: they connect, settle, and are measured for
``--seconds``. The guard is ``engine-watchdog guard`` with ``--action answer``, run through
benchmarks/guard_rounds.py (its judging rounds timed). Tables are rewritten under ``--out``
after every phase (scale.md, scale.json): a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import proxy_peers, scale_report, streams, upstream
from benchmarks.scale_rig import (
    ANSWER_BOUND_S,
    PEERS,
    ROLES,
    WARM_S,
    Proxy,
    Rig,
    Step,
    guard_mode,
    pinned,
    proxy,
    setup,
)

RECOVER_BOUND_S = 60.0
PHASES = random.Random(37)
"""Seeded: the same freeze phases and stream lengths on every run."""


async def run_phase(rig: Rig, path: str, n: int, rate: float, spread: float) -> scale_report.Phase:
    """One set of ``n`` fresh streams, straight (``direct``) or through a proxy, measured."""
    seconds = rig.args.seconds
    target = rig.up.port if path == "direct" else rig.proxies[path].port
    tree = rig.proxies[path].tree if path != "direct" else None
    idle_rss = tree.memory_info().rss / 2**20 if tree else 0.0
    loop = asyncio.get_running_loop()
    t0 = time.time() + 0.1
    begin = t0 + spread + 1.5 + n / 1500  # every stream open and settled
    window = [begin, begin + seconds]
    jobs = jobs_for(rig, n, target, window, t0, spread_s=spread)
    futures = [loop.run_in_executor(rig.pool, streams.worker, job) for job in jobs]
    scrapes = asyncio.create_task(scrape_guard(rig, path, n, window))
    await asyncio.sleep(max(0.0, window[0] - time.time()))
    cpu0, up0 = tree.cpu_times() if tree else None, rig.up.tree.cpu_times()
    await asyncio.sleep(seconds)
    cpu1, up1 = tree.cpu_times() if tree else None, rig.up.tree.cpu_times()
    rss = tree.memory_info().rss / 2**20 if tree else 0.0
    seen = streams.merge(list(await asyncio.gather(*futures)))
    phase = scale_report.Phase(path, n, rate, spread, seconds, seen, idle_rss, rss)
    phase.window = (window[0], window[1])
    phase.upstream_cpu_s = up1.user + up1.system - up0.user - up0.system
    if cpu0 is not None and cpu1 is not None:
        phase.proxy_user_s, phase.proxy_sys_s = cpu1.user - cpu0.user, cpu1.system - cpu0.system
    phase.scrapes_ms = await scrapes
    await asyncio.sleep(0.5 + n / 4000)  # the connections closed before the next phase
    return phase


async def scrape_guard(rig: Rig, path: str, n: int, window: list[float]) -> list[float]:
    """The guard's own /metrics, three times in the window, at ``--judge-streams`` streams."""
    if path != "guard" or n != rig.args.judge_streams:
        return []
    out = []
    for k in range(3):
        await asyncio.sleep(
            max(0.0, window[0] + (k + 0.5) * (window[1] - window[0]) / 3 - time.time())
        )
        t0 = time.perf_counter()
        await get(rig.proxies["guard"].admin, "/metrics")
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def get(base: str, path: str, timeout: float = 10.0) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(-1), timeout)
    finally:
        writer.close()


async def freezes(rig: Rig, n: int, count: int) -> None:
    """``count`` freezes of the upstream under ``n`` streams through the guard: per stream,
    the time from its last token to its answer (the guard's error event)."""
    guard = rig.proxies["guard"]
    await rig.up.config(25.0)
    loop = asyncio.get_running_loop()
    for _ in range(count):
        t0 = time.time() + 0.1
        freeze_at = t0 + 1.5 + n / 1500 + WARM_S + PHASES.uniform(0.0, 1.0)
        window = [freeze_at, freeze_at + ANSWER_BOUND_S]
        jobs = jobs_for(rig, n, guard.port, window, t0, stream_tokens=10**6, freeze_at=freeze_at)
        futures = [loop.run_in_executor(rig.pool, streams.worker, job) for job in jobs]
        await asyncio.sleep(max(0.0, freeze_at - time.time()))
        await rig.up.freeze()
        frozen_t = time.time()
        seen = streams.merge(list(await asyncio.gather(*futures)))
        await rig.up.thaw()
        thawed_t = time.time()
        back_s = await open_again(guard, RECOVER_BOUND_S)
        rig.report.add_freeze(n, frozen_t, thawed_t, back_s, seen)
        print(rig.report.freeze_line(-1), flush=True)
        rig.report.write(rig.args.out)
        if back_s == math.inf:
            return  # a guard that stays shut: the next freeze would measure nothing


async def open_again(guard: Proxy, bound: float) -> float:
    """Seconds until a short request through the guard completes after the thaw (inf: not
    within ``bound``)."""
    t0 = time.monotonic()
    request = streams.request_bytes(guard.port, upstream.MODEL, 2, chat=False)
    while time.monotonic() - t0 < bound:
        with contextlib.suppress(OSError, TimeoutError):
            status, body = await streams.fetch(guard.port, request)
            if status == 200 and b"[DONE]" in body and b'"error"' not in body:
                return time.monotonic() - t0
        await asyncio.sleep(0.5)
    return math.inf


def jobs_for(
    rig: Rig, n: int, port: int, window: list[float], t0: float, **extra: Any
) -> list[dict[str, Any]]:
    """Each client process's share of ``n`` streams, all in one window."""
    a = rig.args
    shares = [n // a.client_procs + (i < n % a.client_procs) for i in range(a.client_procs)]
    base = {"port": port, "model": upstream.MODEL, "window": window, "t0": t0, "spread_s": 0.0,
            "stream_tokens": a.stream_tokens, "cpus": pinned(a.pin, "clients")}  # fmt: skip
    return [base | {"streams": k, "seed": PHASES.randrange(10**9)} | extra for k in shares if k]


async def one_step(rig: Rig, step: Step) -> None:
    """Fresh proxies (their RSS grows from idle, not from the last step's high-water mark),
    then the step."""
    names = {"freeze": ["guard"], "direct": []}.get(step.kind, rig.names)
    async with contextlib.AsyncExitStack() as stack:
        for name in names:
            rig.proxies[name] = await stack.enter_async_context(proxy(rig, name))
        await asyncio.sleep(2.0 if names else 0.0)  # the guard's first probe rounds
        if step.kind == "freeze":
            await freezes(rig, step.streams, step.count)
            return
        await rig.up.config(step.rate)
        for path in ("direct", *names):
            phase = await run_phase(rig, path, step.streams, step.rate, step.spread)
            rig.report.add(phase)
            print(rig.report.line(phase), flush=True)
            rig.report.write(rig.args.out)


async def steps(rig: Rig, deadline: float) -> None:
    for step, text in zip(rig.args.plan, rig.args.steps.split(","), strict=True):
        if time.monotonic() + step.seconds(rig) > deadline:
            rig.report.skipped.append(text)
            print(f"skipped {text}: it would end past --budget", flush=True)
            continue
        if step.kind == "freeze" and "guard" not in rig.names:
            continue
        started = time.monotonic()
        try:
            await one_step(rig, step)
        except Exception as exc:  # one step's failure (a proxy that did not start): the rest runs
            rig.report.failed.append(f"{text}: {type(exc).__name__}: {exc}")
            print(f"failed {text}: {exc!r}", flush=True)
        finally:
            rig.proxies.clear()
        took = time.monotonic() - started
        print(f"step {text}: {took:.0f} s (estimated {step.seconds(rig):.0f})", flush=True)
        rig.report.rounds = scale_report.read_rounds(rig.args.out / "guard-rounds.txt")
        rig.report.write(rig.args.out)


async def main_async(args: argparse.Namespace) -> int:
    streams.raise_open_files_limit()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in ("guard-rounds.txt", "proxies.log"):
        (args.out / old).unlink(missing_ok=True)
    names = [p for p in args.proxies.split(",") if p]
    if peers := tuple(p for p in names if p in PEERS):
        try:
            await asyncio.to_thread(proxy_peers.ensure_installed, peers)
        except proxy_peers.Missing as exc:
            raise SystemExit(f"--proxies: {exc}") from None
    deadline = time.monotonic() + args.budget
    report = scale_report.Report(setup=setup(args, names))
    context = multiprocessing.get_context("spawn")  # no fork of a running event loop
    with ProcessPoolExecutor(args.client_procs, mp_context=context) as pool:
        loop = asyncio.get_running_loop()
        started = [loop.run_in_executor(pool, streams.ready) for _ in range(args.client_procs)]
        await asyncio.gather(*started)
        cpus = dict(zip(ROLES, args.pin.split(":"), strict=False)).get("upstream") or None
        async with upstream.running(args.upstream_procs, 25.0, 0, cpus) as up:
            rig = Rig(args, up, pool, names, report)
            try:
                await steps(rig, deadline)
            finally:
                report.setup["the guard's data path"] = guard_mode(args.out)
                report.write(args.out)
    print(report.extras(), flush=True)
    return 0


DEVICE_STEPS = (
    "1536x25,4096x25,1536x25/2,freeze:1536:3,freeze:4096:1,1536x50,4096x50,256x25,256x50,"
    "direct:4096x100"
)
"""The device run (scale_device.sh): what the goals are about first, so that a run cut short
keeps it."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", default=DEVICE_STEPS, help="NxR, NxR/S, direct:NxR, freeze:N:K")
    parser.add_argument("--proxies", default="guard,nginx,haproxy")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per phase")
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--upstream-procs", type=int, default=2)
    parser.add_argument(
        "--peer-workers", type=int, default=1, help="nginx workers, HAProxy threads"
    )
    parser.add_argument("--stream-tokens", type=int, default=500, help="mean tokens per stream")
    parser.add_argument("--judge-streams", type=int, default=4096, help="scrape the guard here")
    parser.add_argument("--pin", default="", help="UPSTREAM:CLIENTS:PROXY taskset CPU lists")
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds: skip what would not end"
    )
    parser.add_argument("--out", type=Path, default=Path("scale-out"))
    args = parser.parse_args(argv)
    try:
        args.plan = [Step.parse(text) for text in args.steps.split(",")]
    except ValueError:
        parser.error(
            f"--steps {args.steps}: give NxR, NxR/S, direct:NxR or freeze:N:K, commas between"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
