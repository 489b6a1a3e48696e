"""A fleet `check` of many simulated engines on this machine.

One helper process serves N vLLM-shaped /metrics endpoints on N loopback ports (half busy with
moving counters, half idle): a full simulator per engine would measure the simulators, not
the watchdog. Then `engine-watchdog check --targets FILE` judges them all; the table shows its
wall time and verdict counts.

Run: .venv/bin/python -m benchmarks.fleet [--count 500]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

EXPOSITION = """\
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.1
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {tokens}
"""


def make_app(busy: bool) -> web.Application:
    counter = itertools.count()

    async def metrics(_: web.Request) -> web.Response:
        tokens = next(counter) * 10 if busy else 0
        return web.Response(text=EXPOSITION.format(running=2 if busy else 0, tokens=tokens))

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


async def serve(count: int, out: Path) -> None:
    urls = []
    for i in range(count):
        runner = web.AppRunner(make_app(busy=i % 2 == 0), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        urls.append(f"http://127.0.0.1:{port}")
    partial = out.with_suffix(".partial")
    await asyncio.to_thread(partial.write_text, "\n".join(urls) + "\n")
    partial.rename(out)  # whole or absent: the reader never sees half a list
    await asyncio.Event().wait()


def run_check(targets: Path) -> tuple[float, dict[str, int], int]:
    started = time.monotonic()
    cmd = [sys.executable, "-m", "engine_watchdog", "check", "--targets", str(targets), "--json"]
    cmd += ["--no-canary", "--stall-seconds", "10"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    wall = time.monotonic() - started
    doc = json.loads(done.stdout)
    return wall, doc["summary"], done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.count, args.serve))
        return
    with tempfile.TemporaryDirectory() as tmp:
        targets = Path(tmp) / "targets.txt"
        server = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-m",
                "benchmarks.fleet",
                "--count",
                str(args.count),
                "--serve",
                str(targets),
            ],
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not targets.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            wall, summary, code = run_check(targets)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    print(f"{'engines':>8} {'check wall s':>13}  verdicts (exit {code})")
    print(f"{args.count:>8} {wall:>13.2f}  {summary}")


if __name__ == "__main__":
    main()
