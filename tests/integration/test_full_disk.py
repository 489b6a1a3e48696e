"""A full disk may cost the bundle, never the restart: supervise mode with its
incident directory (bundles, the action history, the engine log) on a real 64 KiB tmpfs that is
already full."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_watchdog.sim.launcher import free_port
from tests.tools.run_mode import Watchdogs, keep_asking, sim_engine, starts
from tests.tools.watch import metric
from tests.waiting import eventually


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled to the last byte; unmounted afterwards, pass or fail."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)]
    ran = subprocess.run(cmd, capture_output=True, timeout=10, check=False)
    if ran.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {ran.stderr.decode().strip()}")
    try:
        with (mnt / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
            for _ in range(64):
                f.write(b"x" * 4096)
        with pytest.raises(OSError) as full:
            (mnt / "probe").write_bytes(b"x")
        assert full.value.errno == errno.ENOSPC
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10, check=False)


async def test_a_full_disk_costs_the_bundle_not_the_restart(
    tmp_path: Path, full_disk: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with Watchdogs(tmp_path) as dogs:
        run = await dogs.start(
            "run", url, "--incident-dir", str(full_disk), "--action", "capture,restart",
            "--stall-seconds", "4", "--startup-grace", "0", "--canary-timeout", "2",
            "--restart-backoff", "0", "--", *sim_engine(tmp_path, port, ["spin"]),
        )  # fmt: skip
        client = asyncio.create_task(keep_asking(port))
        try:
            await eventually(lambda: starts(tmp_path) >= 2, 60, 0.2, what="a restarted engine")
            assert starts(tmp_path) == 2
            await run.next_state("idle", timeout=30)  # the new engine serves
            text = await run.metrics()
        finally:
            client.cancel()
        log = run.log()
        assert "action restart: ok" in log, log[-4000:]
        assert "action capture: failed" in log and "no space left" in log
        assert log.count("cannot write the action history") == 1, log[-4000:]
        assert log.count("cannot write the engine log") == 1, log[-4000:]
        assert "Task exception was never retrieved" not in log and "Traceback" not in log
        errors = metric(text, "engine_watchdog_history_write_errors_total", target=url)
        assert errors is not None and errors >= 2, text  # the capture's and the restart's
        assert await dogs.stop(run) == -signal.SIGTERM  # ended, in order, by its SIGTERM
