"""Supervise mode (`engine-watchdog run -- ENGINE`) and the demo, on the real simulator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import CONSOLE_SCRIPT, run_cli
from tests.tools.watch import WatchProcess
from tests.waiting import eventually


async def start_run(tmp: Path, port: int, *args: str) -> WatchProcess:
    url = f"http://127.0.0.1:{port}"
    engine = [sys.executable, "-m", "engine_watchdog.sim", "--port", str(port)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine_watchdog", "run", url, "--json", "--listen", "",
        "--incident-dir", str(tmp), "--stall-seconds", "10", *args, "--", *engine,
        stdout=asyncio.subprocess.PIPE, stderr=(tmp / "run.err").open("wb"), start_new_session=True,
    )  # fmt: skip
    return WatchProcess(proc, "")


async def post(url: str, body: dict[str, Any], timeout: float = 10) -> int:
    bound = aiohttp.ClientTimeout(timeout)
    async with aiohttp.ClientSession() as s, s.post(url, json=body, timeout=bound) as r:
        return r.status


async def complete(port: int) -> int:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 4}
    return await post(f"http://127.0.0.1:{port}/v1/completions", body, timeout=60)


def history(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "actions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


async def test_engine_death_is_reported_and_restarted_once(tmp_path: Path) -> None:
    port = free_port()
    run = await start_run(tmp_path, port)
    try:
        await run.next_state("idle", timeout=40)
        engines = descendants(run.proc.pid)
        await post(f"http://127.0.0.1:{port}/sim/fault", {"fault": "crash"})
        crashing = asyncio.create_task(complete(port))  # the armed crash fires on the next step
        await run.next_state("stalled", timeout=30, cause="engine-dead")
        assert await crashing == 500  # vLLM's EngineDeadError: the client is answered
        await run.next_state("idle", timeout=60)  # the new engine, judged again
        restarts = [r for r in history(tmp_path) if r["action"] == "restart"]
        assert [r["result"] for r in restarts if r["result"] == "ok"] == ["ok"], restarts
        assert not set(engines) & set(descendants(run.proc.pid))  # new processes
    finally:
        children = descendants(run.proc.pid)
        run.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(run.proc.wait(), 40)
    assert code == -signal.SIGTERM  # an orderly stop, ended as the signal would
    assert not [p for p in children if psutil.pid_exists(p)], "engine processes left behind"
    # --json: the engine's own output on our stderr is JSON lines too, one record a line.
    records = [json.loads(line) for line in (tmp_path / "run.err").read_text().splitlines()]
    assert any(r["logger"] == "engine" and "API server" in r["msg"] for r in records), records
    assert any(r["logger"] == "engine_watchdog.actions" and r["incident"] for r in records)


ENGINE_SCRIPT = """
import os, pathlib, sys, time
count = pathlib.Path(sys.argv[1])
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
if n == 1:  # the 2nd engine dies by itself (supervise mode's own restart path)
    time.sleep(2)
    sys.exit(3)
# the others hang in a step that spins without progress (the supervisor's restart path)
os.execv(sys.executable, [sys.executable, "-m", "engine_watchdog.sim", "--port", sys.argv[2],
                          "--fault", "spin"])
"""


async def keep_asking(port: int) -> None:
    """One client after the other, each answered or given up on (a hung engine)."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            await asyncio.wait_for(complete(port), 15)
        await asyncio.sleep(0.3)


async def test_restarts_from_both_paths_stop_at_exactly_max_restarts(tmp_path: Path) -> None:
    """Supervise mode restarts for two reasons: the supervisor's stall verdicts, and the engine
    exiting on its own. Both count against one --max-restarts, in one history."""
    port, starts = free_port(), tmp_path / "starts"
    (tmp_path / "engine.py").write_text(ENGINE_SCRIPT)
    engine = [sys.executable, str(tmp_path / "engine.py"), str(starts), str(port)]
    url = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine_watchdog", "run", url, "--json", "--listen", "",
        "--incident-dir", str(tmp_path), "--action", "restart", "--max-restarts", "3",
        "--restart-backoff", "0", "--stall-seconds", "4", "--startup-grace", "0",
        "--canary-timeout", "2", "--", *engine,
        stdout=asyncio.subprocess.DEVNULL, stderr=(tmp_path / "run.err").open("wb"),
        start_new_session=True,
    )  # fmt: skip
    client = asyncio.create_task(keep_asking(port))
    try:
        await eventually(  # the 4th engine hangs for good: the limit is reached
            lambda: any(r["result"] == "rate_limited" for r in history(tmp_path)),
            timeout=120,
            interval=0.1,
            what="the restart limit reached",
        )
        done = [r for r in history(tmp_path) if r["action"] == "restart"]
        ok = [r["detail"] for r in done if r["result"] == "ok"]
        assert len(ok) == 3, done
        assert any("exited" in d for d in ok) and any("restarted" in d for d in ok), ok
        assert "rate_limited" in {r["result"] for r in done}
        await asyncio.sleep(2)  # no fifth engine comes
        assert starts.read_text() == "4"
    finally:
        client.cancel()
        os.killpg(proc.pid, signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 40)


