"""Start, find inside, scrape and stop a REAL vLLM OpenAI server on the CPU (loopback only).

The server runs in its own process group (``start_new_session``) so that teardown reaches the
API server, the engine core and the CPU worker at once, even when a test SIGSTOPped one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.sim.launcher import free_port
from tests.tools.server_process import ServerProcess
from tests.tools.vllm_env import VllmEnv, bytecode_env

SERVED_MODEL = "tiny"
ENGINE_CORE_TITLE = "VLLM::EngineCore"
READY_TIMEOUT_S = 180.0
TERM_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0

BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",  # the log file stays current for failure reports
}
# Variables of the project's venv that must not leak into the vLLM venv's interpreter.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")

# Servers started and not yet stopped; conftest prints their log tails when a test fails.
LIVE_SERVERS: list[VllmServer] = []
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "e2e" / "plugin"
PLUGIN_DIST = "engine_watchdog_test_plugin-0.1.0.dist-info"
PLUGIN_ENTRY = "engine_watchdog_test_deadlock = engine_watchdog_test_plugin:register"
STUCK_ENTRY = "engine_watchdog_test_stuck = engine_watchdog_test_plugin.stuck:register"
STUCK_MARKER_ENV = "ENGINE_WATCHDOG_TEST_STUCK_MARKER"
TRIGGER_ENV = "ENGINE_WATCHDOG_TEST_DEADLOCK_TRIGGER"
DEADLOCK_FRAME = "_engine_watchdog_test_deadlock"


class VllmServerError(RuntimeError):
    """The server did not start or become ready; the message carries its log tail."""


@dataclass
class VllmServer(ServerProcess):
    """A running vLLM server."""

    api_key: str | None = None
    """The server was started with ``--api-key`` this key (its /v1 routes want it)."""

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def engine_core_pids(self) -> list[int]:
        """PIDs whose process title starts with ``VLLM::EngineCore`` (one per DP rank)."""
        return [p.pid for p in self.descendants() if process_title(p).startswith(ENGINE_CORE_TITLE)]


def process_title(proc: psutil.Process) -> str:
    """The title setproctitle gave (it rewrites the command line), else the process name."""
    try:
        cmdline = proc.cmdline()
        return " ".join(cmdline).strip() if cmdline else proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def plugin_env(workdir: Path, trigger: Path) -> dict[str, str]:
    """Environment that loads the test plugin (tests/e2e/plugin, a ``vllm.general_plugins``
    entry point) into vLLM without pip or network: once ``trigger`` exists, the next engine
    step takes a lock it already holds and never returns (a real deadlock)."""
    dist = workdir / "plugin-dist" / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    meta = "Metadata-Version: 2.1\nName: engine-watchdog-test-plugin\nVersion: 0.1.0\n"
    (dist / "METADATA").write_text(meta)
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN_ENTRY}\n{STUCK_ENTRY}\n"
    )
    return {
        "PYTHONPATH": os.pathsep.join([str(dist.parent), str(PLUGIN_DIR)]),
        TRIGGER_ENV: str(trigger),
    }


def server_argv(env: VllmEnv, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """``--enforce-eager``: no torch.compile warm-up, which takes about half of a start on
    these 2 cores (43 s eager against 90 s compiled, measured side by side); what the tests
    prove (hangs, their detection, capture, recovery) does not depend on compiled steps."""
    return [
        str(env.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(env.model_dir),
        "--served-model-name", SERVED_MODEL,
        "--max-model-len", "2048",
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra_args,
    ]  # fmt: skip


def server_env(extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in bytecode_env(os.environ).items() if k not in DROPPED_ENV}
    env.update(BASE_ENV)
    env.update(extra_env or {})
    return env


def http_get(
    url: str, timeout: float = HTTP_TIMEOUT_S, headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """GET ``url`` (loopback); return (status, body), status 0 when nothing answered."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def launch_server(
    env: VllmEnv,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    api_key: str | None = None,
) -> VllmServer:
    """Start a server in its own process group, its output to ``log_path``; do not wait.
    With ``api_key``: ``--api-key`` it (vLLM then guards /v1 and /inference)."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    keyed = ["--api-key", api_key] if api_key else []
    proc = subprocess.Popen(  # fixed argv, no shell
        server_argv(env, port, [*extra_args, *keyed]),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=server_env(extra_env),
        cwd=log_path.parent,
        start_new_session=True,
    )
    server = VllmServer(proc=proc, port=port, log_path=log_path, api_key=api_key, _log=log)
    LIVE_SERVERS.append(server)
    return server


def start_server(
    env: VllmEnv,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    api_key: str | None = None,
) -> VllmServer:
    """Start a server and wait until it serves; on any failure stop it and raise with its log."""
    started = time.monotonic()
    server = launch_server(
        env, log_path, extra_args=extra_args, extra_env=extra_env, api_key=api_key
    )
    try:
        wait_ready(server, ready_timeout)
    except BaseException:
        stop_server(server)
        raise
    server.startup_s = time.monotonic() - started
    return server


def wait_ready(server: VllmServer, timeout: float) -> None:
    """Poll /health and /v1/models until both answer 200 with our model, or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = server.proc.poll()
        if rc is not None:
            raise VllmServerError(f"vLLM exited {rc} during start-up:\n{server.log_tail()}")
        health, _ = http_get(f"{server.base_url}/health")
        if health == 200:
            auth = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else None
            status, body = http_get(f"{server.base_url}/v1/models", headers=auth)
            if status == 200 and f'"{SERVED_MODEL}"' in body:
                return
        time.sleep(0.5)
    raise VllmServerError(
        f"vLLM not ready after {timeout:.0f} s on {server.base_url} (a loaded machine starts "
        f"slower; nothing else should run vLLM now):\n{server.log_tail()}"
    )


