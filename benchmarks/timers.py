"""Stalls against fixed timers: one mixed workload through the guard and through nginx with
``proxy_read_timeout`` 60 s (nginx's default) and 300 s (Envoy's ``stream_idle_timeout``
default), side by side in real time.

    .venv/bin/python -m benchmarks.timers                          # full length, ~6 minutes
    .venv/bin/python -m benchmarks.timers --scale 0.2 --paths guard,nginx-60
    .venv/bin/python -m benchmarks.timers --freezes 20             # time from freeze to answer

The workload, on simulators (engine_watchdog/sim):

- frozen: streams whose engine freezes mid-response (fault freeze-last: the engine loop blocks);
  then new requests sent while it is frozen;
- prefill: a healthy request silent for 90 s before its first token (fault long-prefill);
- slow: a healthy stream with a token every 8 s (fault slow: the engine busy on long steps);
- keepalive: a stream whose tokens stopped (fault stuck-request) behind a gateway that writes
  ``: keepalive`` comments into it every 15 s of silence (benchmarks/gateway.py), beside two
  healthy streams of the same engine.

A byte timer cannot tell the frozen stream from the prefill (both silent), nor the keepalive
stream from a moving one (both get bytes). ``--scale`` multiplies every duration: the timers,
the prefill, the slow stream's gap, the keepalive period, the simulators' pace and every
time-based setting of the watchdog (benchmarks/timers_rig.py ``GUARD_SECONDS``), so a short run
keeps the proportions of the full one. Prints a table; ``--json`` writes every stream's record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import proxy_peers, timers_rig
from benchmarks.timers_rig import MODEL, PREFILL_S, TOKENS_PER_S
from tests.tools.guard import post_json

PATHS = ("guard", "nginx-60", "nginx-300")
FROZEN, MOVERS, NEW = 2, 2, 2
"""Streams per path: frozen, healthy beside the keepalive one, new requests during the stall."""
FREEZE_AT_S = 15.0
NEW_AFTER_S = 15.0
"""New requests go out this long after the freeze (the guard has judged it by then)."""
MOVER_S = 60.0
SLOW_TOKENS = 10
PREFILL_TOKENS = 20
HEALTHY = ("prefill", "slow", "mover")


@dataclass
class Seen:
    """One request as its client saw it (times: time.time())."""

    path: str
    case: str
    request_id: str
    start: float
    status: int = 0
    tokens: list[float] = field(default_factory=list)
    keepalives: int = 0
    outcome: str = "open"
    """done ([DONE], no error), error-event, closed (cut without [DONE]), status-N, open."""
    end: float | None = None


def body(max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": "The engine served every request until",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


async def client(session: aiohttp.ClientSession, url: str, seen: Seen, max_tokens: int) -> None:
    headers = {"X-Request-Id": seen.request_id}
    try:
        async with session.post(
            url + "/v1/completions", json=body(max_tokens), headers=headers
        ) as r:
            seen.status = r.status
            if r.status != 200:
                await r.read()
                seen.outcome = f"status-{r.status}"
            else:
                async for line in r.content:
                    read(seen, line)
                if seen.outcome == "open":
                    seen.outcome = "closed"
    except (aiohttp.ClientError, ConnectionError):
        if seen.outcome == "open":
            seen.outcome = "closed"
    seen.end = time.time()


def read(seen: Seen, line: bytes) -> None:
    if line.startswith(b": keepalive"):
        seen.keepalives += 1
    elif line.startswith(b'data: {"error"'):
        seen.outcome = "error-event"
    elif line.startswith(b"data: [DONE]"):
        seen.outcome = "done" if seen.outcome == "open" else seen.outcome
    elif line.startswith(b"data:") and b'"choices"' in line:
        seen.tokens.append(time.time())


def end_after_freeze(paths: Sequence[str]) -> float:
    """How long after t0 the run watches (scale 1): past the longest timer's answer to the new
    requests, and past the healthy streams' ends."""
    timers = [float(p.removeprefix("nginx-")) for p in paths if p.startswith("nginx-")]
    longest = max(timers, default=timers_rig.GUARD_SECONDS["--request-stall-seconds"])
    healthy_end = PREFILL_S + PREFILL_TOKENS / TOKENS_PER_S + 8.0
    return max(healthy_end, FREEZE_AT_S + NEW_AFTER_S + longest + 10.0)


async def workload(built: timers_rig.Rig, paths: Sequence[str]) -> tuple[list[Seen], float]:
    """Every client of every path, the freeze, the new requests; (what they saw, freeze t)."""
    s, seen, tasks = built.scale, [], []
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        def launch(path: str, case: str, rid: str, url_case: str, max_tokens: int) -> None:
            item = Seen(path, case, rid, time.time())
            seen.append(item)
            url = built.urls[path][url_case]
            tasks.append(asyncio.create_task(client(session, url, item, max_tokens)))

        t0 = time.time()
        for p in paths:
            for i in range(FROZEN):
                launch(p, "frozen", f"frozen-{p}-{i}", "freeze", 100_000)
            launch(p, "prefill", f"prefill-{p}", "prefill", PREFILL_TOKENS)
            launch(p, "slow", f"slow-{p}", "slow", SLOW_TOKENS)
            launch(p, "keepalive", f"stuck-{p}", "keepalive", 100_000)
            for i in range(MOVERS):
                launch(p, "mover", f"mover-{p}-{i}", "keepalive", int(MOVER_S * TOKENS_PER_S))
        await asyncio.sleep(FREEZE_AT_S * s)
        freeze = {"fault": "freeze-last", "freeze_last_n": 10**6}
        freeze_t = time.time()
        await post_json(built.sims["freeze"].url + "/sim/fault", freeze)
        await asyncio.sleep(NEW_AFTER_S * s)
        for p in paths:
            for i in range(NEW):
                launch(p, "new", f"new-{p}-{i}", "freeze", 5)
        left = t0 + end_after_freeze(paths) * s - time.time()
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, left))
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return seen, freeze_t


