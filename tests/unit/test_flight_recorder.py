"""The flight-recorder step on a fake /proc with real FIFOs that a fake rank thread reads."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from pathlib import Path

from engine_watchdog.capture.flight_recorder import (
    find_ranks,
    fr_config,
    make_flight_recorder_step,
)
from engine_watchdog.capture.step import CaptureContext
from engine_watchdog.core.model import ProcInfo


def fake_proc(proc_root: Path, pid: int, env: dict[str, str], cwd: Path) -> Path:
    d = proc_root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "root").symlink_to("/")
    (d / "cwd").symlink_to(cwd)
    return d


def proc(pid: int, role: str = "worker") -> ProcInfo:
    return ProcInfo(pid, 1, role, "VLLM::Worker_TP0", "running", 1.0)


def test_config_names() -> None:
    assert fr_config({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"}) is None  # no trace buffer
    assert fr_config({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}) is None  # no pipe
    cfg = fr_config({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"})
    assert cfg is not None and cfg.dump_prefix == "/tmp/nccl_trace_rank_"
    cfg = fr_config(
        {
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "bad",
            "TORCH_FR_BUFFER_SIZE": "5",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "p_",
            "TORCH_FR_DUMP_TEMP_FILE": "/d/fr_",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/old_",
        }
    )
    assert cfg is not None and (cfg.buffer_size, cfg.dump_prefix) == (5, "/d/fr_")


def fake_rank(pipe: Path, dump: Path, ready: threading.Event, delay: float) -> None:
    """Like ProcessGroupNCCL: holds its pipe open (O_NONBLOCK); on a byte, dumps after a delay."""
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    ready.set()
    try:
        r, _, _ = select.select([fd], [], [], 5.0)
        if not r or not os.read(fd, 128):
            return
    finally:
        os.close(fd)
    time.sleep(delay)
    dump.write_bytes(b"\x80\x02}q\x00.")  # a pickle, as the flight recorder writes


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{tmp_path}/nccl_pipe_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{tmp_path}/nccl_trace_rank_",
    }


async def test_two_ranks_dumped_and_copied(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"old dump")  # from before: must not count
    threads, readies = [], []
    for pid, rank in ((200, 0), (201, 1)):
        d = fake_proc(proc_root, pid, env_for(tmp_path), tmp_path)
        pipe = tmp_path / f"nccl_pipe_{rank}.pipe"
        os.mkfifo(pipe)
        (d / "fd" / "40").symlink_to(pipe)
        ready = threading.Event()
        dump = tmp_path / f"nccl_trace_rank_{rank}"
        threads.append(
            threading.Thread(target=fake_rank, args=(pipe, dump, ready, 0.3 * (rank + 1)))
        )
        readies.append(ready)
    fake_proc(
        proc_root, 199, env_for(tmp_path), tmp_path
    )  # API server: env, but no pipe of its own
    for t, r in zip(threads, readies, strict=True):
        t.start()
        r.wait(5)
    ranks, _ = find_ranks(proc_root, [proc(199, "api-server"), proc(200), proc(201)])
    assert [(r.rank, r.pid) for r in ranks] == [(0, 200), (1, 201)]
    work = tmp_path / "bundle"
    work.mkdir()
    ctx = CaptureContext(workdir=work, procs=(proc(199), proc(200), proc(201)), timeout_s=8)
    res = await make_flight_recorder_step(proc_root)(ctx)
    for t in threads:
        t.join(5)
    assert res.status == "ok", res
    assert set(res.files) == {
        "flight_recorder/index.json",
        "flight_recorder/rank0_nccl_trace_rank_0",
        "flight_recorder/rank1_nccl_trace_rank_1",
    }
    assert (work / "flight_recorder" / "rank1_nccl_trace_rank_1").read_bytes().startswith(b"\x80")
    index = json.loads((work / "flight_recorder" / "index.json").read_text())
    assert [r["trigger"] for r in index["ranks"]] == ["ok", "ok"]
    assert 0.6 <= res.elapsed_s < 3


async def test_dump_that_never_comes_times_out(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    d = fake_proc(proc_root, 300, env_for(tmp_path), tmp_path)
    pipe = tmp_path / "nccl_pipe_3.pipe"
    os.mkfifo(pipe)
    (d / "fd" / "7").symlink_to(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never dumps
    try:
        ctx = CaptureContext(workdir=tmp_path, procs=(proc(300),), timeout_s=1.5)
        res = await make_flight_recorder_step(proc_root)(ctx)
    finally:
        os.close(reader)
    assert res.status == "timeout" and res.files == ("flight_recorder/index.json",)
    assert res.elapsed_s < 1.5


async def test_not_configured(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    fake_proc(proc_root, 1, {"PATH": "/bin"}, tmp_path)
    ctx = CaptureContext(workdir=tmp_path, procs=(proc(1),))
    res = await make_flight_recorder_step(proc_root)(ctx)

    assert res.status == "not-available" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in res.detail


async def test_an_environment_zeroed_by_setproctitle_is_named(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    fake_proc(proc_root, 5, {}, tmp_path)  # a titled rank, no ancestor's environment to read
    ctx = CaptureContext(workdir=tmp_path, procs=(proc(5),))
    res = await make_flight_recorder_step(proc_root)(ctx)

    assert res.status == "not-available" and "SPT_NOENV=1" in res.detail
