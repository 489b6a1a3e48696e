"""benchmarks/timers.py keeps its shape at a fifth of full length: through the guard the frozen
streams get the error event, no healthy stream is cut and the keepalive-only stream is caught;
through nginx with proxy_read_timeout 60 s (scaled: 12 s) the 90 s prefill (18 s) is cut and the
keepalive-only stream is never caught. Every duration of the run, the guard's settings included,
is scaled by the same factor (docs/performance.md, "Stalls against fixed timers"). Skipped, with
the reason, where nginx cannot be installed. And ``--freezes``: each freeze answered, the long
prefill and the slow stream beside them never stalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import proxy_peers

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.2


def run_bench(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """The benchmark as a user runs it (its own process group, killed if it overruns): its
    stdout and its JSON."""
    out_json = tmp_path / "timers.json"
    argv = [sys.executable, "-m", "benchmarks.timers", *args, "--json", str(out_json)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    doc: dict[str, Any] = json.loads(out_json.read_text())
    return out, doc


def test_the_guard_answers_what_a_byte_timer_cuts_or_misses(tmp_path: Path) -> None:
    try:
        proxy_peers.ensure_installed(("nginx",))
    except (proxy_peers.Missing, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"nginx not installable here: {exc}")
    out, doc = run_bench(tmp_path, "--scale", str(SCALE), "--paths", "guard,nginx-60")
    assert "| guard |" in out and "| nginx-60 |" in out, out[-3000:]
    rows = doc["summary"]
    guard, nginx = rows["guard"], rows["nginx-60"]
    assert guard["frozen_answered"] == guard["frozen"] > 0, guard
    assert guard["frozen_outcomes"] == ["error-event"], guard
    # the freeze answered well before nginx's timer would have (60 s at scale 1: 12 s)
    assert max(guard["frozen_answer_s"]) < 60 * SCALE / 2, guard
    assert guard["healthy_cut"] == [] and guard["healthy"] == 4, guard
    assert guard["keepalive_never_caught"] == 0 < guard["keepalive_only"], guard
    assert guard["new_outcomes"] == ["status-503"], guard
    assert nginx["healthy_cut"] == ["prefill-nginx-60"], nginx
    assert nginx["keepalive_never_caught"] == nginx["keepalive_only"] > 0, nginx
    assert min(nginx["frozen_answer_s"]) >= 60 * SCALE * 0.9, nginx


def test_freezes_are_answered_and_the_quiet_cases_never_stalled(tmp_path: Path) -> None:
    out, doc = run_bench(tmp_path, "--freezes", "2", "--scale", "0.3")
    assert "2 freezes: freeze to answer" in out, out[-3000:]
    assert len(doc["delays_s"]) == 2 and max(doc["delays_s"]) < 60 * 0.3 / 2, doc
    assert doc["false_stalls"] == {"prefill": 0, "slow": 0} and doc["healthy_cut"] == [], doc