def summary(seen: list[Seen], path: str) -> dict[str, Any]:
    mine = [x for x in seen if x.path == path]
    frozen = [x for x in mine if x.case == "frozen"]
    answered = [x.end - x.tokens[-1] for x in frozen if x.outcome != "open" and x.end and x.tokens]
    new = [x for x in mine if x.case == "new"]
    new_times = [x.end - x.start for x in new if x.outcome != "open" and x.end]
    return {
        "frozen": len(frozen),
        "frozen_answered": len(answered),
        "frozen_answer_s": sorted(answered),
        "frozen_outcomes": sorted({x.outcome for x in frozen}),
        "healthy": sum(1 for x in mine if x.case in HEALTHY),
        "healthy_cut": [x.request_id for x in mine if x.case in HEALTHY and x.outcome != "done"],
        "keepalive_only": sum(1 for x in mine if x.case == "keepalive"),
        "keepalive_never_caught": sum(
            1 for x in mine if x.case == "keepalive" and x.outcome == "open"
        ),
        "new": len(new),
        "new_answered": len(new_times),
        "new_answer_s": sorted(new_times),
        "new_outcomes": sorted({x.outcome for x in new}),
    }


def cells(path: str, row: dict[str, Any]) -> list[str]:
    times = row["frozen_answer_s"]
    frozen = f"{row['frozen_answered']}/{row['frozen']}"
    if times:
        frozen += f" in {min(times):.1f}-{max(times):.1f} s ({', '.join(row['frozen_outcomes'])})"
    new = f"{row['new_answered']}/{row['new']}"
    if row["new_answer_s"]:
        new += f" in {statistics.median(row['new_answer_s']):.1f} s"
        new += f" ({', '.join(row['new_outcomes'])})"
    cut = f"{len(row['healthy_cut'])}/{row['healthy']}"
    if row["healthy_cut"]:
        cut += f" ({', '.join(x.split('-')[0] for x in row['healthy_cut'])})"
    caught = f"{row['keepalive_never_caught']}/{row['keepalive_only']}"
    return [path, frozen, cut, caught, new]


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = [
        "path",
        "frozen streams answered (after their last token)",
        "healthy streams cut",
        "keepalive-only never caught",
        "new requests answered during the stall (median wait)",
    ]
    body_rows = [cells(p, r) for p, r in rows.items()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join([*lines, *("| " + " | ".join(b) + " |" for b in body_rows)])


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_1m": os.getloadavg()[0],
        "python": platform.python_version(),
    }


async def bench(paths: list[str], scale: float) -> dict[str, Any]:
    async with timers_rig.rig(paths, scale) as built:
        await timers_rig.arm_faults(built)
        load_before = os.getloadavg()[0]
        seen, freeze_t = await workload(built, paths)
        verdicts = {c: g.states() for c, g in built.guards.items()}
        keepalives = built.gateway.keepalives if built.gateway else 0
    rows = {p: summary(seen, p) for p in paths}
    return {
        "scale": scale,
        "machine": machine() | {"load_1m_before": load_before},
        "freeze_t": freeze_t,
        "summary": rows,
        "guard_verdicts": verdicts,
        "gateway_keepalives": keepalives,
        "streams": [asdict(x) for x in seen],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Stalls: the guard against fixed byte timers.")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every duration")
    parser.add_argument("--paths", default=",".join(PATHS), help="guard,nginx-60,nginx-300")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--freezes", type=int, default=0, help="time-to-answer mode: N freezes")
    args = parser.parse_args(argv)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.paths if p != "guard" and not _timer(p)]
    if bad or not 0.01 <= args.scale <= 10 or args.freezes < 0:
        parser.error(
            "--paths takes guard and nginx-<seconds>; --scale 0.01-10; --freezes >= 0"
            + (f" (got {', '.join(bad)})" if bad else "")
        )
    return args


def _timer(path: str) -> bool:
    rest = path.removeprefix("nginx-")
    return path.startswith("nginx-") and rest.replace(".", "", 1).isdigit() and float(rest) > 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except proxy_peers.Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.freezes:
        from benchmarks import freezes

        result = asyncio.run(freezes.bench(args.freezes, args.scale))
        print(freezes.report(result))
    else:
        result = asyncio.run(bench(args.paths, args.scale))
        print(f"scale {args.scale:g} (durations x{args.scale:g}); {result['machine']}")
        print(table(result["summary"]))
    return result


if __name__ == "__main__":
    raise SystemExit(main())
