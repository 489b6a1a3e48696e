"""Where is it stuck: known frames, grouping, and summary.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.capture.frames import (
    ThreadStack,
    diagnose,
    group_threads,
    parse_threads,
    thread_label,
)
from engine_watchdog.capture.step import StepResult
from engine_watchdog.capture.summary import (
    SummaryInput,
    load_groups,
    proc_label,
    render_summary,
    source_reader,
    stuck_lines,
)
from engine_watchdog.core.model import Cause, ProcInfo, State, Verdict

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
CORE = ProcInfo(
    pid=100, ppid=1, role="engine-core", title="VLLM::EngineCore", state="sleeping", cpu_s=3.0
)


def fr(name: str, file: str = "", line: int = 0) -> dict[str, Any]:
    """A py-spy JSON frame: native when line is 0."""
    return {"name": name, "filename": file or "/usr/lib/libx.so", "line": line}


def thread(
    frames: list[dict[str, Any]], tid: int = 100, name: str = "MainThread", active: bool = False
) -> dict[str, Any]:
    return {"os_thread_id": tid, "thread_name": name, "active": active, "frames": frames}


VLLM_CORE = "/venv/vllm/v1/engine/core.py"
ENGINE_STEP = [
    fr("EngineCore.step", VLLM_CORE, 300),
    fr("EngineCore.run_busy_loop", VLLM_CORE, 800),
]
CUDA_SYNC = thread(
    [
        fr("0x7f00"),
        fr("cuCtxSynchronize_v2", "/usr/lib/libcuda.so"),
        fr("cudaDeviceSynchronize", "/usr/lib/libcudart.so"),
        fr("synchronize", "/venv/torch/cuda/__init__.py", 985),
        fr("GPUModelRunner.execute_model", "/venv/vllm/v1/worker/gpu_model_runner.py", 1200),
        *ENGINE_STEP,
    ]
)


def one(data: dict[str, Any], pid: int = 100) -> ThreadStack:
    return parse_threads([data], pid)[0]


@pytest.mark.parametrize(
    ("stack", "kind", "activity"),
    [
        (
            CUDA_SYNC,
            "cuda-sync",
            "waiting in cuCtxSynchronize_v2 in synchronize under execute_model",
        ),
        (
            thread(
                [
                    fr("ncclProxyProgress"),
                    fr("all_reduce", "/venv/torch/distributed/distributed_c10d.py", 2500),
                    *ENGINE_STEP,
                ]
            ),
            "collective",
            "in a collective (ncclProxyProgress) in all_reduce under engine step",
        ),
        (
            thread(
                [
                    fr("__lll_lock_wait"),
                    fr("PyThread_acquire_lock_timed"),
                    fr("EngineCore._step_with_lock", "/sim/engine.py", 40),
                    *ENGINE_STEP,
                ]
            ),
            "lock",
            "blocked acquiring a lock in _step_with_lock under engine step",
        ),
        (
            thread(
                [
                    fr("Condition.wait", "/py/threading.py", 320),
                    fr("Queue.get", "/py/queue.py", 171),
                ]
            ),
            "condition",
            "waiting on a condition in get",
        ),
        (
            thread(
                [
                    fr("Socket.recv_multipart", "/venv/zmq/sugar/socket.py", 800),
                    fr("EngineCoreProc.process_input_sockets", VLLM_CORE, 900),
                ]
            ),
            "zmq",
            "waiting for a message (zmq recv_multipart) in process_input_sockets",
        ),
        (
            thread(
                [
                    fr("epoll_wait"),
                    fr("select_epoll_poll_impl"),
                    fr("EpollSelector.select", "/py/selectors.py", 468),
                ]
            ),
            "io-wait",
            "waiting for I/O (epoll_wait) in select",
        ),
        (
            thread([fr("clock_nanosleep"), fr("time_sleep"), fr("main", "/app.py", 3)]),
            "sleep",
            "sleeping in main",
        ),
        (
            thread([fr("take_gil"), fr("PyEval_RestoreThread"), fr("f", "/app.py", 3)]),
            "gil",
            "waiting for the GIL in f",
        ),
        (thread([fr("matmul", "/app.py", 9)], active=True), "running", "running in matmul"),
        (
            thread(
                [
                    {
                        "name": "sock_call_ex",
                        "filename": "socketmodule.c",
                        "line": 921,
                        "module": "/py/lib-dynload/_socket.so",
                    },
                    fr("recv_into", "/py/socket.py", 9),
                ]
            ),
            "idle",
            "idle in recv_into",
        ),
        (thread([fr("0x1234")]), "idle", "idle"),
    ],
)
def test_diagnose_known_frames(stack: dict[str, Any], kind: str, activity: str) -> None:
    d = diagnose(one(stack))
    assert (d.kind, d.activity) == (kind, activity)


def test_python_only_stack_reads_the_source_line() -> None:
    th = one(json.loads((DATA / "pyspy_lock_nonblocking.json").read_text())[0])
    d = diagnose(th, lambda pid, file, line: "    LOCK.acquire()")
    assert d.kind == "lock" and "engine_step_blocked_on_lock" in d.activity
    assert "`LOCK.acquire()`" in d.activity
    assert diagnose(th).kind == "idle"  # without the source, no guessing


def test_real_native_dump_shows_the_blocked_frame() -> None:
    threads = parse_threads(json.loads((DATA / "pyspy_lock_native.json").read_text()), 12948)
    groups = group_threads(threads)
    assert thread_label(groups[0]) == "main thread"  # the main thread's group leads
    worker = groups[1]
    assert worker.diagnosis.kind == "lock"
    assert worker.diagnosis.activity == "blocked acquiring a lock in engine_step_blocked_on_lock"
    assert thread_label(worker) == 'thread "stuck-worker"'


def test_identical_stacks_are_grouped() -> None:
    same = CUDA_SYNC["frames"]
    threads = parse_threads(
        [
            thread(same, 100),
            *(thread(same, t, f"w{t}") for t in (7, 8, 9)),
            thread([fr("0x1")], 10, "other"),
        ],
        100,
    )
    groups = group_threads(threads)
    assert [g.count for g in groups] == [4, 1]
    assert thread_label(groups[0]) == '4 threads ("MainThread", "w7", "w8", ...)'


def test_parse_skips_junk() -> None:
    assert parse_threads({"not": "a list"}, 1) == []
    assert len(parse_threads([1, "x", {"frames": [3]}], 1)) == 1


def test_proc_labels() -> None:
    assert proc_label(CORE) == "EngineCore"
    dp = ProcInfo(
        pid=1, ppid=0, role="engine-core", title="VLLM::EngineCore_DP1", state="s", cpu_s=0
    )
    assert proc_label(dp) == "EngineCore_DP1"
    api = ProcInfo(pid=2, ppid=0, role="api-server", title="python -m vllm...", state="s", cpu_s=0)
    assert proc_label(api) == "API server"


def test_stuck_lines_lead_with_engine_core() -> None:
    groups = {100: group_threads(parse_threads([CUDA_SYNC], 100))}
    stopped = ProcInfo(
        pid=101, ppid=100, role="worker", title="VLLM::Worker_TP0", state="stopped", cpu_s=0
    )
    assert stuck_lines([CORE, stopped], groups) == [
        "EngineCore main thread waiting in cuCtxSynchronize_v2 in synchronize under execute_model",
        "Worker_TP0 (PID 101) is stopped",
    ]


def test_render_summary_has_verdict_threads_steps(tmp_path: Path) -> None:
    (tmp_path / "pyspy").mkdir()
    (tmp_path / "pyspy" / "100.json").write_text(json.dumps([CUDA_SYNC]))
    verdict = Verdict(
        t=1796018400.0,
        engine="0",
        state=State.STALLED,
        cause=Cause.GPU_SPIN,
        since=1796018390.0,
        seconds_without_progress=12.0,
        last_progress_t=1796018388.0,
        evidence=("GPU 0 util 100%, tensor 0%",),
    )
    timeline = [
        {"t": 1796018380.0, "state": "progressing"},
        {"t": 1796018390.0, "state": "stalled", "cause": "gpu-spin"},
    ]
    steps = [
        StepResult("py-spy", "ok", ("pyspy/100.json",), "100: ok", 0.4),
        StepResult("gpu", "not-available", (), "no NVML | fix: install", 0.0),
    ]
    info = SummaryInput(
        1796018401.0, "vllm", verdict, [CORE], steps, timeline, load_groups(tmp_path, [CORE])
    )
    md = render_summary(info)
    assert md.startswith("# vllm stalled (gpu-spin) at 2026-11-30 ")
    assert "- EngineCore main thread waiting in cuCtxSynchronize_v2" in md
    assert "cause `gpu-spin`" in md and "No progress for 12.0 s" in md
    assert "GPU 0 util 100%, tensor 0%" in md and "stalled gpu-spin" in md
    assert "| gpu | not-available | 0.00 s | no NVML \\| fix: install |" in md
    assert "<details><summary>stacks</summary>" in md


def test_summary_without_stacks_says_so() -> None:
    md = render_summary(SummaryInput(0.0, "vllm", None, [CORE], []))
    assert "No stacks were captured" in md and "On-demand capture" in md


def test_source_reader_goes_through_proc_root(tmp_path: Path) -> None:
    (tmp_path / "5" / "root" / "app").mkdir(parents=True)
    (tmp_path / "5" / "root" / "app" / "m.py").write_text("a = 1\nlock.acquire()\n")
    read = source_reader(tmp_path)
    assert read(5, "/app/m.py", 2) == "lock.acquire()"
    assert read(5, "/app/m.py", 9) is None
    assert read(5, "<string>", 1) is None
    assert read(6, "/app/m.py", 1) is None
