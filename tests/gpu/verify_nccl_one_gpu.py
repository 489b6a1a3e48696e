"""Device-only: a real NCCL collective that a peer never joins, on a machine of ONE GPU (not
collected by pytest). docs/gpu-verification.md has the command and what it gave.

NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"), because it compares
each rank's host hash and bus ID. ``NCCL_HOSTID`` sets the host hash (NCCL's misc/utils.cc,
getHostHash), so each rank here gets its own: NCCL takes them for two hosts and joins them over
its socket transport on loopback. The GPU kernels of the two processes time-slice on the one
GPU. Rank 0 then enters an ``all_reduce`` that rank 1 never joins; its kernel waits on the GPU.
The watchdog's own CLI then captures both ranks (``capture --pid``: py-spy, NVML, the flight
recorder through PyTorch's dump pipe) and ``explain`` matches the bundle against the shipped
signatures. What it cannot show: two GPUs, one spinning while its peer idles (the x2 machine's
``verify_gpu.py nccl``).

    PYTHONPATH=. python3 tests/gpu/verify_nccl_one_gpu.py --out DIR

Every wait is bounded and both ranks are killed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from engine_watchdog.probes.nvml import GpuProbe, load_nvml
from tests.gpu.verify_gpu import (
    FLIGHT_RECORDER_ENV,
    LOG_FILE,
    SAFE_ENV,
    finish,
    preflight,
    run,
    sample_gpus,
    say,
    wait_for_line,
    worker,
)

INCIDENTS = Path("/tmp/nccl1_incidents")
MASTER_PORT = "29541"


def rank_env(rank: int) -> dict[str, str]:
    return dict(
        os.environ,
        **SAFE_ENV,
        **FLIGHT_RECORDER_ENV,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=MASTER_PORT,
        NCCL_HOSTID=f"verify-nccl-one-gpu-rank{rank}",  # two "hosts": no duplicate-GPU refusal
        NCCL_SOCKET_IFNAME="lo",
        NCCL_IB_DISABLE="1",
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,NET,ENV",
    )


def cli(*args: str, timeout: float) -> dict[str, Any]:
    res = run([sys.executable, "-m", "engine_watchdog", *args], timeout)
    say(f"[cli {args[0]}] rc {res['rc']} in {res['s']} s")
    for line in str(res["out"]).splitlines()[:80]:
        say(f"    | {line}")
    return res


def verify(out: Path, probe: GpuProbe) -> dict[str, Any]:
    rep: dict[str, Any] = {}
    shutil.rmtree(INCIDENTS, ignore_errors=True)
    logs = [out / f"rank{r}.log" for r in range(2)]
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(r)],
            env=rank_env(r),
            stdout=logs[r].open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for r in range(2)
    ]
    pids = [str(p.pid) for p in ranks]
    rep["pids"] = pids
    try:
        t0 = time.monotonic()
        rep["warm"] = all(wait_for_line(lg, "warm all_reduce ok", 150) for lg in logs)
        rep["warm_s"] = round(time.monotonic() - t0, 1)
        say(f"[nccl1] ranks {pids} warm={rep['warm']} after {rep['warm_s']} s")
        if not rep["warm"]:
            return rep
        time.sleep(4)  # rank 0 is in the second all_reduce by now
        rep["samples"] = sample_gpus(probe, 3, 0.5, "nccl1")
        args = ["--pid", pids[0], "--pid", pids[1], "--incident-dir", str(INCIDENTS)]
        rep["capture"] = cli("capture", *args, "--timeout", "40", "--json", timeout=150)
        bundles = sorted(INCIDENTS.glob("*/manifest.json"))
        if bundles:
            rep["explain"] = cli("explain", str(bundles[0].parent), "--json", timeout=60)
            rep["explain_text"] = cli("explain", str(bundles[0].parent), timeout=60)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
        rep["rc"] = finish(ranks, 20)
        say(f"[nccl1] exit statuses {rep['rc']}")
    return rep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    LOG_FILE.append(args.out / "verify_log.txt")
    report: dict[str, Any] = {"preflight": preflight()}
    probe = GpuProbe(load_nvml())
    report["probe_start"] = probe.start()
    try:
        report["nccl1"] = verify(args.out, probe)
    finally:
        probe.close()
        (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        with tarfile.open(args.out / "nccl1-bundle.tar.gz", "w:gz") as tar:
            if INCIDENTS.exists():
                tar.add(INCIDENTS, arcname="nccl1_incidents")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), device=0, elements=1 << 16)  # both ranks on the one GPU
    else:
        main()
