"""One log format for every line `watch` writes: in --json mode a stall, its actions and the
recovery are JSON lines a log shipper indexes (the incident's keys on each); without it, lines a
person reads. Secrets stay out of both."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from engine_watchdog.sim.loadgen import StreamingLoad
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import CONSOLE_SCRIPT
from tests.waiting import eventually

KEYS = {"ts", "level", "logger", "msg", "target", "engine", "state", "cause", "incident"}
PASSWORD = "hunter2-in-the-url"
API_KEY = "sk-logformat0123456789abcdef"


TRANSITION = re.compile(r"engine (\S+): (\S+) -> ([a-z-]+)")


class Lines:
    """A watch's stdout, read line by line up to a transition into one of ``states``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.seen: list[str] = []

    async def until(self, *states: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.proc.stdout.readline()).decode()
                assert line, "watch exited"
                self.seen.append(line)
                found = TRANSITION.search(line)
                if found and found.group(3) in states:
                    return line


async def stall_and_recover(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path, *args: str
) -> tuple[str, str]:
    """Load, a deadlock, the stall and its capture, the thaw and the recovery: the watch's stdout
    and stderr once it stopped."""
    sim = await sim_factory("--tokens-per-second", "30")
    url = sim.url.replace("://", f"://user:{PASSWORD}@")
    env = dict(os.environ, ENGINE_WATCHDOG_API_KEY=API_KEY)
    env.pop("PYTHONUNBUFFERED", None)  # as in a container: stdout a pipe, lines flushed by us
    incidents = tmp_path / "incidents"
    with (tmp_path / "watch.err").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(CONSOLE_SCRIPT), "watch", url, "--listen", "", "--stall-seconds", "6",
            "--action", "capture", "--incident-dir", str(incidents), *args,
            stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True, env=env,
        )  # fmt: skip
    out = Lines(proc)
    try:
        await out.until("idle", timeout=20)
        async with StreamingLoad(sim.url, clients=2, max_tokens=400, model="sim-model") as load:
            await load.wait_for(chunks=10, in_flight=1, timeout=20)
            await sim_http.set_fault(sim, "deadlock")
            await out.until("stalled", timeout=30)
            record = incidents / "actions.jsonl"
            await eventually(record.exists, timeout=30, what="the capture's record")
            await sim_http.post(sim, "/sim/fault", {"fault": "none"})
            load.stop_new()
            await out.until("progressing", "idle", timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        rest = await asyncio.wait_for(proc.stdout.read(), 20)
        assert await asyncio.wait_for(proc.wait(), 20) == -signal.SIGTERM  # (orderly)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    return "".join(out.seen) + rest.decode(), (tmp_path / "watch.err").read_text()


async def test_json_mode_writes_only_json_lines_with_the_incident_keys(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    out, err = await stall_and_recover(sim_factory, sim_http, tmp_path, "--json")
    lines = [line for line in (out + err).splitlines() if line.strip()]
    docs: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line: JSON
    assert all(doc.keys() >= KEYS for doc in docs), [d for d in docs if not d.keys() >= KEYS]
    stall = next(d for d in docs if d["state"] == "stalled" and d.get("old"))
    incident = stall["incident"]
    assert incident and stall["engine"] == "0" and stall["level"] == "warning"
    actions = [d for d in docs if d["logger"] == "engine_watchdog.actions"]
    assert actions and all(d["incident"] == incident for d in actions), actions
    assert any(d["msg"].startswith("action capture: ok") for d in actions)
    assert all(d["state"] == "stalled" and d["engine"] == "0" for d in actions)
    back = [d for d in docs if d.get("old") == "stalled"]
    assert back and back[0]["incident"] == incident  # the recovery closes the same incident
    assert all(d["target"] and "127.0.0.1" in d["target"] for d in docs if d["target"])
    assert PASSWORD not in out + err and API_KEY not in out + err


async def test_text_mode_stays_readable_and_redacted(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    out, err = await stall_and_recover(sim_factory, sim_http, tmp_path)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert lines and not [line for line in lines if line.lstrip().startswith("{")]
    action = next(line for line in lines if "action capture: ok" in line)
    assert " WARNING engine_watchdog.actions: " in action and "incident=" in action
    assert any(" -> stalled (" in line for line in out.splitlines())
    assert PASSWORD not in out + err and API_KEY not in out + err
