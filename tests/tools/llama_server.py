"""Start, scrape and stop a REAL llama.cpp ``llama-server`` (loopback only), built by
tests/tools/llama_server_build.py, serving the tiny GGUF of tests/tools/make_tiny_gguf.py.

The server runs in its own process group, so that teardown reaches it (and anything it
started) even when a test SIGSTOPped it. It is started with ``--metrics --slots``, two slots
and two compute threads (ggml's OpenMP path: the stall shim of tests/data/llamacpp wraps it),
and, where a test asks, with that shim preloaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine_watchdog.sim.launcher import free_port
from tests.tools.server_process import ServerProcess
from tests.tools.vllm_server import http_get

SERVED_MODEL = "tiny"
READY_TIMEOUT_S = 60.0
TERM_TIMEOUT_S = 10.0
SHIM_SOURCE = Path(__file__).resolve().parents[1] / "data" / "llamacpp" / "stall_shim.c"
STALL_TRIGGER_ENV = "ENGINE_WATCHDOG_TEST_STALL_TRIGGER"
STALL_FRAME = "engine_watchdog_test_stall"
"""The shim's function the stalled inference thread waits in (its native stacks show it)."""
CC_TIMEOUT_S = 60.0
REPORT_LINES: list[str] = []
"""What each probe showed under each fault (tests/e2e/test_llamacpp.py); conftest prints them."""


class LlamaServerError(RuntimeError):
    """The server did not start or become ready; the message carries its log tail."""


@dataclass
class LlamaServer(ServerProcess):
    """A running llama-server."""


def server_argv(binary: Path, model: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    return [
        str(binary),
        "--model", str(model),
        "--alias", SERVED_MODEL,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--metrics",
        "--slots",
        "--parallel", "2",
        "--ctx-size", "4096",
        "--threads", "2",
        "--threads-http", "4",
        *extra,
    ]  # fmt: skip


def build_shim(out_dir: Path) -> Path:
    """Compile the stall shim (tests/data/llamacpp/stall_shim.c) into ``out_dir``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise LlamaServerError("no C compiler (cc) to build the stall shim: apt-get install gcc")
    out = out_dir / "libstall_shim.so"
    subprocess.run(  # fixed argv, no shell
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl", "-lpthread"],
        check=True,
        timeout=CC_TIMEOUT_S,
        capture_output=True,
    )
    return out


def server_env(shim: Path | None = None, trigger: Path | None = None) -> dict[str, str]:
    """The environment, with OpenMP's threads sleeping instead of spinning at their barriers:
    on these 2 shared cores, spinning compute threads made generation 17 times slower (50
    tokens in 3.7 s against 0.22 s with ``OMP_WAIT_POLICY=PASSIVE``)."""
    env = dict(os.environ)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    if shim is not None and trigger is not None:
        env["LD_PRELOAD"] = str(shim)
        env[STALL_TRIGGER_ENV] = str(trigger)
    return env


def launch(
    binary: Path, model: Path, log_path: Path, env: Mapping[str, str], extra: Sequence[str] = ()
) -> LlamaServer:
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    proc = subprocess.Popen(  # fixed argv, no shell
        server_argv(binary, model, port, extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
    )
    return LlamaServer(proc=proc, port=port, log_path=log_path, _log=log)


def wait_ready(server: LlamaServer, timeout: float = READY_TIMEOUT_S) -> None:
    """/health 200 (503 while the model loads) and /v1/models naming our alias."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise LlamaServerError(
                f"llama-server exited {server.proc.returncode}:\n{server.log_tail()}"
            )
        if http_get(f"{server.base_url}/health", timeout=2.0)[0] == 200:
            status, body = http_get(f"{server.base_url}/v1/models", timeout=2.0)
            if status == 200 and f'"{SERVED_MODEL}"' in body:
                server.startup_s = time.monotonic() - started
                return
        time.sleep(0.1)
    raise LlamaServerError(f"llama-server not ready after {timeout:.0f} s:\n{server.log_tail()}")


def stop(server: LlamaServer) -> None:
    """SIGCONT, SIGTERM, then SIGKILL after a bound, to the whole group; idempotent."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, sig)
    try:
        server.proc.wait(timeout=TERM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        server.proc.wait(timeout=TERM_TIMEOUT_S)
    if server._log is not None:
        server._log.close()
        server._log = None


def threads(pid: int) -> dict[int, str]:
    """TID -> thread name (comm) of a live process."""
    out: dict[int, str] = {}
    with contextlib.suppress(psutil.Error):
        for t in psutil.Process(pid).threads():
            with contextlib.suppress(OSError):
                out[t.id] = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
    return out
