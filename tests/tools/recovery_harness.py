"""Supervise mode on a REAL vLLM: start ``engine-watchdog run ... -- <vLLM>``, inject a fault into
the engine it supervises, and measure the recovery. Shared by test_recovery.py and
benchmarks/recovery.py; it holds no tests itself.

The watchdog runs in its own process group and starts vLLM in another (supervise mode); vLLM
loads the test plugin (tests/e2e/plugin) from a PYTHONPATH that also holds a generated
dist-info folder, so the shared vLLM venv is never modified. ``stop_supervised`` ends the
watchdog (which stops its engine), then SIGCONTs and SIGKILLs every engine process ever seen,
whatever state they were left in.

One recovery (``recover_from``): streaming clients run, the fault is injected (SIGSTOP or SIGKILL
of ``VLLM::EngineCore``, or the plugin's deadlock), the clients stop issuing new requests, and
three times are taken from the fault: the watchdog's stall verdict (the ``t`` of its JSON line),
the old engine's processes all gone, and the first successful completion after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp
import psutil

from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import LoadOutcome, StreamingLoad
from tests.tools.vllm_env import VllmEnv
from tests.tools.vllm_server import (
    ENGINE_CORE_TITLE,
    SERVED_MODEL,
    http_get,
    metric_sum,
    plugin_env,
    process_title,
    server_argv,
    server_env,
)

FAULTS = ("sigstop", "deadlock", "sigkill")

READY_TIMEOUT_S = 240.0
WATCHDOG_STOP_S = 45.0  # its own engine stop: SIGTERM grace 15 s, then SIGKILL 10 s
STOPPED_BOUND_S = 120.0  # fault -> old engine gone (verdict, capture, abort grace, stop)
SERVED_BOUND_S = 240.0  # old engine gone -> first completion (a vLLM start: 40-90 s here)
SETTLED_BOUND_S = 60.0
DRAIN_S = 30.0
SERVING_STATES = ("idle", "progressing")
REPORT_LINES: list[str] = []
"""One line per measured recovery; conftest prints them in the terminal summary."""
T = TypeVar("T")


@dataclass(frozen=True)
class WatchdogOptions:
    stall_s: float = 20.0
    abort_grace_s: float = 5.0
    canary_timeout_s: float = 25.0
    """Longer than the stall window: the canary is still in flight when the abort rung runs,
    so the abort by request id (all that --enable-scale-out offers) has an id to send."""
    max_restarts: int = 5
    engine_args: tuple[str, ...] = ("--enable-scale-out",)
    actions: str = "capture,abort,restart"
    extra: tuple[str, ...] = ()
    """More watchdog options (the guard's)."""
    engine_env: tuple[tuple[str, str], ...] = ()
    """More of the engine's environment (the stuck-request plugin's marker)."""


@dataclass
class Supervised:
    """A running ``engine-watchdog run`` and what it printed."""

    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    trigger: Path
    transitions: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    _files: list[IO[bytes]] = field(default_factory=list, repr=False)
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def incident_dir(self) -> Path:
        return self.workdir / "incidents"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "watchdog.stderr"

    def actions(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The watchdog's action history (actions.jsonl) from ``since`` on."""
        path = self.incident_dir / "actions.jsonl"
        if not path.exists():
            return []
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in records if float(r["t"]) >= since]

    def verdicts(self, since: float = 0.0) -> list[dict[str, Any]]:
        return [v for v in list(self.transitions) if float(v["t"]) >= since]

    def state(self) -> str | None:
        return str(self.transitions[-1]["state"]) if self.transitions else None

    def engine_procs(self) -> list[psutil.Process]:
        """The engine's processes now (the watchdog's descendants); remembered for cleanup."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for p in procs:
            self.seen.setdefault(p.pid, p)
        return procs

    def engine_core_pids(self) -> list[int]:
        procs = self.engine_procs()
        return [p.pid for p in procs if process_title(p).startswith(ENGINE_CORE_TITLE)]

    def bundles(self, since: float) -> list[Path]:
        """Incident bundles whose manifest was created at or after ``since``, oldest first."""
        found = []
        for manifest in self.incident_dir.glob("*/manifest.json"):
            doc = json.loads(manifest.read_text())
            if float(doc.get("created_unix", 0)) >= since - 1.0:  # whole seconds in the name
                found.append((float(doc["created_unix"]), manifest.parent))
        return [path for _, path in sorted(found)]

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "(no watchdog log)"
        return "\n".join(text.splitlines()[-lines:])

    def _read_stdout(self, out: IO[bytes], copy: IO[bytes]) -> None:
        for raw in iter(out.readline, b""):
            copy.write(raw)
            copy.flush()
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                if isinstance(rec, dict) and "state" in rec:
                    self.transitions.append(rec)


# -- start and stop ----------------------------------------------------------------------------


def watchdog_argv(engine_port: int, workdir: Path, opts: WatchdogOptions) -> list[str]:
    return [
        sys.executable, "-m", "engine_watchdog", "run", f"http://127.0.0.1:{engine_port}",
        "--json", "--no-gpu",
        "--listen", f"127.0.0.1:{free_port()}",
        "--incident-dir", str(workdir / "incidents"),
        "--stall-seconds", str(opts.stall_s),
        "--canary-timeout", str(opts.canary_timeout_s),
        "--action", opts.actions,
        "--abort-grace", str(opts.abort_grace_s),
        "--restart-backoff", "0",
        "--max-restarts", str(opts.max_restarts),
        *opts.extra,
        "--",
    ]  # fmt: skip


def start_supervised(
    env: VllmEnv, workdir: Path, opts: WatchdogOptions | None = None
) -> Supervised:
    """Start ``engine-watchdog run -- <vLLM>``; return once vLLM serves and the watchdog judges
    it. On any failure everything started is stopped and the error carries the log tail."""
    opts = opts or WatchdogOptions()
    workdir.mkdir(parents=True, exist_ok=True)
    port, trigger = free_port(), workdir / "deadlock.trigger"
    trigger.unlink(missing_ok=True)
    extra = plugin_env(workdir, trigger) | dict(opts.engine_env)
    argv = [*watchdog_argv(port, workdir, opts), *server_argv(env, port, opts.engine_args)]
    stderr = (workdir / "watchdog.stderr").open("wb")
    proc = subprocess.Popen(  # fixed argv, no shell
        argv,
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env=server_env(extra),
        cwd=workdir,
        start_new_session=True,
    )
    sup = Supervised(proc=proc, port=port, workdir=workdir, trigger=trigger)
    copy = (workdir / "watchdog.stdout").open("wb")
    sup._files += [stderr, copy]
    assert proc.stdout is not None
    sup._reader = threading.Thread(target=sup._read_stdout, args=(proc.stdout, copy), daemon=True)
    sup._reader.start()
    try:
        _wait_ready(sup, READY_TIMEOUT_S)
    except BaseException:
        stop_supervised(sup)
        raise
    return sup


def _wait_ready(sup: Supervised, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sup.proc.poll() is not None:
            raise RuntimeError(
                f"engine-watchdog run exited {sup.proc.returncode}:\n{sup.log_tail()}"
            )
        sup.engine_procs()
        if http_get(f"{sup.base_url}/health")[0] == 200 and sup.state() in SERVING_STATES:
            status, body = http_get(f"{sup.base_url}/v1/models")
            if status == 200 and f'"{SERVED_MODEL}"' in body:
                return
        time.sleep(0.5)
    raise RuntimeError(f"supervised vLLM not serving after {timeout:.0f} s:\n{sup.log_tail()}")


def stop_supervised(sup: Supervised) -> None:
    """End the watchdog (it stops its engine), then every engine process ever seen; idempotent."""
    sup.engine_procs()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sup.proc.pid, signal.SIGTERM)
    try:
        sup.proc.wait(timeout=WATCHDOG_STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sup.proc.pid, signal.SIGKILL)
        sup.proc.wait(timeout=10)
    _kill_leftovers(list(sup.seen.values()))
    if sup._reader is not None:
        sup._reader.join(timeout=5)
    for f in sup._files:
        f.close()
    sup._files.clear()
    sup.trigger.unlink(missing_ok=True)


def _kill_leftovers(procs: list[psutil.Process]) -> None:
    """SIGCONT then SIGKILL what still runs of ``procs`` (is_running guards PID reuse)."""
    alive = [p for p in procs if p.is_running()]
    groups = set()
    for p in alive:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            groups.add(os.getpgid(p.pid))
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        for pgid in groups - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
    psutil.wait_procs(alive, timeout=10)


# -- one recovery ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """What one fault did, in seconds from the fault."""

    fault: str
    verdict: dict[str, Any] | None
    verdict_s: float | None
    stopped_s: float | None
    served_s: float | None
    in_flight: int
    """Client requests in flight at the fault."""
    answered: int
    """Of those: completed or errored (the rest hang)."""
    errored: int
    outcome: LoadOutcome
    actions: tuple[dict[str, Any], ...]
    fault_t: float

    @property
    def cause(self) -> str | None:
        return None if self.verdict is None else self.verdict.get("cause")

    def line(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} s"

        o = self.outcome
        return (
            f"{self.fault}: verdict {s(self.verdict_s)} ({self.cause}), engine stopped "
            f"{s(self.stopped_s)}, serving {s(self.served_s)}; in flight {self.in_flight}: "
            f"answered {self.answered} ({self.errored} errors), hanging {o.hanging}; all "
            f"requests: {o.started} started, {o.completed} completed, {o.errored} errored"
        )


async def wait_until(cond: Callable[[], T | None], timeout: float, step: float = 0.2) -> T | None:
    """Poll ``cond`` until it returns something not None, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got is not None or time.monotonic() >= deadline:
            return got
        await asyncio.sleep(step)


async def running_requests(base_url: str) -> float:
    status, body = await asyncio.to_thread(http_get, f"{base_url}/metrics")
    return metric_sum(body, "vllm:num_requests_running") if status == 200 else 0.0


async def sigstop_core(sup: Supervised, attempts: int = 5) -> float:
    """SIGSTOP the engine core while it holds running requests (see engine_core_stopped)."""
    pids = sup.engine_core_pids()
    assert pids, f"no {ENGINE_CORE_TITLE} under the watchdog"
    for _ in range(attempts):
        fault_t = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(1.0)  # stats already sent reach the API server
        if await running_requests(sup.base_url) > 0:
            return fault_t
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(1.0)
    raise AssertionError(f"engine core never held a running request in {attempts} tries")


async def inject(sup: Supervised, fault: str) -> float:
    """Inject ``fault``; return its wall-clock time."""
    if fault == "sigstop":
        return await sigstop_core(sup)
    if fault == "deadlock":
        fault_t = time.time()
        sup.trigger.touch()  # the next engine step blocks on the plugin's lock
        return fault_t
    if fault == "sigkill":
        pids = sup.engine_core_pids()
        assert pids, f"no {ENGINE_CORE_TITLE} under the watchdog"
        fault_t = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return fault_t
    raise ValueError(f"unknown fault {fault!r}; choose from {FAULTS}")


def _gone(procs: list[psutil.Process]) -> bool:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


async def completion_ok(session: aiohttp.ClientSession, base_url: str) -> bool:
    body = {"model": SERVED_MODEL, "prompt": "ping", "max_tokens": 1}
    try:
        timeout = aiohttp.ClientTimeout(total=5.0)
        url = f"{base_url}/v1/completions"
        async with session.post(url, json=body, timeout=timeout) as resp:
            doc = await resp.json(content_type=None) if resp.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc.get("choices"))


