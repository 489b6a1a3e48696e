"""The CUDA core dump step on a fake /proc with a real FIFO and a fake driver thread."""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from pathlib import Path

from engine_watchdog.capture.cuda import CoreDumpSettings, discover, make_cuda_coredump_step
from engine_watchdog.capture.procfs import (
    expand_pattern,
    match_pattern,
    pattern_regex,
    read_environ,
    split_static,
)
from engine_watchdog.capture.step import CaptureContext
from engine_watchdog.core.model import ProcInfo

FAST = CoreDumpSettings(stable_s=0.2, poll_s=0.05)


def fake_proc(proc_root: Path, pid: int, ns_pid: int, env: dict[str, str], cwd: Path) -> Path:
    d = proc_root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{pid}\t{ns_pid}\n")
    (d / "stat").write_text(f"{pid} (python) S 1 2 3\n")
    (d / "root").symlink_to("/")
    (d / "cwd").symlink_to(cwd)
    return d


def proc(pid: int, role: str = "engine-core") -> ProcInfo:
    return ProcInfo(pid, 1, role, "VLLM::EngineCore", "running", 1.0)


def test_environ_and_patterns(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, 7, {"A": "1", "B": "x=y"}, tmp_path)
    assert read_environ(tmp_path, 7) == {"A": "1", "B": "x=y"}
    rx = pattern_regex("/tmp/core_%h_%t_%p.nvcudmp", 17)
    assert rx.fullmatch("/tmp/core_node-1_1796016666_17.nvcudmp")
    assert not rx.fullmatch("/tmp/core_node-1_1796016666_171.nvcudmp")
    assert pattern_regex("a%%b_%p", 3).fullmatch("a%b_3")
    assert expand_pattern("/tmp/corepipe.cuda.%h.%p", 17, "node") == "/tmp/corepipe.cuda.node.17"
    assert split_static("/tmp/x/core_%p/f") == ("/tmp/x", "core_%p/f")
    assert split_static("core.cuda.%h.%p") == (".", "core.cuda.%h.%p")
    (tmp_path / "d_17").mkdir()
    (tmp_path / "d_17" / "core.cuda.host.17").write_text("x")
    (tmp_path / "d_18").mkdir()
    assert match_pattern(tmp_path, "d_%p/core.cuda.%h.%p", 17) == [
        tmp_path / "d_17" / "core.cuda.host.17"
    ]


