"""One tiny round of benchmarks/guard.py as a user runs it, for the tests that keep its modes
from rotting: its table, a row per proxy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUND_TIMEOUT_S = 120.0


def guard_round(*args: str) -> tuple[dict[str, list[str]], str]:
    """``python -m benchmarks.guard --seconds 1 --rounds 1 --rate 20 ARGS`` (exit 0 asserted):
    its table's rows by proxy name, and its whole output (for the assertion messages)."""
    argv = [sys.executable, "-m", "benchmarks.guard", "--seconds", "1", "--rounds", "1"]
    argv += ["--rate", "20", *args]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=ROUND_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    return {cells[1].strip(): cells for cells in rows[1:]}, out
