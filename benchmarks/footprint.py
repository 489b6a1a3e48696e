"""Footprint of `watch` at 1 s intervals against a loaded simulator: CPU and peak RSS.

Run: .venv/bin/python -m benchmarks.footprint [--seconds 600] [--gpu] [--baseline DIR]
     [--nvml-only] [--serve]
The simulator and its streaming load run beside it; only the watch process is measured. The
watch process's CPU is also shown relative to the simulator's API process, measured over the
same window (a ratio is what survives a noisy machine). ``--gpu``: the simulator computes on
the GPU (``sim --gpu``: a CUDA process NVML lists), so the watch's NVML, GPM and GPU process
probes have real work each round. ``--baseline DIR``: also a watch run from another checkout's
code (``PYTHONPATH=DIR``, e.g. a ``git worktree`` of the commit before), against the same load
in the same window: a before/after that shares one machine's noise. ``--nvml-only``: each watch
sees the driver's NVML and not its CUDA library, as a container with
``NVIDIA_DRIVER_CAPABILITIES=utility`` does (the sidecar's setting, docs/kubernetes.md): a mount
namespace of its own (``unshare``, root or a user namespace) with libcuda's files bound to
/dev/null. Each watch's mapped NVIDIA libraries, threads and any "GPU probe off" line are
printed at the end: NVML in and libcuda out is what makes the run count. ``--serve``: each
watch also serves its own endpoints on loopback, and /metrics, /livez and /readyz are read every
second (a sidecar's Prometheus scrape and kubelet probes, at a faster rate than theirs);
otherwise ``--listen ''``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

from benchmarks.footprint_watch import proc_rollup
from engine_watchdog.sim.launcher import SimProcess, free_port
from engine_watchdog.sim.loadgen import StreamingLoad

WARMUP_S = 10.0
"""Start-up is not the steady state (with --gpu: the first GPM pair, NVML's own start)."""


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def libcuda_files() -> list[str]:
    """The CUDA driver library's real files, wherever the loader would find them."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10)
    dirs += [str(Path(line.split(" => ")[-1]).parent) for line in found.stdout.splitlines()]
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib"]
    paths = {str(Path(f).resolve()) for d in dirs for f in glob.glob(f"{d}/libcuda.so*")}
    return sorted(p for p in paths if os.path.isfile(p))


def without_libcuda(cmd: list[str]) -> list[str]:
    """``cmd`` in a mount namespace where libcuda's files read as empty (NVML then runs
    without it, as in a container given only the ``utility`` capability)."""
    files = libcuda_files()
    binds = "".join(f'mount --bind /dev/null "{f}" && ' for f in files)
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", *user, "--mount", "--", "sh", "-c", f'{binds}exec "$@"', "sh", *cmd]


@dataclass(frozen=True)
class Run:
    """What one benchmark run measures, and how."""

    seconds: float
    gpu: bool
    nvml_only: bool
    serve: bool
    """Each watch listens on loopback and is scraped every second (/metrics, /livez, /readyz),
    as a sidecar is by Prometheus and the kubelet; else ``--listen ''``."""
    logs: Path


@dataclass
class Watch:
    proc: asyncio.subprocess.Process
    log: Path
    port: int | None
    misses: int = 0
    """Answers of its own endpoints that were not 200."""


async def start_watch(url: str, code_root: str | None, run: Run, i: int) -> Watch:
    port = free_port() if run.serve else None
    listen = f"127.0.0.1:{port}" if port else ""
    cmd = [sys.executable, "-m", "engine_watchdog", "watch", url, "--listen", listen]
    cmd += ["--action", "none"]
    env = dict(os.environ)
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join([code_root, env.get("PYTHONPATH", "")])
    log = run.logs / f"watch{i}.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *(without_libcuda(cmd) if run.nvml_only else cmd), env=env, cwd=code_root,
            stdout=asyncio.subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    return Watch(proc, log, port)


async def scrape(session: aiohttp.ClientSession, watch: Watch) -> None:
    for path in ("/metrics", "/livez", "/readyz"):
        try:
            async with session.get(f"http://127.0.0.1:{watch.port}{path}") as resp:
                await resp.read()
                watch.misses += resp.status != 200
        except (aiohttp.ClientError, OSError):
            watch.misses += 1


def what_it_loaded(watch: Watch) -> str:
    """The watch's NVIDIA libraries, threads, high-water RSS since its start, and a "GPU probe
    off" line if it logged one."""
    pid = watch.proc.pid
    maps = Path(f"/proc/{pid}/maps").read_text()
    libs = sorted({Path(line.split()[-1]).name for line in maps.splitlines() if "/lib" in line})
    nvidia = [lib for lib in libs if "nvidia" in lib or "cuda" in lib] or ["none"]
    threads = len(os.listdir(f"/proc/{pid}/task"))
    hwm = proc_rollup(pid)["VmHWM"]
    lines = watch.log.read_text(errors="replace").splitlines()
    served = f"; own endpoints not 200: {watch.misses}" if watch.port else ""
    head = f"NVIDIA libraries: {', '.join(nvidia)}; threads {threads}"
    head += f"; high-water RSS since its start (VmHWM) {hwm:.1f} MB{served}"
    return head + "".join(f"; {line.strip()}" for line in lines if "probe off" in line)


