"""The bad-input corpus (tests/data/bad_input/cases.json), each case through the installed
console script as a user runs it: its own exit code and one line naming the fix, never a
traceback. A full disk is a real 64 KiB tmpfs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tools.cli import CONSOLE_SCRIPT, Ran, run_cli_sync

DATA = Path(__file__).resolve().parents[1] / "data" / "bad_input"
CASES: list[dict[str, Any]] = json.loads((DATA / "cases.json").read_text())["cases"]


def one_line_error(ran: Ran) -> None:
    """No traceback; every line on stderr is one log record or the final error."""
    assert "Traceback" not in ran.err, ran.err[-2000:]
    last = ran.err.strip().splitlines()[-1] if ran.err.strip() else ""
    if ran.code not in (0, 1):
        assert last.startswith("error: "), ran.err[-2000:]


def case_env(case: dict[str, Any], tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    if "kubectl" in case:
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        if case["kubectl"]:
            shutil.copy(DATA / case["kubectl"], bin_dir / "kubectl")
            env["PATH"] = f"{bin_dir}:{env['PATH']}"
        else:  # no kubectl at all (the console script names its Python by absolute path)
            env["PATH"] = str(bin_dir)
    return env


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input_case(case: dict[str, Any], tmp_path: Path) -> None:
    args = [a.format(data=DATA, tmp=tmp_path) for a in case["args"]]
    ran = run_cli_sync(*args, timeout=60, env=case_env(case, tmp_path))
    assert ran.code == case["exit"], f"exit {ran.code}: {ran.err[-2000:]}"
    one_line_error(ran)
    assert case.get("stderr", "") in ran.err, ran.err[-2000:]
    assert case.get("stdout", "") in ran.out, ran.out[-2000:]


@contextlib.contextmanager
def full_tmpfs(where: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled to the last byte; unmounted afterwards."""
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)]
    done = subprocess.run(mount, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        with contextlib.suppress(OSError), (where / "filler").open("wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10, check=False)


def test_capture_on_a_full_disk_exits_73_with_one_line(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with full_tmpfs(tmp_path / "disk") as disk:
            args = ["capture", "--pid", str(sleeper.pid), "--incident-dir", str(disk / "inc")]
            ran = run_cli_sync(*args, timeout=60)
            left = sorted(p.name for p in disk.rglob("*") if p.name != "filler")
    finally:
        sleeper.kill()
        sleeper.wait(10)
    assert ran.code == 73, ran.err
    one_line_error(ran)
    assert "no space left" in ran.err
    assert not [name for name in left if name.startswith(".tmp-")], left  # nothing partial


def test_record_on_a_full_disk_exits_73_and_watch_keeps_watching(tmp_path: Path) -> None:
    """A trace that cannot be written: ``record`` (whose output it is) fails with one line;
    ``watch --record`` says so once and goes on watching (its verdicts still print)."""
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    with full_tmpfs(tmp_path / "disk") as disk:
        base = ["http://127.0.0.1:9", "--interval", "0.5", "--json"]
        watch = subprocess.Popen(
            [str(CONSOLE_SCRIPT), "watch", *base, "--listen", "", "--action", "none",
             "--record", str(disk / "watch.jsonl")],
            stdout=out.open("wb"), stderr=err.open("wb"), start_new_session=True,
        )  # fmt: skip
        try:
            trace = str(disk / "record.jsonl")
            recorded = run_cli_sync("record", *base[:3], "--duration", "1", "-o", trace)
            deadline = time.monotonic() + 30
            while "recording stopped" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            # Rounds after the failure: its verdict still printed (the write failed before).
            while '"cause":"connection-refused"' not in out.read_text():
                assert time.monotonic() < deadline, "no verdict after the recording stopped"
                time.sleep(0.1)
            alive = watch.poll() is None
        finally:
            os.killpg(watch.pid, signal.SIGTERM)
            watch.wait(30)
    assert recorded.code == 73, recorded.err
    one_line_error(recorded)
    assert "the trace is incomplete" in recorded.err
    assert alive and watch.returncode == -signal.SIGTERM, err.read_text()[-2000:]
    assert err.read_text().count("recording stopped") == 1 and "Traceback" not in err.read_text()
    assert '"cause":"connection-refused"' in out.read_text()  # its verdict, printed all the same
