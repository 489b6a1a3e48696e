"""Device-only proof: our real GPU code against real stuck CUDA processes (not collected by pytest).

Run from the repository root on a machine with NVIDIA GPUs, nvidia-ml-py, CuPy, PyTorch and
(optionally) py-spy and cuda-gdb; docs/gpu-verification.md has the exact command and what it gave:

    PYTHONPATH=. python3 tests/gpu/verify_gpu.py spin|nccl|all --out DIR

``spin`` (1 GPU): a CUDA process stuck in a spinning kernel, started with the CUDA user-triggered
core dump variables; then GpuProbe samples, py-spy native stacks, the ``gpu`` capture step and
the (destructive) ``cuda-coredump`` step with its cuda-gdb summary; then a process that computes
and then sits idle holding its context, to check the other two classifications.
``nccl`` (2 GPUs): rank 0 in an all_reduce that rank 1 never joins (the NCCL recipe of
docs/gpu-verification.md), with the
flight recorder on; the same captures plus the ``flight-recorder`` step, then both ranks dumped.
Every wait is bounded and every child is killed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import glob
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from engine_watchdog.capture.cuda import CoreDumpSettings, make_cuda_coredump_step
from engine_watchdog.capture.flight_recorder import make_flight_recorder_step
from engine_watchdog.capture.gpu_state import make_gpu_step
from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult
from engine_watchdog.core.gpu_class import classify_gpu
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.probes.nvml import GpuProbe, load_nvml

CORE_ENV = {  # CUDA's user-triggered core dump (cuda-gdb docs)
    "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
    "CUDA_COREDUMP_PIPE": "/tmp/cuda_pipe_%p",
    "CUDA_COREDUMP_FILE": "/tmp/cuda_core_%p.nvcudmp",
    "CUDA_COREDUMP_GENERATION_FLAGS": "skip_nonrelocated_elf_images,skip_global_memory,"
    "skip_shared_memory,skip_local_memory,skip_constbank_memory",
}
# PyTorch's flight recorder, dumped through its pipe (torch/csrc/distributed/c10d/FlightRecorder)
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/nccl_pipe_",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/nccl_trace_rank_",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
SAFE_ENV = {  # the device notes: never NVLink multicast on shared hosts
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

SPIN_CHILD = r"""
import cupy as cp, os, sys, time
src = '''
extern "C" __global__ void spin(volatile int* flag, long long max_cycles) {
    long long start = clock64();
    while (*flag == 0 && (clock64() - start) < max_cycles) { }
}
'''
k = cp.RawKernel(src, "spin")
flag = cp.zeros(1, dtype=cp.int32)
rate = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000
k((132,), (128,), (flag, cp.int64(int(float(sys.argv[1]) * rate))))
print("READY pid", os.getpid(), flush=True)
def engine_step_wait():
    cp.cuda.runtime.deviceSynchronize()
engine_step_wait()
print("kernel finished", flush=True)
"""

COMPUTE_CHILD = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("READY", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("IDLE", flush=True)
time.sleep(float(sys.argv[2]))
"""

LOG: list[str] = []
LOG_FILE: list[Path] = []
"""Where say() appends as it goes, so a run cut short still brings its log back."""


def say(*parts: Any) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)
    for f in LOG_FILE:
        with f.open("a") as fh:
            fh.write(line + "\n")


def run(argv: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        return {
            "s": round(time.monotonic() - t0, 2),
            "rc": p.returncode,
            "out": p.stdout + p.stderr,
        }
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"s": round(time.monotonic() - t0, 2), "rc": None, "out": repr(e)}


def wait_for_line(log: Path, text: str, timeout: float, count: int = 1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and log.read_text(errors="replace").count(text) >= count:
            return True
        time.sleep(0.25)
    return False


def tool(name: str) -> str | None:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"))), None
    )
    return found or next(iter(glob.glob(f"/tmp/site/bin/{name}")), None)