async def test_dry_run_never_touches_the_engine(tmp_path: Path) -> None:
    port = free_port()
    # A deadlock before the engine reports the new request looks idle (running 0, waiting 0):
    # only the idle canary can tell, so let it come often.
    run = await start_run(
        tmp_path,
        port,
        "--dry-run",
        "--action",
        "capture,abort,restart",
        "--idle-canary-interval",
        "3",
    )
    try:
        await run.next_state("idle", timeout=40)
        engines = descendants(run.proc.pid)
        await post(f"http://127.0.0.1:{port}/sim/fault", {"fault": "deadlock"})
        hung = asyncio.create_task(complete(port))
        await run.next_state("stalled", timeout=40)
        await eventually(  # the ladder logs its would-be actions
            lambda: any(r["action"] == "restart" for r in history(tmp_path)),
            timeout=20,
            interval=0.2,
            what="a dry-run restart in the history",
        )
        assert {r["result"] for r in history(tmp_path)} == {"dry_run"}
        assert set(engines) == set(descendants(run.proc.pid))  # nothing killed
        assert not any(tmp_path.glob("2*"))  # no bundle written either
        hung.cancel()
    finally:
        os.killpg(run.proc.pid, signal.SIGTERM)
        await asyncio.wait_for(run.proc.wait(), 40)


async def test_demo_tells_the_whole_story(tmp_path: Path) -> None:
    ran = await run_cli("demo", "--incident-dir", str(tmp_path), timeout=240)
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    steps = ("stalled", "action capture: ok", "action abort: ok", "action restart: ok")
    for step in (*steps, "engine back", "HTTP 200"):
        assert step in ran.out, step
    assert "none left hanging" in ran.out
    bundles = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert bundles and (bundles[0] / "summary.md").exists()
    # A story, not a program's insides: no Python repr (``LoadOutcome(started=...)``).
    assert not re.search(r"\b[A-Z]\w+\(\w+=", ran.out), ran.out
    # Every folder it names is one the bundle has.
    said = re.findall(r"^incident bundle: (\S+)\n  holds (.+)$", ran.out, re.MULTILINE)
    assert said, ran.out
    for path, holds in said:
        folders = re.findall(r"([\w.-]+)/ \(", holds)
        assert "pyspy" in folders, holds
        assert all((Path(path) / name).is_dir() for name in folders), holds
        files = [item.split(" (")[0] for item in holds.split(", ") if "/" not in item]
        assert all((Path(path) / name).is_file() for name in files), holds


async def test_ctrl_c_ends_the_demo_at_once_and_its_story_with_it(tmp_path: Path) -> None:
    """Before: the story went on printing for 4.6 s after Ctrl-C (the clients drained for up to
    10 s, the guard's drain behind them) and the exit was 130. Now: one line says it stops, no
    story line follows, and the process ends by SIGINT (130 in a shell)."""
    proc = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT), "demo", "--incident-dir", str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(90):
            while b"the engine stops scheduling one request" not in await proc.stdout.readline():
                pass  # the story under way: clients streaming through the guard
        os.kill(proc.pid, signal.SIGINT)
        signalled = asyncio.get_running_loop().time()
        rest = (await asyncio.wait_for(proc.stdout.read(), 15)).decode()
        code = await asyncio.wait_for(proc.wait(), 15)
        took = asyncio.get_running_loop().time() - signalled
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    err = (await proc.stderr.read()).decode()
    lines = [line for line in rest.splitlines() if line.strip()]
    print(f"\n[demo] Ctrl-C: ended in {took:.1f} s")
    assert code == -signal.SIGINT, (code, rest, err[-2000:])
    assert lines and "interrupted: stopping" in lines[0], rest
    assert len(lines) == 1, rest  # nothing told after it
    assert "Traceback" not in err, err[-2000:]
    assert took < 10, took
