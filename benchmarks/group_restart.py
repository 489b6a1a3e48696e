"""One clean group restart, measured: for each of the simulator's rank faults, the whole path
as a user runs it (tests/tools/group_restart.py: 2 nodes x 2 ranks, the leader's ``run``, the
worker's ``peer``, real processes on loopback), the times from the fault to the stall verdict,
to a complete bundle and to the group restart's record, whether the culprit is the faulty rank
on its node, and what was left after it (rank processes, ``nccl-*`` segments of the old ranks).

    .venv/bin/python -m benchmarks.group_restart                 # 3 runs of each fault
    .venv/bin/python -m benchmarks.group_restart --runs 5 --faults rank-stop:2,rank-dead:3

The fault time is when the faulty rank's step counter reached the fault step, as its node
reports it (sampled every 0.25 s). The leader runs with --interval 0.5 --suspect-seconds 1
--stall-seconds 3 --startup-grace 1 --peer-deadline 8 --no-canary.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from tests.tools.group_restart import Outcome, run_scenario

FAULTS = ("rank-stop:2", "rank-skip:1", "rank-dead:3", "gpu-spin:0")


def right(out: Outcome, fault: str) -> bool:
    rank = int(fault.partition(":")[2])
    culprit = out.group["culprit"]
    return bool(
        culprit["rank"] == rank and culprit["node"] == f"127.0.0.1:{out.peer_ports[rank // 2]}"
    )


async def measure(fault: str, runs: int) -> str:
    outs = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="ew-group-restart-") as tmp:
            outs.append(await run_scenario(Path(tmp), fault))
    med = {k: statistics.median(o.times[k] for o in outs) for k in ("verdict", "bundle", "restart")}
    named = sum(right(o, fault) for o in outs)
    rules = ",".join(sorted({o.group["culprit"]["rule"] for o in outs}))
    clean = sum(o.restart["detail"].startswith("group stopped and clean") for o in outs)
    procs = sum(len(o.leaked_procs) for o in outs)
    shm = sum(len(o.leaked_shm) for o in outs)
    return (f"| {fault} | {named}/{runs} ({rules}) | {med['verdict']:.1f} | {med['bundle']:.1f} "
            f"| {med['restart']:.1f} | {clean}/{runs} | {procs} | {shm} |")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.group_restart")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args()
    print("| fault | culprit right (rule) | verdict s | bundle s | group restart s "
          "| clean record | procs left | shm left |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for fault in args.faults.split(","):
        print(await measure(fault, args.runs), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
