"""Record the corpus scenarios seen through the guard: the simulator under streaming
load whose clients connect to a guard in this process; the watcher probes the engine as
``record`` does, with the guard's observations as one more probe (``guard`` records).

    python tests/tools/record_guard_corpus.py [--list] [NAME ...]

The guard only observes here (no supervisor: nothing is answered or aborted), so a trace shows
what the detector and the request judge make of the wire. It reuses record_corpus.py's session,
expectations and replay check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine_watchdog.core.model import State  # noqa: E402
from engine_watchdog.core.serving import GuardSettings  # noqa: E402
from engine_watchdog.guard.proxy import Guard  # noqa: E402
from engine_watchdog.sim.launcher import SimProcess  # noqa: E402
from engine_watchdog.sim.loadgen import StreamingLoad  # noqa: E402
from tests.tools.guard import upstream  # noqa: E402
from tests.tools.record_corpus import (  # noqa: E402
    SIM_MODEL,
    TRACES,
    Expect,
    Scenario,
    Session,
    fault_fired,
    record_one,
)

WIRE = (0.0, 7.0)
"""A freeze under streaming load seen by the guard: stalled within 6 s of its last event (the
fault's mark is at most a round after it)."""


async def guarded(
    s: Session, *args: str, clients: int = 4, **load: Any
) -> tuple[SimProcess, str, StreamingLoad | None]:
    """A simulator with a guard in front, watched, streaming clients through the guard, 15 s of
    healthy progress recorded."""
    sim = await s.sim(*args)
    guard = Guard(GuardSettings(), upstream(sim.url))
    await guard.start("127.0.0.1", 0)
    s.cleanup(guard.stop)
    s.watch(sim.url, wire=guard)
    url = f"http://127.0.0.1:{guard.port}"
    streaming = None
    if clients:
        streaming = s.load(url, clients=clients, model=SIM_MODEL, **load)
        await s.until_state(State.PROGRESSING)
        await s.observe(15.0)
    return sim, url, streaming


async def guard_stopped(s: Session) -> None:
    sim, _, _ = await guarded(s, "--tokens-per-second", "25")
    pids = sim.engine_pids()
    s.cleanup(lambda: asyncio.to_thread(_signal, pids, signal.SIGCONT))
    _signal(pids, signal.SIGSTOP)
    s.mark(f"SIGSTOP of VLLM::EngineCore {pids} under streaming load through the guard")
    await s.observe(30.0)
    _signal(pids, signal.SIGCONT)
    s.note("SIGCONT")
    await s.until_state(State.PROGRESSING)
    await s.observe(5.0)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def guard_freeze_last(s: Session) -> None:
    sim, _, load = await guarded(s, "--fault", "freeze-last", "--tokens-per-second", "25")
    assert load is not None
    load.stop_new()  # the load winds down; the engine freezes with the last request running
    await fault_fired(s, sim)
    s.mark("freeze-last fired under load through the guard")
    await s.observe(30.0)


async def guard_slow_decode(s: Session) -> None:
    sim, _, _ = await guarded(s, clients=3)
    await s.fault(sim, "slow", slow_tokens_per_second=0.1)
    s.mark("fault slow: one engine step every 10 s (streams through the guard)")
    await s.observe(60.0)
    await s.fault(sim, "none")
    s.note("fault cleared")
    await s.observe(5.0)


async def guard_long_prefill(s: Session) -> None:
    sim, url, _ = await guarded(s, clients=2)
    await s.fault(sim, "long-prefill", long_prefill_seconds=40.0)
    s.load(url, clients=1, max_tokens=40, model=SIM_MODEL, prompt=" ".join(["context"] * 4000))
    s.mark("a 4000-token prompt whose prefill takes 40 s while two streams decode")
    await s.observe(50.0)


async def guard_queueing(s: Session) -> None:
    await guarded(s, "--max-num-seqs", "2", "--kv-capacity-tokens", "600", clients=8)
    s.mark("8 streaming clients, 2 run at a time: the rest queue before their first token")
    await s.observe(40.0)


async def guard_stuck_request(s: Session) -> None:
    sim, url, _ = await guarded(s, "--tokens-per-second", "25", clients=3, max_tokens=2000)
    await s.fault(sim, "stuck-request")
    assert s.http is not None
    body = {"model": SIM_MODEL, "prompt": "go", "max_tokens": 2000, "stream": True}
    task = asyncio.create_task(stuck_stream(s, url, body))
    s.cleanup(lambda: _cancel(task))
    s.mark("one request (stuck-1) stops getting tokens after two while three streams go on")
    await s.observe(40.0)


async def stuck_stream(s: Session, url: str, body: dict[str, Any]) -> None:
    assert s.http is not None
    headers = {"X-Request-Id": "stuck-1"}
    async with s.http.post(url + "/v1/completions", json=body, headers=headers) as resp:
        async for _ in resp.content:
            pass


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("guard-stopped-sim", "SIGSTOP of the engine core under streaming load, every "
                 "client through the guard; SIGCONT after 30 s.", guard_stopped,
                 Expect("stopped", WIRE, "progressing", 32.0)),
        Scenario("guard-freeze-last-sim", "The seed's freeze (the last request's engine step "
                 "never returns as the load winds down), the clients through the guard.",
                 guard_freeze_last, Expect("host-deadlock", WIRE)),
        Scenario("guard-slow-decode-sim", "Streams through the guard while decode slows to one "
                 "step every 10 s for 60 s (the engine computes meanwhile).", guard_slow_decode,
                 Expect()),
        Scenario("guard-long-prefill-sim", "A 40 s prefill (no first token) while two streams "
                 "decode, all through the guard.", guard_long_prefill, Expect()),
        Scenario("guard-queueing-sim", "8 streaming clients through the guard, 2 running at a "
                 "time (max_num_seqs 2, a small KV cache: preemptions).", guard_queueing,
                 Expect()),
        Scenario("guard-stuck-request-sim", "One request stops getting tokens (the simulator's "
                 "stuck-request fault) while three streams go on: never an engine stall; the "
                 "request judge names it.", guard_stuck_request, Expect()),
    ]
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the guard's corpus scenarios.")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--out", type=Path, default=TRACES)
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name:28} {s.description}")
        return 0
    chosen = [SCENARIOS[n] for n in args.names or SCENARIOS]

    async def run() -> None:
        for scenario in chosen:
            await record_one(scenario, args.out)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
