"""The guard's hot path alone, in one process: engine reads of one SSE event each, through
``EngineSide.data_received`` (httptools, the token scan, the note, the framing) into a transport
that takes the bytes and does nothing. What it costs per event without sockets or a loop.

    python -m benchmarks.hot_path [--events N] [--chat] [--root DIR]

Prints CPU µs per event (best of 9 runs; noisy where the machine is shared). Counted
instructions are steady where time is not: under valgrind, two runs differ only in N, and
their difference over the events is the path's own count (docs/performance.md):

    for n in 2000 22000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks.hot_path --events $n --runs 1 2>&1 | grep Collected; done

``--root DIR`` runs another checkout's code (``git archive REV engine_watchdog | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

COMPLETION = (
    b'data: {"id":"cmpl-0fca5362792d478da50dcb4a5cb467ef","object":"text_completion",'
    b'"created":1796525517,"model":"sim-model","choices":[{"index":0,"text":" the",'
    b'"logprobs":null,"finish_reason":null,"stop_reason":null}],"sim_t":1796525517.1821558}\n\n'
)
"""What the simulator streams with --stamp-events, as benchmarks/guard.py measures it."""
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Sink:
    """A transport that takes every write and is never full. What the path calls per event are
    C functions, as on uvloop's transports: only the guard's own work is counted."""

    def __init__(self) -> None:
        last: deque[bytes] = deque(maxlen=1)  # (the last write: nothing accumulates)
        self.write = last.append
        self.get_write_buffer_size = int  # 0
        self.is_closing = bool  # False

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def per_event_us(event: bytes, events: int, runs: int) -> float:
    from engine_watchdog.guard.exchange import Exchange
    from engine_watchdog.guard.fast import Client, EngineSide
    from engine_watchdog.guard.scan import new_progress
    from engine_watchdog.guard.stats import GuardStats

    chunk = b"%x\r\n%b\r\n" % (len(event), event)
    stats = GuardStats()
    best = float("inf")
    for _ in range(runs):
        up: Any = EngineSide("POST")
        up.connection_made(Sink())
        up.data_received(HEAD)
        ex = Exchange("bench", "", time.time(), new_progress(stats.gaps))
        ex.sse = True
        up._client = Client(Sink(), ex, stats, True, time.time)  # type: ignore[arg-type]
        up._ready.clear()
        received = up.data_received
        start = time.process_time()
        for _ in range(events):
            received(chunk)
        best = min(best, (time.process_time() - start) / events * 1e6)
        assert ex.events == events, f"{ex.events} tokens counted of {events}"
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The guard's hot path, in-process.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--chat", action="store_true", help="chat deltas, not completions")
    parser.add_argument("--root", help="another checkout's code")
    args = parser.parse_args(argv)
    if args.root:
        sys.path.insert(0, args.root)
    event = COMPLETION
    if args.chat:
        event = event.replace(b'"text":" the"', b'"delta":{"content":" the"}')
    us = asyncio.run(per_event_us(event, args.events, args.runs))
    print(f"{us:.3f} us/event over {args.events} events (best of {args.runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
