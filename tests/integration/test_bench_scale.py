"""benchmarks/scale.py cannot rot: one tiny load runs straight to the benchmark upstream and
through the guard (clients in two processes), every row has events and no errors, and the
guard's judging rounds were timed (benchmarks/guard_rounds.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.tools.bench import ROOT

TIMEOUT_S = 120.0


def test_a_tiny_load_runs_straight_and_through_the_guard(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "benchmarks.scale", "--steps", "16x20", "--proxies", "guard"]
    argv += ["--seconds", "1", "--client-procs", "2", "--upstream-procs", "1"]
    argv += ["--judge-streams", "16", "--out", str(tmp_path)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    rows = {row["proxy"]: row for row in json.loads((tmp_path / "scale.json").read_text())["rows"]}
    assert set(rows) == {"direct", "guard"}, out
    for row in rows.values():
        assert float(row["events/s"]) > 0, out
        assert row["errors"] == "0", out
    assert float(rows["guard"]["ratio to direct"]) > 0.5, out
    rounds = (tmp_path / "guard-rounds.txt").read_text().splitlines()
    assert rounds and all(len(line.split()) == 5 for line in rounds), rounds
    assert (
        "event loop"
        in json.loads((tmp_path / "scale.json").read_text())["setup"]["the guard's data path"]
    ), out
