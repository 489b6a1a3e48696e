"""Time from freeze to answer (benchmarks/timers.py ``--freezes N``): one engine under the guard
frozen N times, each time mid-response under a few streams; for each freeze, the time from the
last token its clients got to the last of them being answered (the error event). Meanwhile,
beside it, a long prefill (90 s silent before its first token, re-armed after each) and a slow
stream (a token every 8 s, one after the other) run through guards of their own: any stalled
verdict of theirs, or any of their streams cut, is a false stall.

Each freeze is the simulator's freeze-last (the engine loop blocks on an event, its process
idle, as a hung engine's is); ``{"fault": "none"}`` lifts it, and the next freeze waits until
the guard passes requests again (its stall verdict cleared by a canary) and the streams move.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import time
from typing import Any

import aiohttp

from benchmarks import timers_rig
from benchmarks.timers import PREFILL_TOKENS, SLOW_TOKENS, Seen, client, machine
from tests.tools.guard import post_json

STREAMS = 3
"""Streams under way at each freeze."""
WARM_S = 5.0
"""Streams move this long before each freeze (scaled), plus up to one probe round drawn at
random: a hang comes at any phase of the watchdog's rounds, and so do these freezes."""
PHASES = random.Random(20)
"""Seeded: the same phases on every run."""
ANSWER_BOUND_S = 120.0
RECOVER_BOUND_S = 120.0
GOAL_S = 6.0


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def one_freeze(built: timers_rig.Rig, session: aiohttp.ClientSession, i: int) -> list[Seen]:
    """Streams, a freeze under them, their answers; then the freeze lifted and the guard open."""
    s, url = built.scale, built.urls["guard"]["freeze"]
    seen = [Seen("guard", "frozen", f"frozen-{i}-{k}", time.time()) for k in range(STREAMS)]
    tasks = [asyncio.create_task(client(session, url, x, 100_000)) for x in seen]
    round_s = timers_rig.GUARD_SECONDS["--interval"]
    await asyncio.sleep((WARM_S + PHASES.uniform(0.0, round_s)) * s)
    sim = built.sims["freeze"].url
    await post_json(sim + "/sim/fault", {"fault": "freeze-last", "freeze_last_n": 10**6})
    _, pending = await asyncio.wait(tasks, timeout=ANSWER_BOUND_S * s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await post_json(sim + "/sim/fault", {"fault": "none"})
    await open_again(session, url, RECOVER_BOUND_S * s)
    return seen


async def open_again(session: aiohttp.ClientSession, url: str, bound: float) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        probe = Seen("guard", "probe", "probe", time.time())
        await client(session, url, probe, 2)
        if probe.outcome == "done":
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the guard refused requests {bound:.0f} s after the freeze was lifted")


async def beside(
    built: timers_rig.Rig, session: aiohttp.ClientSession, case: str, out: list[Seen]
) -> None:
    """The healthy case's streams, one after the other, until cancelled."""
    url, sim = built.urls["guard"][case], built.upstream("guard", case)
    for k in range(10**6):
        if case == "prefill":
            await timers_rig.arm_prefill(built, sim)
        item = Seen("guard", case, f"{case}-{k}", time.time())
        out.append(item)
        await client(session, url, item, PREFILL_TOKENS if case == "prefill" else SLOW_TOKENS)


def delays(freezes: list[list[Seen]]) -> list[float]:
    """Per freeze: from the last token any of its clients got to the last client's answer."""
    out = []
    for seen in freezes:
        last_token = max(x.tokens[-1] for x in seen if x.tokens)
        ends = [x.end for x in seen if x.end is not None and x.outcome == "error-event"]
        out.append(max(ends) - last_token if len(ends) == len(seen) else math.inf)
    return out


async def bench(n: int, scale: float) -> dict[str, Any]:
    cases = ("freeze", "slow", "prefill")
    async with timers_rig.rig(["guard"], scale, cases) as built:
        await timers_rig.arm_faults(built)
        load_before = os.getloadavg()[0]
        healthy: list[Seen] = []
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            others = [asyncio.create_task(beside(built, session, c, healthy)) for c in cases[1:]]
            freezes = [await one_freeze(built, session, i) for i in range(n)]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        verdicts = {c: g.states() for c, g in built.guards.items()}
    return result(freezes, healthy, verdicts, scale) | {
        "machine": machine() | {"load_1m_before": load_before}
    }


def result(
    freezes: list[list[Seen]], healthy: list[Seen], verdicts: dict[str, list[str]], scale: float
) -> dict[str, Any]:
    d = delays(freezes)
    finished = [x for x in healthy if x.end is not None]  # the last of each kind was cancelled
    false_stalls = {c: sum(1 for v in verdicts[c] if v.startswith("stalled")) for c in verdicts}
    return {
        "scale": scale,
        "freezes": len(d),
        "delays_s": d,
        "p50_s": statistics.median(d),
        "p95_s": nearest_rank(d, 0.95),
        "max_s": max(d),
        "goal_s": GOAL_S * scale,
        "false_stalls": {c: false_stalls[c] for c in ("prefill", "slow")},
        "healthy_finished": {
            c: sum(1 for x in finished if x.case == c) for c in ("prefill", "slow")
        },
        "healthy_cut": [x.request_id for x in finished if x.outcome != "done"],
        "freeze_verdicts": sorted(set(verdicts["freeze"])),
    }


def report(r: dict[str, Any]) -> str:
    ok = r["p95_s"] < r["goal_s"] and not r["healthy_cut"] and not any(r["false_stalls"].values())
    return "\n".join(
        [
            f"scale {r['scale']:g}; {r['machine']}",
            f"{r['freezes']} freezes: freeze to answer p50 {r['p50_s']:.2f} s, "
            f"p95 {r['p95_s']:.2f} s, max {r['max_s']:.2f} s (goal: p95 < {r['goal_s']:g} s)",
            f"beside them: long prefills {r['healthy_finished']['prefill']}, slow streams "
            f"{r['healthy_finished']['slow']}; stalled verdicts {r['false_stalls']}, "
            f"streams cut {len(r['healthy_cut'])}",
            f"verdicts of the frozen engine: {', '.join(r['freeze_verdicts'])}",
            "goal met" if ok else "goal NOT met",
        ]
    )
