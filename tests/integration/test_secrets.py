"""No secret from the engine's command line, its environment or a URL reaches anything the
watchdog writes or serves, and everything it writes is private.

Real processes carry real secrets: the simulator runs under tests/tools/secret_engine.py, whose
command line holds every form in tests/data/bad_input/secrets.json, started by ``run`` (through
``env VAR=secret``) and watched, recorded and captured by ``watch``; the target URL and the
Alertmanager URL carry passwords. Then every file under the test's folder, every line the
console scripts printed and every answer of /status and /metrics is searched for each secret.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.cli import CONSOLE_SCRIPT, run_cli
from tests.tools.watch import get
from tests.waiting import eventually

DATA = Path(__file__).resolve().parents[1] / "data" / "bad_input"
FIX: dict[str, Any] = json.loads((DATA / "secrets.json").read_text())
SECRETS: list[str] = FIX["secrets"]
SECRET_ENGINE = Path(__file__).resolve().parents[1] / "tools" / "secret_engine.py"


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


class Console:
    """One console-script process, its stdout and stderr in files (searched afterwards)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, *args: str, env: dict[str, str] | None = None) -> Console:
        self.proc = await asyncio.create_subprocess_exec(
            str(CONSOLE_SCRIPT), *args, stdout=self.out.open("wb"), stderr=self.err.open("wb"),
            env=env, start_new_session=True,
        )  # fmt: skip
        return self

    def states(self) -> list[dict[str, Any]]:
        lines = self.out.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    async def reaches(self, state: str, timeout: float) -> None:
        def seen() -> bool:
            return any(doc.get("state") == state for doc in self.states())

        await eventually(seen, timeout=timeout, interval=0.2, what=f"{self.out.name}: {state}")

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 30)
        except asyncio.TimeoutError:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return await self.proc.wait()


def own_command_lines(*consoles: Console) -> str:
    """What ps shows of the watchdog processes themselves."""
    return "\n".join(
        Path(f"/proc/{c.proc.pid}/cmdline").read_bytes().decode(errors="replace")
        for c in consoles
        if c.proc is not None
    )


async def endpoints(listen: str) -> str:
    """What /status and /metrics answer now."""
    bodies = [(await get(f"http://{listen}{path}"))[1] for path in ("/status", "/metrics")]
    return "\n".join(bodies)


def watch_args(url: str, tmp: Path, listen: str, closed: int) -> list[str]:
    am = f"http://{FIX['alertmanager_userinfo']}@127.0.0.1:{closed}"
    return [
        "watch", url, "--json", "--listen", listen, "--record", str(tmp / "trace.jsonl"),
        "--incident-dir", str(tmp / "watch" / "incidents"), "--engine-log", str(tmp / "raw.log"),
        "--action", "capture", "--alertmanager", am, "--interval", "0.5",
        "--stall-seconds", "4", "--startup-grace", "0", "--canary-timeout", "2",
    ]  # fmt: skip


async def one_shots(tmp: Path, url: str, closed: int) -> str:
    """check (live and closed), doctor and capture with a password in the URL: their output."""
    dead = f"http://{FIX['target_userinfo']}@127.0.0.1:{closed}"
    runs = await asyncio.gather(
        run_cli("check", url, "--timeout", "3"),
        run_cli("check", dead, "--json", "--timeout", "3"),
        run_cli("doctor", "--url", dead),
        run_cli("capture", "--url", dead, "--incident-dir", str(tmp / "none")),
    )
    return "\n".join(r.out + r.err for r in runs)


async def freeze(port: int, load: StreamingLoad) -> None:
    """The engine stops stepping with a request in flight (kept open by ``load``)."""
    await load.wait_for(chunks=5, in_flight=2, timeout=30)
    async with aiohttp.ClientSession() as s:
        body = {"fault": "freeze-last"}
        async with s.post(f"http://127.0.0.1:{port}/sim/fault", json=body) as resp:
            assert resp.status == 200
    load.stop_new()


def private(paths: list[Path]) -> list[str]:
    """Paths whose mode is not 0700 (folders) or 0600 (files)."""
    wrong = []
    for p in paths:
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode != (0o700 if p.is_dir() else 0o600):
            wrong.append(f"{p.name}: {oct(mode)}")
    return wrong


def written(root: Path, exclude: Callable[[Path], bool]) -> list[Path]:
    return [p for p in [root, *root.rglob("*")] if not exclude(p)]


def secret_engine(port: int) -> list[str]:
    """The engine command: ``env VAR=secret`` before it, secrets in every form after it."""
    return [*FIX["env_prefix"], sys.executable, str(SECRET_ENGINE), "--port", str(port),
            "--tokens-per-second", "30", "--", *FIX["engine_argv"]]  # fmt: skip