def preflight() -> dict[str, Any]:
    info: dict[str, Any] = {"tools": {n: tool(n) for n in ("py-spy", "cuda-gdb", "nvidia-smi")}}
    info["nvidia_smi"] = run(["nvidia-smi", "-L"], 20)["out"].strip()
    info["python"] = sys.version.split()[0]
    for dist in ("torch", "cupy-cuda13x", "nvidia-ml-py"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    pyspy = info["tools"]["py-spy"]
    info["py_spy"] = run([pyspy, "--version"], 10)["out"].strip() if pyspy else None
    for k, v in info.items():
        say(f"[preflight] {k}: {v}")
    return info


def sample_gpus(probe: GpuProbe, n: int, gap: float, label: str) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        t0 = time.monotonic()
        readings = probe.read()
        took = round(time.monotonic() - t0, 3)
        for r in readings or ():
            g = r.info
            row = {
                "label": label,
                "i": i,
                "gpu": g.index,
                "class": classify_gpu(g),
                "util": g.util_pct,
                "power_w": g.power_w,
                "sm_clock": r.sm_clock_mhz,
                "gpm": r.gpm,
                "pids": list(g.pids),
                "sample_s": took,
            }
            out.append(row)
            say(f"[probe {label}] {json.dumps(row)}")
        time.sleep(gap)
    return out


def proc(pid: int, role: str = "engine-core") -> ProcInfo:
    return ProcInfo(pid, os.getpid(), role, f"verify-{role}", "running", 0.0)


def step_run(step: CaptureStep, ctx: CaptureContext) -> StepResult:
    async def go() -> StepResult:
        return await step(ctx)

    res = asyncio.run(go())
    say(f"[step {res.name}] {res.status} in {res.elapsed_s:.2f} s: {res.detail}")
    say(f"[step {res.name}] files: {list(res.files)}")
    return res


def show(path: Path, head: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else f"(missing: {path})"
    lines = text.splitlines()[:head]
    for line in lines:
        say(f"    | {line}")
    return "\n".join(lines)


def pyspy(pids: list[int], bundle: Path, tools: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "py-spy" not in tools:
        say("[py-spy] not installed")
        return out
    for pid in pids:
        res = run([tools["py-spy"], "dump", "--native", "--pid", str(pid)], 60)
        out[f"native_{pid}"] = res
        say(f"[py-spy --native {pid}] {res['s']} s rc {res['rc']}")
        for line in res["out"].splitlines()[:40]:
            say(f"    | {line}")
    try:  # the project's own py-spy step (capture/pyspy.py), when it is there
        from engine_watchdog.capture.pyspy import pyspy_step

        ctx = CaptureContext(bundle, tuple(proc(p) for p in pids), timeout_s=30, tools=tools)
        res_step = step_run(pyspy_step(), ctx)
        out["step"] = {
            "status": res_step.status,
            "s": res_step.elapsed_s,
            "detail": res_step.detail,
        }
    except ImportError as e:
        say(f"[py-spy step] not importable: {e}")
    return out


def finish(children: list[subprocess.Popen[bytes]], wait_s: float) -> list[int | None]:
    rcs = []
    for c in children:
        try:
            c.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait(timeout=10)
        rcs.append(c.returncode)
    return rcs


def verify_spin(out: Path, probe: GpuProbe, tools: dict[str, str]) -> dict[str, Any]:
    rep: dict[str, Any] = {}
    bundle = Path("/tmp/verify_spin_bundle")
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(mode=0o700)
    log = out / "spin_child.log"
    env = dict(os.environ, **CORE_ENV, CUDA_VISIBLE_DEVICES="0")
    t_start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", SPIN_CHILD, "120"],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    rep["child_pid"] = child.pid
    rep["ready"] = wait_for_line(log, "READY", 90)
    rep["ready_s"] = round(time.monotonic() - t_start, 1)
    say(f"[spin] child {child.pid} ready={rep['ready']} after {rep['ready_s']} s")
    time.sleep(2)
    rep["fds"] = {
        n: os.readlink(f"/proc/{child.pid}/fd/{n}") for n in os.listdir(f"/proc/{child.pid}/fd")
    }
    say(f"[spin] child fds: {rep['fds']}")
    rep["samples"] = sample_gpus(probe, 4, 0.5, "spin")
    rep["pyspy"] = pyspy([child.pid], bundle, tools)
    ctx = CaptureContext(bundle, (proc(child.pid),), timeout_s=20, tools=tools)
    rep["gpu_step"] = step_run(make_gpu_step(probe), ctx).status
    rep["gpu_txt"] = show(bundle / "gpu.txt")
    ctx = CaptureContext(bundle, (proc(child.pid),), destructive=True, timeout_s=60, tools=tools)
    rep["cuda_step"] = step_run(make_cuda_coredump_step(CoreDumpSettings()), ctx).__dict__
    rep["cuda_txt"] = show(bundle / "cuda" / f"{child.pid}.txt", 80)
    rep["child_rc"] = finish([child], 30)[0]
    say(f"[spin] child exit status {rep['child_rc']} (-6 = SIGABRT after the core dump)")
    rep["compute_then_idle"] = verify_compute_idle(out, probe)
    return rep


def verify_compute_idle(out: Path, probe: GpuProbe) -> list[dict[str, Any]]:
    log = out / "compute_child.log"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    child = subprocess.Popen(
        [sys.executable, "-c", COMPUTE_CHILD, "6", "8"],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    rows: list[dict[str, Any]] = []
    if wait_for_line(log, "READY", 90):
        time.sleep(1)
        rows += sample_gpus(probe, 3, 0.5, "compute")
    if wait_for_line(log, "IDLE", 30):
        time.sleep(1.5)
        rows += sample_gpus(probe, 2, 0.5, "idle-with-context")
    finish([child], 20)
    return rows


def worker(rank: int, device: int | None = None, elements: int = 1 << 20) -> None:
    """One rank: a warm-up all_reduce both join, then rank 0 alone in a second one. Each rank
    on GPU ``rank``, or all on GPU ``device`` (verify_nccl_one_gpu.py)."""
    # Only on the device, only in the worker; imported by name so that mypy needs no torch here.
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")

    gpu = rank if device is None else device
    torch.cuda.set_device(gpu)
    dist.init_process_group(
        "nccl",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
        device_id=torch.device(f"cuda:{gpu}"),
    )
    x = torch.ones(elements, device="cuda")
    dist.all_reduce(x)  # both join: warm-up
    torch.cuda.synchronize()
    print(f"rank {rank} warm all_reduce ok sum={float(x[0])}", flush=True)
    if rank == 0:
        dist.all_reduce(x)  # the peer never joins
        torch.cuda.synchronize()
        print("rank 0: all_reduce returned (unexpected)", flush=True)
    else:
        time.sleep(240)


def verify_nccl(out: Path, probe: GpuProbe, tools: dict[str, str]) -> dict[str, Any]:
    rep: dict[str, Any] = {}
    bundle = Path("/tmp/verify_nccl_bundle")
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(mode=0o700)
    env = dict(
        os.environ,
        **CORE_ENV,
        **SAFE_ENV,
        MASTER_ADDR="127.0.0.1",
        **FLIGHT_RECORDER_ENV,
        MASTER_PORT="29533",
    )
    logs = [out / f"rank{r}.log" for r in range(2)]
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(r)],
            env=env,
            stdout=logs[r].open("w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    pids = [p.pid for p in ranks]
    rep["pids"] = pids
    t0 = time.monotonic()
    rep["warm"] = all(wait_for_line(lg, "warm all_reduce ok", 120) for lg in logs)
    say(f"[nccl] ranks {pids} warm={rep['warm']} after {time.monotonic() - t0:.1f} s")
    time.sleep(3)
    procs = (proc(pids[0], "worker"), proc(pids[1], "worker"))
    rep["samples"] = sample_gpus(probe, 3, 0.5, "nccl")
    rep["pyspy"] = pyspy([pids[0]], bundle, tools)
    rep["gpu_step"] = step_run(
        make_gpu_step(probe), CaptureContext(bundle, procs, timeout_s=20)
    ).status
    rep["gpu_txt"] = show(bundle / "gpu.txt")
    fr = step_run(make_flight_recorder_step(), CaptureContext(bundle, procs, timeout_s=20))
    rep["fr_step"] = fr.__dict__
    show(bundle / "flight_recorder" / "index.json", 40)
    ctx = CaptureContext(bundle, procs, destructive=True, timeout_s=120, tools=tools)
    rep["cuda_step"] = step_run(make_cuda_coredump_step(CoreDumpSettings()), ctx).__dict__
    for pid in pids:
        rep[f"cuda_txt_{pid}"] = show(bundle / "cuda" / f"{pid}.txt", 60)
    rep["rc"] = finish(ranks, 30)
    say(f"[nccl] exit statuses {rep['rc']}")
    return rep


def pack(out: Path) -> None:
    """The bundles without the cores (too big to bring back; their sizes are in cores.json)."""
    with tarfile.open(out / "bundles.tar.gz", "w:gz") as tar:
        for b in ("/tmp/verify_spin_bundle", "/tmp/verify_nccl_bundle"):
            if Path(b).exists():
                tar.add(
                    b,
                    arcname=Path(b).name,
                    filter=lambda m: None if m.name.endswith(".nvcudmp") else m,
                )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["spin", "nccl", "all"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    LOG_FILE.append(args.out / "verify_log.txt")
    report: dict[str, Any] = {"preflight": preflight()}
    tools = {k: v for k, v in report["preflight"]["tools"].items() if v and k != "nvidia-smi"}
    probe = GpuProbe(load_nvml())
    t0 = time.monotonic()
    report["probe_start"] = {"reason": probe.start(), "s": round(time.monotonic() - t0, 3)}
    report["probe_notes"] = probe.notes
    say(f"[probe] start: {report['probe_start']} notes: {probe.notes}")
    try:
        if args.mode in ("spin", "all"):
            report["spin"] = verify_spin(args.out, probe, tools)
        if args.mode in ("nccl", "all"):
            report["nccl"] = verify_nccl(args.out, probe, tools)
    finally:
        report["xid_events"] = [e.__dict__ for e in probe.xid_events()]
        probe.close()
        (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        pack(args.out)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]))
    else:
        main()
