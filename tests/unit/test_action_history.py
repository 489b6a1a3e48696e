"""The action history on a real file system: a torn last line, bytes that are
not UTF-8, records that are not records, times that are not times, a directory at the path."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from engine_watchdog.core.settings import RateLimit
from engine_watchdog.recovery.history import ActionHistory, ActionRecord
from tests.tools.cli import run_cli_sync

LIMIT = RateLimit(max_restarts=3, window_s=3600.0, backoff_s=30.0)


def record(t: object, **fields: object) -> bytes:
    doc = {"t": t, "target": "t", "action": "restart", "result": "ok", "detail": "", **fields}
    return json.dumps(doc).encode()


def restarts(history: ActionHistory) -> list[ActionRecord]:
    return [r for r in history.records if r.action == "restart"]


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    """A watchdog killed mid-write (or a full disk) leaves half a line; the next restart must
    still be counted after a reload, or the rate limit forgets it."""
    path = tmp_path / "actions.jsonl"
    now = time.time()
    path.write_bytes(record(now - 100) + b"\n" + record(now - 50)[:17])
    ActionHistory(path).add(ActionRecord(now - 10, "t", "restart", "ok"))
    again = ActionHistory(path)
    assert [r.t for r in restarts(again)] == [now - 100, now - 10]
    assert path.read_bytes().endswith(b"\n")


def test_bad_records_are_skipped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "actions.jsonl"
    now = time.time()
    bad = [
        b"\xff\xfe\x00 not UTF-8",
        b"[1, 2]",
        b"{not json",
        record("yesterday"),
        b'{"t": Infinity, "target": "t", "action": "restart", "result": "ok"}',
        b'{"t": NaN, "target": "t", "action": "restart", "result": "ok"}',
        record(True),
        record(now - 5, target=["t"]),
    ]
    path.write_bytes(b"\n".join([record(now - 60), *bad, b"", record(now - 30)]) + b"\n")
    with caplog.at_level(logging.WARNING, logger="engine_watchdog.recovery.history"):
        history = ActionHistory(path)
    assert [r.t for r in history.records] == [now - 60, now - 30]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{len(bad)} unreadable records skipped" in warnings[0]


def test_a_time_that_is_a_string_is_skipped_not_a_crash_at_incident_time(tmp_path: Path) -> None:
    path = tmp_path / "actions.jsonl"
    path.write_bytes(record(str(time.time() - 10)) + b"\n")
    history = ActionHistory(path)
    assert history.restart_allowed("t", time.time(), LIMIT) == (True, "")


def test_a_time_in_the_future_does_not_block_restarts_for_good(tmp_path: Path) -> None:
    """A record 30 days ahead (a clock set wrong once) counts as 'now' at most: it is forgotten
    when the window has passed, instead of blocking restarts for 30 days."""
    path = tmp_path / "actions.jsonl"
    path.write_bytes(record(time.time() + 30 * 86400) + b"\n")
    history = ActionHistory(path)
    assert history.restart_allowed("t", time.time() + 10, LIMIT)[0] is False  # backoff
    assert history.restart_allowed("t", time.time() + LIMIT.window_s + 5, LIMIT) == (True, "")


def test_watch_refuses_a_directory_at_the_history_path_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "actions.jsonl").mkdir()
    ran = run_cli_sync(
        "watch", "http://127.0.0.1:9", "--incident-dir", str(tmp_path), "--listen", "",
        timeout=30,
    )  # fmt: skip
    assert ran.code == 64, ran.err
    assert "Traceback" not in ran.err
    errors = [line for line in ran.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ran.err.strip().endswith(errors[0]), ran.err
    assert "actions.jsonl" in errors[0] and "--incident-dir" in errors[0], errors
