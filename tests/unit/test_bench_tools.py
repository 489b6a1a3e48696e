"""The guard benchmark's helpers keep working: the in-process hot path relays and counts every
event it is fed (benchmarks/hot_path.py), and a py-spy profile's summary leaves a waiting loop
and parked threads out of the busy samples (benchmarks/profile.py); the footprint's NVML-only
watch is the measured process itself and reads libcuda's files as empty
(benchmarks/footprint.py); the scale benchmark's clients count every event and its latency
however a proxy cuts the bytes, and their histogram's percentiles are within a bin of the
truth (benchmarks/streams.py)."""

from __future__ import annotations

import asyncio
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import footprint, hot_path, profile, streams

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


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_the_nvml_only_watch_is_the_measured_process_and_sees_libcuda_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "libcuda.so.580.1"
    lib.write_bytes(b"\x7fELF" + bytes(4096))
    monkeypatch.setattr(footprint, "libcuda_files", lambda: [str(lib)])
    probe = f"import os; print(os.getpid(), os.path.getsize({str(lib)!r}))"
    cmd = footprint.without_libcuda([sys.executable, "-c", probe])
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.communicate(timeout=30)
    if child.returncode != 0 and err.startswith("unshare:"):
        pytest.skip(f"no mount namespace here: {err.strip()}")
    assert child.returncode == 0, err
    pid, size = map(int, out.split())
    assert pid == child.pid  # psutil measures the watch, not a wrapper around it
    assert size == 0  # the loader would find an empty file: NVML runs without libcuda
    assert lib.stat().st_size == 4100  # outside the namespace, nothing changed


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


async def test_the_clients_count_every_event_however_the_bytes_are_cut() -> None:
    sent = 1000.0
    event = b'data: {"id":"cmpl-1","choices":[{"text":" a"}],"sim_t":%.6f}\n\n'
    events = [event % (sent + i) for i in range(6)]
    # One event a chunk (vLLM), two in one chunk, one cut across two chunks (a proxy's joins).
    body = chunked(events[0], events[1] + events[2], events[3][:20], events[3][20:], *events[4:])
    body = chunked(b": keepalive\n\n")[:-5] + body  # a comment first: not an event
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
    rng = random.Random(1)
    for _ in range(20):
        run = streams.Run(0.0, math.inf, streams.Seen(), freeze_at=0.0)  # one request only
        client = streams.Client(run, b"")
        client.sent_t = sent - 1.0
        at = 0
        while at < len(wire):
            cut = rng.randint(1, 40)
            client.now = sent + 10.0  # each arrival 10 s after its stamp's base
            client.parser.feed_data(wire[at : at + cut])
            at += cut
        assert run.seen.events == 6
        assert run.seen.first == [pytest.approx(11.0)]
        assert sum(run.seen.hist) == 6
        assert streams.percentile(run.seen.hist, 0.0) == pytest.approx(5.0, rel=0.01)
        assert streams.percentile(run.seen.hist, 1.0) == pytest.approx(10.0, rel=0.01)
        assert client.complete and run.seen.errors == 0


def test_a_histogram_percentile_is_within_its_bin() -> None:
    rng = random.Random(2)
    values = [rng.lognormvariate(-7, 1.5) for _ in range(20000)]  # around 1 ms, long tail
    hist = [0] * streams.N_BINS
    for v in values:
        streams.add_latency(hist, v)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        truth = ordered[int(q * len(ordered))]
        assert streams.percentile(hist, q) == pytest.approx(truth, rel=0.01)
