"""`check` decisions and the CLI's handling of bad input (one line, exit 64, no traceback)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from engine_watchdog.core.detector import TARGET
from engine_watchdog.core.model import Cause, State, Verdict
from engine_watchdog.runtime.check import EXIT_OK, EXIT_STALLED, EXIT_UNREACHABLE, decide

NEEDS_NO_TORCH = pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None, reason="PyTorch here: --gpu would run"
)


def v(
    state: State, engine: str = "0", cause: str | None = None, progress: float | None = None
) -> Verdict:
    why = None if cause is None else Cause(cause)
    return Verdict(1.0, engine, state, why, last_progress_t=progress)


def test_any_stalled_rank_decides_stalled() -> None:
    verdicts = {"0": v(State.PROGRESSING, progress=1.0), "1": v(State.STALLED, "1", "no-progress")}
    assert decide(verdicts, {}, False) == EXIT_STALLED


def test_progressing_needs_seen_movement() -> None:
    assert decide({"0": v(State.PROGRESSING)}, {}, False) is None
    assert decide({"0": v(State.PROGRESSING, progress=1.0)}, {}, False) == EXIT_OK


def test_idle_needs_two_rounds() -> None:
    assert decide({"0": v(State.IDLE)}, {"0": 1}, True) is None
    assert decide({"0": v(State.IDLE)}, {"0": 2}, True) == EXIT_OK
    # Idle without an answered canary is no evidence: a wedged core looks idle (case 5).
    assert decide({"0": v(State.IDLE)}, {"0": 2}, False) is None


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        ("connection-refused", EXIT_UNREACHABLE),
        ("no-engine-series", EXIT_UNREACHABLE),
        ("timeout", None),
    ],
)
def test_before_first_scrape_only_hopeless_errors_decide(cause: str, expected: int | None) -> None:
    assert decide({TARGET: v(State.STARTING, TARGET, cause)}, {}, False) == expected


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine_watchdog", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["check", "ftp://x"], "give one like http://127.0.0.1:8000"),
        (["check", "http://127.0.0.1:8000", "--interval", "0"], "--interval must be > 0"),
        (
            ["check", "http://127.0.0.1:8000", "--stall-seconds", "1.5", "--suspect-seconds", "1"],
            "twice --interval",
        ),
        (["watch", "http://127.0.0.1:8000", "--listen", "nope"], "host:port"),
        (["check", "--nope"], "No such option"),
        (["check"], "no target: give URL(s)"),
        pytest.param(["sim", "--gpu", "--port", "0"], "--gpu needs", marks=NEEDS_NO_TORCH),
        pytest.param(["demo", "--gpu"], "--gpu needs", marks=NEEDS_NO_TORCH),
    ],
)
def test_bad_input_is_one_line_and_exit_64(args: list[str], needle: str) -> None:
    proc = cli(*args)
    assert proc.returncode == 64, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_closed_port_exits_2_with_one_line() -> None:
    proc = cli("check", "http://127.0.0.1:9", "--timeout", "20")
    assert proc.returncode == 2
    assert proc.stdout.count("\n") == 1 and "connection-refused" in proc.stdout