async def first_completion(base_url: str, timeout: float) -> float | None:
    """Wall-clock time of the first successful completion, polling every 0.5 s."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if await completion_ok(session, base_url):
                return time.time()
            await asyncio.sleep(0.5)
    return None


async def wait_progressing(sup: Supervised, load: StreamingLoad, timeout: float = 60.0) -> None:
    """The load streams and the watchdog's latest verdict is 'progressing'."""
    await load.wait_for(chunks=30, in_flight=3, timeout=timeout)
    if await wait_until(lambda: True if sup.state() == "progressing" else None, timeout) is None:
        raise AssertionError(f"watchdog says {sup.state()}, not progressing:\n{sup.log_tail()}")


def _stall_verdict(sup: Supervised, since: float) -> dict[str, Any] | None:
    return next((v for v in sup.verdicts(since) if v["state"] == "stalled"), None)


async def _await_verdict(sup: Supervised, fault: str, fault_t: float) -> dict[str, Any] | None:
    try:
        return await wait_until(lambda: _stall_verdict(sup, fault_t), STOPPED_BOUND_S)
    finally:
        if fault == "deadlock":
            # The blocked step stays blocked; the restarted engine must not block again.
            sup.trigger.unlink(missing_ok=True)


async def recover_from(sup: Supervised, fault: str, clients: int = 4) -> Recovery:
    """Inject ``fault`` under streaming load; measure until the engine serves again."""
    async with StreamingLoad(sup.base_url, clients=clients, model=SERVED_MODEL) as load:
        await wait_progressing(sup, load)
        old = sup.engine_procs()
        fault_t = await inject(sup, fault)
        load.stop_new()  # the population: requests in flight at the fault
        before = load.outcome()
        in_flight = load.in_flight
        verdict = await _await_verdict(sup, fault, fault_t)
        stopped = await wait_until(lambda: time.time() if _gone(old) else None, STOPPED_BOUND_S)
        served = await first_completion(sup.base_url, SERVED_BOUND_S) if stopped else None
        outcome = await load.stop(drain_s=DRAIN_S)
    if served is not None:
        await wait_until(lambda: _settled(sup, fault_t), SETTLED_BOUND_S)
    answered = outcome.completed + outcome.errored - before.completed - before.errored
    return Recovery(
        fault=fault,
        verdict=verdict,
        verdict_s=None if verdict is None else float(verdict["t"]) - fault_t,
        stopped_s=None if stopped is None else stopped - fault_t,
        served_s=None if served is None else served - fault_t,
        in_flight=in_flight,
        answered=answered,
        errored=outcome.errored - before.errored,
        outcome=outcome,
        actions=tuple(sup.actions(since=fault_t)),
        fault_t=fault_t,
    )


def _settled(sup: Supervised, fault_t: float) -> bool | None:
    """The watchdog judged the engine serving again after the fault's restart."""
    restarted = any(a["action"] == "restart" and a["result"] == "ok" for a in sup.actions(fault_t))
    serving = sup.state() in SERVING_STATES
    return True if restarted and serving else None