async def exercise(tmp: Path, run: Console, watch: Console, closed: int) -> list[str]:
    """run supervises the engine, watch records and captures it through a stall; returns what
    the HTTP endpoints, ps and the one-shot commands showed meanwhile. ``closed``: a port
    nothing listens on (the Alertmanager that refuses, the dead engine)."""
    port = free_port()
    listens = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    url = f"http://{FIX['target_userinfo']}@127.0.0.1:{port}"
    env = {**os.environ, "SECRET_ENGINE_TEE": str(tmp / "raw.log")}
    await run.start("run", url, "--json", "--listen", listens[0], "--incident-dir",
                    str(tmp / "run-incidents"), "--action", "none", "--", *secret_engine(port),
                    env=env)  # fmt: skip
    await run.reaches("idle", timeout=40)
    await watch.start(*watch_args(url, tmp, listens[1], closed))
    await watch.reaches("idle", timeout=30)
    seen = [await endpoints(listen) for listen in listens]
    # The engine enforces the key its environment gives it (VLLM_API_KEY, as vLLM does).
    (key,) = [v.split("=", 1)[1] for v in FIX["env_prefix"] if v.startswith("VLLM_API_KEY=")]
    auth = {"Authorization": f"Bearer {key}"}
    async with StreamingLoad(
        f"http://127.0.0.1:{port}", clients=3, model="sim-model", headers=auth
    ) as load:
        await freeze(port, load)
        await watch.reaches("stalled", timeout=40)
        bundles = tmp / "watch" / "incidents"  # and its parent: both created 0700
        await eventually(lambda: list(bundles.glob("2*/manifest.json")), 40, what="a bundle")
    seen += [await endpoints(listen) for listen in listens]
    seen += [own_command_lines(run, watch), await one_shots(tmp, url, closed)]
    assert f"\nhttp://<redacted>@127.0.0.1:{port}: " in "\n" + seen[-1], "check: its target"
    return seen


def leaks_in_files(tmp: Path) -> dict[str, list[str]]:
    # raw.log is the engine's own log (written by the engine, not by the watchdog).
    files = [p for p in written(tmp, lambda p: p.name == "raw.log") if p.is_file()]
    return {str(p.relative_to(tmp)): leaks(p.read_text(errors="replace")) for p in files}


async def test_no_secret_in_any_file_log_trace_bundle_or_endpoint(tmp_path: Path) -> None:
    run, watch = Console(tmp_path, "run"), Console(tmp_path, "watch")
    try:
        with socket.socket() as held:  # bound, never listening: no other test's server takes it
            held.bind(("127.0.0.1", 0))
            seen = await exercise(tmp_path, run, watch, held.getsockname()[1])
    finally:
        await asyncio.gather(watch.stop(), run.stop())
        for console in (c for c in (run, watch) if c.err.exists()):  # shown when it fails
            print(f"--- {console.err.name} ---", console.err.read_text(errors="replace")[-3000:])
    found = {"endpoints, ps, one-shot commands": leaks("\n".join(seen)), **leaks_in_files(tmp_path)}
    ours = [tmp_path / "run-incidents", tmp_path / "watch", tmp_path / "trace.jsonl"]
    modes = private([p for root in ours for p in written(root, lambda p: False)])
    report = [f"{where}: {len(v)} secret(s), {v[0]}..." for where, v in found.items() if v]
    assert not report + modes, "secrets leaked, or files not private:\n" + "\n".join(report + modes)
    bundle = next((tmp_path / "watch" / "incidents").glob("2*/"))
    records = (bundle / "processes.json").read_text()
    assert all(kept in records for kept in FIX["kept"]), "redaction hid more than the secrets"
    assert any((bundle / "pyspy").glob("*.txt")), "no py-spy text: its header went unchecked"


async def test_the_url_credentials_still_reach_the_engine(tmp_path: Path) -> None:
    """Redacted everywhere it is shown, the URL keeps its credentials where the probes connect:
    an engine behind basic auth (a real server on loopback) is judged, not 401."""
    user, password = FIX["target_userinfo"].split(":")
    wanted = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != wanted:
            return web.Response(status=401)
        return web.Response(text='vllm:num_requests_running{engine="0"} 0\n')

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://{FIX['target_userinfo']}@127.0.0.1:{port}"
        ran = await run_cli("check", url, "--engine", "vllm", "--no-canary", "--timeout", "4")
    finally:
        await runner.cleanup()
    # Idle with --no-canary is no evidence of health: undecided.
    assert ran.code == 3, ran.out + ran.err
    assert ran.out.startswith(f"http://<redacted>@127.0.0.1:{port}: undecided: idle")
    assert not leaks(ran.out)
