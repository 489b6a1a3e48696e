"""Reading another process's environment, with real processes and the real setproctitle.

vLLM's engine cores and workers set their title with setproctitle, which zeroes
/proc/PID/environ. The CUDA core dump and flight recorder steps decide from the environment
whether an engine process can dump; they must still see what it inherited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine_watchdog.capture.cuda import discover
from engine_watchdog.capture.evidence import process_records
from engine_watchdog.capture.procfs import read_environ
from engine_watchdog.core.model import ProcInfo

# A parent (like vLLM's API server) starts a child that takes an engine title and waits.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(60)
"""
CHILD = """
import setproctitle, time
setproctitle.setproctitle("VLLM::EngineCore")
time.sleep(60)
"""


def test_a_titled_engine_process_keeps_the_environment_it_inherited(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1", "ENGINE_TEST_MARK": "42"}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        proc = Path("/proc")
        deadline = time.monotonic() + 10
        while not (proc / str(child) / "cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
            assert time.monotonic() < deadline, "the child never set its title"
            time.sleep(0.05)
        assert b"ENGINE_TEST_MARK" not in (proc / str(child) / "environ").read_bytes()
        assert read_environ(proc, child)["ENGINE_TEST_MARK"] == "42"
        info = ProcInfo(child, parent.pid, "engine-core", "VLLM::EngineCore", "sleeping", 0.0)
        _, skipped = discover(proc, [info])
        # It counts as enabled; what it lacks is CUDA itself, and the step says so.
        assert "not a CUDA process" in skipped[child], skipped
        record = process_records([info], proc)[0]
        assert record["environ_from_pid"] == parent.pid
        assert record["environ"]["ENGINE_TEST_MARK"] == "42"
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