async def window(run: Run, watches: list[Watch], api: psutil.Process) -> list[list[float]]:
    """The measured window: per watch its CPU share, the sim API's, peak RSS MB, window s."""
    procs = [psutil.Process(w.proc.pid) for w in watches]
    c0, a0, t0 = [cpu_s(p) for p in procs], cpu_s(api), time.monotonic()
    peak = [0.0] * len(procs)
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() - t0 < run.seconds:
            served = [scrape(session, w) for w in watches if w.port]
            await asyncio.gather(*served, asyncio.sleep(1))
            rss = [p.memory_info().rss / 2**20 for p in procs]
            peak = [max(m, r) for m, r in zip(peak, rss, strict=True)]
    wall = time.monotonic() - t0
    api_share = (cpu_s(api) - a0) / wall
    return [
        [(cpu_s(p) - c) / wall, api_share, m, wall] for p, c, m in zip(procs, c0, peak, strict=True)
    ]


async def measure(run: Run, roots: list[str | None]) -> list[list[float]]:
    """Per watch: CPU share of a core, the sim API's share, peak RSS MB, window s."""
    sim_args = ["--tokens-per-second", "30", *(["--gpu"] * run.gpu)]
    async with SimProcess(*sim_args, startup_timeout=120 if run.gpu else 20) as sim:
        watches = [await start_watch(sim.url, root, run, i) for i, root in enumerate(roots)]
        try:
            async with StreamingLoad(sim.url, clients=4, max_tokens=100, model="sim-model"):
                await asyncio.sleep(WARMUP_S)
                for w in watches:
                    if w.proc.returncode is not None:  # e.g. unshare refused: nothing to measure
                        tail = w.log.read_text(errors="replace").strip().splitlines()[-1:]
                        sys.exit(f"footprint: a watch ended at start ({w.proc.returncode}): {tail}")
                results = await window(run, watches, psutil.Process(sim.pid))
                for i, w in enumerate(watches):
                    print(f"watch {i}: {what_it_loaded(w)}")
                return results
        finally:
            for w in watches:
                os.killpg(w.proc.pid, signal.SIGTERM)
                await w.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--gpu", action="store_true", help="the simulator computes on the GPU")
    parser.add_argument("--baseline", help="also measure the watch of this checkout's code")
    parser.add_argument(
        "--nvml-only", action="store_true", help="each watch sees NVML but not libcuda (utility)"
    )
    parser.add_argument(
        "--serve", action="store_true", help="each watch serves its endpoints, scraped each second"
    )
    args = parser.parse_args()
    if args.nvml_only and shutil.which("unshare") is None:
        sys.exit("footprint: --nvml-only needs unshare (util-linux)")
    roots: list[str | None] = [None, *([args.baseline] if args.baseline else [])]
    with tempfile.TemporaryDirectory(prefix="footprint-") as logs:
        run = Run(args.seconds, args.gpu, args.nvml_only, args.serve, Path(logs))
        results = asyncio.run(measure(run, roots))
    head = ("watch", "window s", "watch CPU %", "sim API CPU %", "ratio", "peak RSS MB")
    print(f"{head[0]:>9} {head[1]:>9} {head[2]:>12} {head[3]:>14} {head[4]:>6} {head[5]:>12}")
    for name, (cpu, api, peak, wall) in zip(["this", "baseline"], results, strict=False):
        print(
            f"{name:>9} {wall:>9.0f} {cpu * 100:>12.2f} {api * 100:>14.2f} {cpu / api:>6.2f}"
            f" {peak:>12.1f}"
        )


if __name__ == "__main__":
    main()
