"""The guard benchmark's helpers keep working: the in-process hot path relays and counts every
event it is fed (benchmarks/hot_path.py), and a py-spy profile's summary leaves a waiting loop
and parked threads out of the busy samples (benchmarks/profile.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks import hot_path, profile

LOOP = "<module> (engine-watchdog:4);run_forever (loop.c:33192);uv__io_poll (linux.c:1)"
RAW = "\n".join(
    [
        f"{LOOP};epoll_wait (libc.so.6) 50",  # the loop waiting: idle
        "Thread._bootstrap (threading.py:1030);PyThread_acquire_lock_timed (python3.12);"
        "0x7ff4b4098e51 (libc.so.6) 30",  # an executor thread parked: idle
        f"{LOOP};EngineSide.data_received (engine_watchdog/guard/fast.py:131);write (libc.so.6) 6",
        f"{LOOP};EngineSide.data_received (engine_watchdog/guard/fast.py:131) 4",
    ]
)


def test_the_hot_path_counts_every_event_it_relays() -> None:
    us = asyncio.run(hot_path.per_event_us(hot_path.COMPLETION, events=2000, runs=1))
    assert 0 < us < 1000  # (it asserts inside that every event's token was counted)


def test_a_profile_summary_counts_busy_samples_only(tmp_path: Path) -> None:
    raw = tmp_path / "guard-256.txt"
    raw.write_text(RAW + "\n")
    text = profile.summary(raw, top=5)
    assert text.startswith("guard-256.txt: 10 busy samples")
    assert "60.0 %  write (libc.so.6)" in text
    assert "100.0 %  EngineSide.data_received (engine_watchdog/guard/fast.py)" in text
    assert "epoll_wait" not in text and "0x7ff4b4098e51" not in text
