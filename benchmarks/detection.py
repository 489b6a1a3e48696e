"""Detection benchmark: every scenario of tests/data/traces/ through our detector (default
settings, with the trace's canaries and without them) and through the peers' rules
(benchmarks/peers.py). Prints one row per scenario: the detection latency from the fault, or
``never``, or, on a scenario that must never stall, ``ok`` / ``FALSE STALL``.

    .venv/bin/python -m benchmarks.detection [--markdown] [SCENARIO ...]

Our detector is fed the trace's observations in time order with each canary's send time, as the
watcher feeds them live (the product's own ``replay`` currently loses some: see docs/traces.md).
A peer slower than the recording is projected by holding the last observation of the hang (a
hung engine keeps serving the same frozen values; a scenario that lifts its hang is cut at that
mark first); such times carry a ``*``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.peers import PEERS, timeline
from engine_watchdog.core.detector import Detector, DetectorSettings
from engine_watchdog.core.model import CanaryObs, Observation, State
from engine_watchdog.engines import VLLM
from engine_watchdog.runtime.trace.format import decode

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
PROJECT_S = 900.0
"""How far past the fault a hung trace is projected for the slow peers."""
OURS = ("ours", "ours --no-canary", "ours, no guard")
"""With the trace's canaries; without them; without the guard's records (what the same run
would have given without the guard, on the scenarios recorded through one)."""
COLUMNS = (*OURS, *PEERS)
IN_PROCESS = "forward-300s"
KINDS = {"scrape": "m", "health": "h", "procs": "p", "canary": "c", "gpu": "g", "guard": "w"}


@dataclass(frozen=True)
class Result:
    """One detector or rule on one scenario."""

    t: float | None
    cause: str | None = None
    projected: bool = False


@dataclass
class Row:
    name: str
    expect: dict[str, Any]
    probes: str
    results: dict[str, Result] = field(default_factory=dict)

    @property
    def fault(self) -> bool:
        return not self.expect["never_stalled"]


def records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            float(rec["t"])
        except (ValueError, KeyError, TypeError):
            continue
        out.append(rec)
    return sorted(out, key=lambda r: float(r["t"]))


def observations(
    recs: Sequence[dict[str, Any]], canary: bool, guard: bool = True
) -> list[Observation]:
    """The observations in time order, as the watcher fed them live."""
    out = []
    for rec in recs:
        if (rec.get("kind") == "canary" and not canary) or (
            rec.get("kind") == "guard" and not guard
        ):
            continue
        obs = decode(rec, VLLM)
        if isinstance(obs, CanaryObs) and rec.get("sent_t") is not None:
            obs = replace(obs, sent_t=float(rec["sent_t"]))
        if obs is not None:
            out.append(obs)
    return out


def ours(recs: Sequence[dict[str, Any]], canary: bool, guard: bool = True) -> Result:
    detector = Detector(DetectorSettings())
    for obs in observations(recs, canary, guard):
        for change in detector.feed(obs):
            if change.new.state is State.STALLED:
                return Result(change.new.t, change.new.cause)
    return Result(None)


def run_scenario(name: str) -> Row:
    expect = json.loads((TRACES / f"{name}.expect.json").read_text(encoding="utf-8"))
    path = TRACES / f"{name}.jsonl"
    recs = records(path)
    kinds = {r.get("kind") for r in recs}
    row = Row(name, expect, "".join(v for k, v in KINDS.items() if k in kinds))
    row.results["ours"] = ours(recs, canary=True)
    row.results["ours --no-canary"] = ours(recs, canary=False)
    row.results["ours, no guard"] = ours(recs, canary=True, guard=False)
    end = hang_end(recs, expect["fault_t"]) if row.fault else None
    tl = timeline(path.read_text(encoding="utf-8").splitlines(), VLLM, before=end)
    until = expect["fault_t"] + PROJECT_S if row.fault else tl.end_t
    for peer, rule in PEERS.items():
        t = rule(tl, until)
        row.results[peer] = Result(t, projected=t is not None and t > tl.end_t)
    return row


def hang_end(recs: Sequence[dict[str, Any]], fault_t: float) -> float | None:
    """When the scenario lifted its hang: the first mark after the fault's, if any."""
    later = [float(r["t"]) for r in recs if r.get("kind") == "mark" and float(r["t"]) > fault_t]
    return min(later, default=None)


def cell(row: Row, column: str) -> str:
    r = row.results[column]
    cause = row.expect["first_stall_cause"]
    if column == IN_PROCESS and cause in ("stopped", "engine-dead"):
        return "never (stopped with it)" if cause == "stopped" else "n/a (process gone)"
    if r.t is None:
        return "ok" if not row.fault else "never"
    since = r.t - (row.expect["fault_t"] or first_t(row))
    if not row.fault or since < 0:
        return f"FALSE STALL at {since:+.0f} s" + _cause(r, None)
    return f"{since:.0f} s{'*' if r.projected else ''}" + _cause(r, cause)


def _cause(r: Result, expected: str | None) -> str:
    return f" ({r.cause})" if r.cause and r.cause != expected else ""


def first_t(row: Row) -> float:
    recs = records(TRACES / f"{row.name}.jsonl")
    return float(recs[0]["t"]) if recs else 0.0


def summary(rows: list[Row], column: str) -> str:
    faults = [r for r in rows if r.fault]
    latencies = []
    for r in faults:
        res = r.results[column]
        if res.t is not None and res.t >= r.expect["fault_t"] and not _moot(r, column):
            latencies.append(res.t - r.expect["fault_t"])
    false = sum(1 for r in rows if _false(r, column))
    median = f"median {statistics.median(latencies):.0f} s" if latencies else "-"
    return f"{len(latencies)}/{len(faults)} caught, {median}, {false} false"


def _moot(row: Row, column: str) -> bool:
    return column == IN_PROCESS and row.expect["first_stall_cause"] in ("stopped", "engine-dead")


def _false(row: Row, column: str) -> bool:
    t = row.results[column].t
    return t is not None and (not row.fault or t < row.expect["fault_t"])


def expected(row: Row) -> str:
    e = row.expect
    if not row.fault:
        return "never stalled"
    lo, hi = e["first_stall_within_s"]
    return f"{e['first_stall_cause']} in {lo:.0f}-{hi:.0f} s"


def table(rows: list[Row], markdown: bool) -> str:
    head = ["scenario", "source", "probes", "expected", *COLUMNS]
    body = [
        [r.name, r.expect["source"], r.probes, expected(r), *(cell(r, c) for c in COLUMNS)]
        for r in rows
    ]
    body.append(
        ["**summary**" if markdown else "summary", "", "", "", *(summary(rows, c) for c in COLUMNS)]
    )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join([*lines, *("| " + " | ".join(b) + " |" for b in body)])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(x[i].ljust(widths[i]) for i in range(len(head))) for x in [head, *body]
    )


def scenario_names(selected: Sequence[str]) -> list[str]:
    names = sorted(p.name.removesuffix(".expect.json") for p in TRACES.glob("*.expect.json"))
    return [n for n in names if not selected or n in selected]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Detection latency and false stalls per scenario.")
    parser.add_argument("names", nargs="*", help="scenarios (default: all)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    rows = [run_scenario(n) for n in scenario_names(args.names)]
    print(table(rows, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
