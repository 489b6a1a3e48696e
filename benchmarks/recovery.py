"""Recovery time on a REAL vLLM (CPU) in supervise mode: fault -> stall verdict -> old engine
stopped -> first successful completion after the restart, with the client outcome counts.

    .venv/bin/python -m benchmarks.recovery [--runs 3] [--faults sigstop,deadlock,sigkill]

One ``engine-watchdog run ... -- <vLLM> --enable-scale-out`` for the whole measurement (the
harness of tests/tools/recovery_harness.py: ``--stall-seconds 20 --canary-timeout 25
--action capture,abort,restart --abort-grace 5 --restart-backoff 0``), the test plugin loaded
for the deadlock fault. Per run: 4 streaming clients, wait until the watchdog says progressing,
inject the fault (SIGSTOP or SIGKILL of ``VLLM::EngineCore``, or the plugin's deadlock), let the
clients issue no new request, and time everything from the fault; then wait until the watchdog
judges the restarted engine serving. Prints one line per run and a markdown table of medians.
Every process started here is killed on the way out, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.tools.recovery_harness import (  # noqa: E402
    FAULTS,
    Recovery,
    WatchdogOptions,
    recover_from,
    start_supervised,
    stop_supervised,
)
from tests.tools.vllm_env import ensure_vllm_env  # noqa: E402


def measure(faults: Sequence[str], runs: int, workdir: Path) -> list[Recovery]:
    """Every fault ``runs`` times (interleaved), on one supervised engine."""
    opts = WatchdogOptions(max_restarts=runs * len(faults) + 1)
    started = time.monotonic()
    sup = start_supervised(ensure_vllm_env(), workdir, opts)
    print(f"supervised vLLM serving in {time.monotonic() - started:.0f} s ({workdir})", flush=True)
    results: list[Recovery] = []
    try:
        for i in range(runs):
            for fault in faults:
                rec = asyncio.run(recover_from(sup, fault))
                results.append(rec)
                print(f"  run {i + 1}: {rec.line()}", flush=True)
                if rec.served_s is None:
                    raise RuntimeError(f"no recovery from {fault}:\n{sup.log_tail()}")
    finally:
        stop_supervised(sup)
    return results


def _median(values: Sequence[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    worst = f" (max {max(got):.1f})" if len(got) > 1 else ""
    return f"{statistics.median(got):.1f} s{worst}"


def table(results: Sequence[Recovery], faults: Sequence[str]) -> str:
    lines = [
        "| fault | runs | cause | to verdict | to engine stopped | to first completion "
        "| in flight | answered (errors) | hanging |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fault in faults:
        got = [r for r in results if r.fault == fault]
        if not got:
            continue
        causes = ", ".join(sorted({str(r.cause) for r in got}))
        in_flight = sum(r.in_flight for r in got)
        answered, errored = sum(r.answered for r in got), sum(r.errored for r in got)
        hanging = sum(r.outcome.hanging for r in got)
        lines.append(
            f"| {fault} | {len(got)} | {causes} | {_median([r.verdict_s for r in got])} "
            f"| {_median([r.stopped_s for r in got])} | {_median([r.served_s for r in got])} "
            f"| {in_flight} | {answered} ({errored}) | {hanging} |"
        )
    return "\n".join(lines)


def _as_json(rec: Recovery) -> dict[str, object]:
    o = rec.outcome
    return {
        "fault": rec.fault,
        "cause": rec.cause,
        "verdict_s": rec.verdict_s,
        "stopped_s": rec.stopped_s,
        "served_s": rec.served_s,
        "in_flight": rec.in_flight,
        "answered": rec.answered,
        "errored": rec.errored,
        "requests": {"started": o.started, "completed": o.completed, "errored": o.errored},
        "hanging": o.hanging,
        "actions": list(rec.actions),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fault")
    parser.add_argument("--faults", default="sigstop", help=f"comma list of {', '.join(FAULTS)}")
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(unknown)}")
    workdir = Path(tempfile.mkdtemp(prefix="recovery-bench-"))
    results = measure(faults, args.runs, workdir)
    if args.json:
        args.json.write_text(json.dumps([_as_json(r) for r in results], indent=2) + "\n")
    print(table(results, faults))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
