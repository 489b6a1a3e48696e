"""Supervise mode drains its engine's output whatever it prints: lines of
megabytes (tracebacks, config dumps with the whole command line) used to kill the copier, and
the engine then blocked on its next write (wchan anon_pipe_write)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from engine_watchdog.recovery.engine_log import EngineLog, copy_output
from engine_watchdog.sim.launcher import free_port
from tests.tools.run_mode import Watchdogs

LONG_LINES = """
import os, sys
out = sys.stdout.buffer
out.write(b"A" * (1 << 20) + b"\\n")
out.write(b"B" * (3 << 20) + b"\\n")
out.write(b"after the long lines\\n")
out.flush()
os.execv(sys.executable, [sys.executable, "-m", "engine_watchdog.sim", "--port", sys.argv[1]])
"""


async def test_engine_lines_of_megabytes_reach_the_log_and_the_engine_runs_on(
    tmp_path: Path,
) -> None:
    port = free_port()
    script = tmp_path / "engine.py"
    script.write_text(LONG_LINES)
    incidents = tmp_path / "incidents"
    async with Watchdogs(tmp_path) as dogs:
        run = await dogs.start(
            "run", f"http://127.0.0.1:{port}", "--incident-dir", str(incidents),
            "--", sys.executable, str(script), str(port),
        )  # fmt: skip
        await run.next_state("idle", timeout=40)  # the engine got past its long lines: serving
        lines = (incidents / "engine.log").read_bytes().split(b"\n")
        assert lines[0] == b"A" * (1 << 20)
        assert lines[1] == b"B" * (3 << 20)
        assert lines[2] == b"after the long lines"
        assert any(b"Starting vLLM API server" in line for line in lines[3:])
        assert "Traceback" not in run.log()
        assert await dogs.stop(run) == -signal.SIGTERM  # ended, in order, by its SIGTERM


CHATTY = """
import sys
out = sys.stdout.buffer
for i in range(40):
    out.write(b"%d " % i + b"x" * (130 << 10) + b"\\n")  # 40 lines of 130 KiB: 5.2 MB
out.write(b"the last line\\n")
"""


async def test_the_engine_log_stays_bounded_and_keeps_the_latest_output(tmp_path: Path) -> None:
    """A real child writing 5 MB through a pipe into a log bounded at 1 MiB: at most 1 MiB in
    the log and 1 MiB in ``.1``, the latest output in the log."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHATTY, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    engine_log = EngineLog(tmp_path / "engine.log", max_bytes=1 << 20)
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(copy_output(proc.stdout, engine_log, echo=False), 30)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        engine_log.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    current, older = tmp_path / "engine.log", tmp_path / "engine.log.1"
    assert current.stat().st_size <= 1 << 20 and older.stat().st_size <= 1 << 20
    assert current.read_bytes().endswith(b"39 " + b"x" * (130 << 10) + b"\nthe last line\n")
