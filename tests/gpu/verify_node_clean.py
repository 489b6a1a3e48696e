"""Device-only proof: recovery/node_clean.py with the real NVML against real CUDA processes (not
collected by pytest). Run from the repository root on a machine with an NVIDIA GPU, PyTorch,
nvidia-ml-py and psutil (docs/multi-node.md has the command and what it gave)::

    PYTHONPATH=. python3 tests/gpu/verify_node_clean.py --out DIR

An "engine" (its own session) starts a worker that takes a CUDA context; a bystander of the same
UID, in a session of its own, takes one too. The engine's main process is killed (the group's
stop), the worker survives it, reparented. ``clean_node`` must end the worker, whose GPU NVML
lists, and leave the bystander on its GPU. Every child is killed at the end; every wait bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pynvml

from engine_watchdog.host.proclist import PsutilProcesses
from engine_watchdog.recovery.node_clean import EngineRef, clean_node

HOLDER = (
    "import time, torch\n"
    "x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize()\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
ENGINE = (
    "import subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=sys.stdout)\n"
    "print('worker', w.pid, flush=True)\n"
    "time.sleep(600)\n"
)
WAIT_S = 120.0


def gpu_pids() -> set[int]:
    pynvml.nvmlInit()
    try:
        pids: set[int] = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids
    finally:
        pynvml.nvmlShutdown()


def wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {WAIT_S:.0f} s")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="node-clean-out")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    kids: list[subprocess.Popen[str]] = []
    worker_pid = 0
    try:
        engine = spawn(kids, [sys.executable, "-c", ENGINE, HOLDER])
        bystander = spawn(kids, [sys.executable, "-c", HOLDER])
        said = [readline(engine), readline(engine), readline(bystander)]
        worker_pid = int(next(w.split()[1] for w in said if w.startswith("worker")))
        wait(lambda: {worker_pid, bystander.pid} <= gpu_pids(), "both on the GPU (NVML)")
        before = sorted(gpu_pids())
        procs = PsutilProcesses()
        table = procs.processes()
        ref = EngineRef(os.getuid(), (table[engine.pid],), frozenset({table[engine.pid].sid}))
        engine.kill()
        engine.wait(10)
        with tempfile.TemporaryDirectory() as shm:
            t0 = time.monotonic()
            report = clean_node(ref, procs, pynvml, Path(shm))
            took = time.monotonic() - t0
        after = sorted(gpu_pids())
        result = {
            "worker": worker_pid,
            "bystander": bystander.pid,
            "nvml_before": before,
            "nvml_after": after,
            "clean_node_s": round(took, 2),
            "report": report.as_dict(),
            "ok": worker_pid not in after and bystander.pid in after and report.clean,
        }
        (out / "node-clean-gpu.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] else 1
    finally:
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(kid.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            if worker_pid:
                os.kill(worker_pid, signal.SIGKILL)


def spawn(kids: list[subprocess.Popen[str]], argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    kids.append(proc)
    return proc


def readline(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()  # bounded: the holders print within seconds or die


if __name__ == "__main__":
    sys.exit(main())