def _signal_all(pgid: int, procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for proc in procs:  # descendants that left the group (none expected) get it too
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


def stop_server(server: VllmServer) -> None:
    """SIGCONT, SIGTERM, then SIGKILL after a bound, to the whole tree; idempotent."""
    procs = [*server.descendants()]
    with contextlib.suppress(psutil.NoSuchProcess):
        procs.append(psutil.Process(server.pid))
    pgid = server.pid  # start_new_session: the leader's pid is the group id
    _signal_all(pgid, procs, signal.SIGCONT)
    _signal_all(pgid, procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=TERM_TIMEOUT_S)
    if alive or server.proc.poll() is None:
        _signal_all(pgid, [*alive, *server.descendants()], signal.SIGKILL)
        psutil.wait_procs(alive, timeout=KILL_TIMEOUT_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=KILL_TIMEOUT_S)
    if server._log is not None:
        server._log.close()
        server._log = None
    if server in LIVE_SERVERS:
        LIVE_SERVERS.remove(server)


def metric_sum(exposition: str, name: str, **labels: str) -> float:
    """Sum the samples named ``name`` (full sample name) whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def signal_pids(pids: Iterable[int], sig: signal.Signals, *, missing_ok: bool = False) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            if not missing_ok:
                raise


async def scrape(server: VllmServer) -> str:
    """GET /metrics off the event loop; fail unless it answers 200."""
    status, body = await asyncio.to_thread(http_get, f"{server.base_url}/metrics")
    if status != 200:
        raise AssertionError(f"/metrics answered {status}: {body[:300]}")
    return body


@contextlib.asynccontextmanager
async def engine_core_stopped(
    server: VllmServer, attempts: int = 5, settle_s: float = 1.0
) -> AsyncIterator[list[int]]:
    """SIGSTOP the engine core(s) while they hold running requests; SIGCONT on exit.

    A stop that lands between requests freezes ``vllm:num_requests_running`` at 0, which is
    not the seed's symptom: then resume, wait a moment and stop again (at most ``attempts``).
    """
    pids = server.engine_core_pids()
    if not pids:
        raise AssertionError(f"no {ENGINE_CORE_TITLE} among the server's descendants")
    try:
        for _ in range(attempts):
            signal_pids(pids, signal.SIGSTOP)
            await asyncio.sleep(settle_s)  # stats already sent reach the API server
            if metric_sum(await scrape(server), "vllm:num_requests_running") > 0:
                break
            signal_pids(pids, signal.SIGCONT)
            await asyncio.sleep(settle_s)
        else:
            raise AssertionError(f"engine core never held a running request in {attempts} tries")
        yield pids
    finally:
        signal_pids(pids, signal.SIGCONT, missing_ok=True)
