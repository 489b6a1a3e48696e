"""benchmarks/guard.py --baseline cannot rot: the guard of another checkout's code (here this
checkout itself) runs beside the installed guard in one tiny round, and its row has events
and no errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_baseline_guard_runs_beside_the_guard() -> None:
    argv = [sys.executable, "-m", "benchmarks.guard", "--streams", "4", "--seconds", "1"]
    argv += ["--rounds", "1", "--rate", "20", "--baseline", str(ROOT)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    by_proxy = {cells[1].strip(): cells for cells in rows[1:]}
    assert set(by_proxy) == {"guard", "guard-baseline"}, out
    for cells in by_proxy.values():
        assert float(cells[4]) > 0, out  # proxied events/s
        assert cells[11].strip() == "0", out  # errors