def test_an_environ_zeroed_by_setproctitle_is_read_from_the_parent(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, 7, {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1"}, tmp_path)
    child = fake_proc(tmp_path, 8, 8, {}, tmp_path)
    (child / "environ").write_bytes(b"\0" * 64)  # what setproctitle leaves
    (child / "status").write_text("Name:\tVLLM::EngineCor\nPPid:\t7\nNSpid:\t8\n")
    assert read_environ(tmp_path, 8) == {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1"}
    (tmp_path / "7" / "environ").write_bytes(b"")  # nothing to inherit either: empty
    assert read_environ(tmp_path, 8) == {}


async def test_not_destructive_does_nothing(tmp_path: Path) -> None:
    step = make_cuda_coredump_step(FAST)
    res = await step(CaptureContext(workdir=tmp_path, procs=(proc(1),)))
    assert res.status == "not-available" and "restart" in res.detail and not res.files


async def test_not_enabled_names_the_variables(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    fake_proc(proc_root, 100, 100, {"PATH": "/bin"}, tmp_path)
    step = make_cuda_coredump_step(CoreDumpSettings(proc_root=proc_root))
    ctx = CaptureContext(workdir=tmp_path, procs=(proc(100),), destructive=True)
    res = await step(ctx)
    assert res.status == "not-available"
    assert "CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1" in res.detail


def test_api_server_without_pipe_is_skipped(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    env = {"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1", "CUDA_COREDUMP_PIPE": f"{tmp_path}/p_%p"}
    fake_proc(proc_root, 100, 100, env, tmp_path)
    targets, skipped = discover(proc_root, [proc(100, "api-server"), proc(404)])
    assert targets == [] and "not a CUDA process" in skipped[100] and skipped[404] == "process gone"


def fake_driver(pipe: Path, core: Path, proc_dir: Path, ready: threading.Event) -> None:
    """Like the CUDA driver: reads the pipe, writes the core in two parts, then the process dies."""
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    ready.set()
    try:
        r, _, _ = select.select([fd], [], [], 5.0)
        if not r or os.read(fd, 1) != b"1":
            return
    finally:
        os.close(fd)
    with core.open("wb") as f:
        f.write(b"\x7fELF" + b"\0" * 4096)
        f.flush()
        time.sleep(0.1)
        f.write(b"\0" * 4096)
    (proc_dir / "stat").write_text("100 (python) Z 1 2 3\n")


async def test_trigger_wait_and_summarise(tmp_path: Path) -> None:
    proc_root, cores = tmp_path / "proc", tmp_path / "cores"
    cores.mkdir()
    pipe = tmp_path / "cuda_pipe_17"
    os.mkfifo(pipe)
    env = {
        "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
        "CUDA_COREDUMP_PIPE": f"{tmp_path}/cuda_pipe_%p",
        "CUDA_COREDUMP_FILE": f"{cores}/cuda_core_%h_%p.nvcudmp",
    }
    d = fake_proc(proc_root, 100, 17, env, tmp_path)
    (d / "fd" / "9").symlink_to(pipe)  # the driver holds its FIFO open
    gdb = tmp_path / "cuda-gdb"
    gdb.write_text(f"#!{sys.executable}\nimport sys\nprint('ARGS', sys.argv[1:])\n")
    gdb.chmod(0o755)
    ready = threading.Event()
    core = cores / "cuda_core_node_17.nvcudmp"
    driver = threading.Thread(target=fake_driver, args=(pipe, core, d, ready))
    driver.start()
    ready.wait(5)
    work = tmp_path / "bundle"
    work.mkdir()
    ctx = CaptureContext(
        workdir=work,
        procs=(proc(100),),
        destructive=True,
        timeout_s=10,
        tools={"cuda-gdb": str(gdb)},
    )
    settings = CoreDumpSettings(proc_root=proc_root, stable_s=0.2, poll_s=0.05)
    res = await make_cuda_coredump_step(settings)(ctx)
    driver.join(5)
    assert res.status == "ok", res
    assert set(res.files) == {"cuda/100.txt", "cuda/cores.json", "cuda/100.nvcudmp"}
    assert res.elapsed_s < 5
    rec = json.loads((work / "cuda" / "cores.json").read_text())["targets"][0]
    assert rec["core_path"] == str(core) and rec["core_size"] == 8196 and rec["complete"]
    assert rec["pipe"] == str(pipe) and rec["ns_pid"] == 17 and rec["trigger"] == "ok"
    text = (work / "cuda" / "100.txt").read_text()
    assert "target cudacore" in text and "info cuda kernels" in text and "'bt'" in text
    assert (work / "cuda" / "100.nvcudmp").stat().st_size == 8196
    assert (work / "cuda" / "100.nvcudmp").stat().st_mode & 0o777 == 0o600


async def test_pipe_without_reader_is_reported(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    pipe = tmp_path / "cuda_pipe_5"
    os.mkfifo(pipe)
    env = {
        "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
        "CUDA_COREDUMP_PIPE": f"{tmp_path}/cuda_pipe_%p",
    }
    fake_proc(proc_root, 5, 5, env, tmp_path)  # no fd: found through the path; nobody reads it
    ctx = CaptureContext(workdir=tmp_path, procs=(proc(5),), destructive=True, timeout_s=2)
    res = await make_cuda_coredump_step(CoreDumpSettings(proc_root=proc_root))(ctx)
    assert res.status == "failed" and "No such device or address" in res.detail
