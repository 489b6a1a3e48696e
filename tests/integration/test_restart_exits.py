"""Every restart goes through the supervisor, whoever asks, in run mode."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from engine_watchdog.sim.launcher import free_port
from tests.tools.run_mode import Watchdogs, history, keep_asking, sim_engine, starts
from tests.waiting import eventually


async def test_an_engine_that_exits_by_itself_is_restarted_by_the_supervisor(
    tmp_path: Path,
) -> None:
    """The engine crashes at each start: 3 restarts, then the rate limit once; actions.jsonl,
    /metrics and the log agree."""
    port = free_port()
    engine = sim_engine(tmp_path, port, ["crash"] * 6)
    async with Watchdogs(tmp_path) as dogs:
        run = await dogs.start(
            "run", f"http://127.0.0.1:{port}", "--incident-dir", str(tmp_path),
            "--action", "restart", "--max-restarts", "3", "--restart-backoff", "0",
            "--startup-grace", "0", "--", *engine,
        )  # fmt: skip
        client = asyncio.create_task(keep_asking(port))
        try:
            await eventually(
                lambda: any(r["result"] == "rate_limited" for r in history(tmp_path)),
                timeout=240,
                interval=0.2,
                what="the rate limit",
            )
            await asyncio.sleep(3)  # a window for a second, wrong, record
            restarts = [r for r in history(tmp_path) if r["action"] == "restart"]
            ok = [r for r in restarts if r["result"] == "ok"]
            assert len(ok) == 3, restarts
            assert [r["result"] for r in restarts].count("rate_limited") == 1, restarts
            text = await run.metrics()
            counted = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("engine_watchdog_actions")
                and 'action="restart"' in line
                and 'result="ok"' in line
                and "_created" not in line
            ]
            assert counted == [3.0], [ln for ln in text.splitlines() if "actions" in ln]
            log = run.log()
            assert log.count("action restart: ok") == 3, log[-3000:]
            assert log.count("action restart: rate_limited") == 1, log[-3000:]
            assert starts(tmp_path) == 4
        finally:
            client.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client
        assert await dogs.stop(run) == -signal.SIGTERM  # ended, in order, by its SIGTERM
