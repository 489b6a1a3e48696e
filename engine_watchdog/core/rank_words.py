"""The words of a culprit judgement: ranks, what they do, the evidence lines (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from engine_watchdog.core.collective_frames import collective_wait, innermost_python
from engine_watchdog.core.ranks import NodeReport, RankSample, RankState

GONE: dict[RankState, str] = {
    RankState.STOPPED: "stopped (SIGSTOP)",
    RankState.DEAD: "dead (its process is gone)",
    RankState.ZOMBIE: "a zombie (exited, not reaped)",
}
"""States in which a rank takes part in no collective any more, as the sentence says them."""
BUSY_PERCENT = 90.0
IDLE_PERCENT = 10.0
RANGE_FROM = 4
"""Consecutive ranks beyond this many are written as a range (``ranks 0-15``)."""


def busy(r: RankSample) -> bool:
    return r.gpu_util is not None and r.gpu_util >= BUSY_PERCENT


def idle(r: RankSample) -> bool:
    return r.gpu_util is not None and r.gpu_util <= IDLE_PERCENT


def who(r: RankSample) -> str:
    """``rank 1 on node worker-0 (GPU 1)``; a rank the node could not number by its PID."""
    name = f"rank {r.rank}" if r.rank >= 0 else f"PID {r.pid}"
    gpu = f" (GPU {r.gpu})" if r.gpu is not None else ""
    return f"{name} on node {r.node}{gpu}"


def ranks_text(ranks: Sequence[RankSample]) -> str:
    """``rank 0``, ``ranks 0, 2, 3``, ``ranks 0-15``; unnumbered ones by PID and node."""
    numbers = sorted({r.rank for r in ranks if r.rank >= 0})
    parts = _ranges(numbers)
    parts += [f"PID {r.pid} on node {r.node}" for r in ranks if r.rank < 0]
    noun = "rank" if len(ranks) == 1 else "ranks"
    return f"{noun} {', '.join(parts)}" if numbers else ", ".join(parts)


def _ranges(numbers: Sequence[int]) -> list[str]:
    if len(numbers) <= RANGE_FROM:
        return [str(n) for n in numbers]
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]


def doing(ranks: Sequence[RankSample], plural: bool) -> str:
    """What these ranks do, as a verb phrase: ``wait in all_reduce``, ``run``."""
    waits = {collective_wait(r.stacks[-1]) if r.stacks else None for r in ranks}
    if waits and None not in waits:
        names = ", ".join(sorted(w for w in waits if w))
        verb = "wait" if plural else "waits"
        return f"{verb} in {names}" if len(waits) == 1 else f"{verb} in collectives ({names})"
    states = sorted({r.state.value for r in ranks})
    if states == ["running"] or states == ["running", "sleeping"] or states == ["sleeping"]:
        return "run" if plural else "runs"
    return ("are " if plural else "is ") + " or ".join(states)


def others_doing(ranks: Sequence[RankSample], verb_plural: bool = True) -> str:
    """``ranks 0, 2, 3 wait in all_reduce``; with verb_plural False, ``all wait in ...``."""
    if not verb_plural:
        return "all " + doing(ranks, plural=True)
    return f"{ranks_text(ranks)} {doing(ranks, plural=len(ranks) != 1)}"


def rank_line(r: RankSample) -> str:
    """One rank's facts: state, PID, GPU and utilisation, samples, where it sits."""
    gpu = ""
    if r.gpu is not None:
        util = f" at {r.gpu_util:.0f} %" if r.gpu_util is not None else ""
        gpu = f", GPU {r.gpu}{util}"
    where = "no stack"
    if r.stacks:
        wait = collective_wait(r.stacks[-1])
        where = f"in {wait}" if wait else f"in {innermost_python(r.stacks[-1])}"
        moved = "moved" if len(set(r.stacks)) > 1 else "unchanged"
        where += f", {len(r.stacks)} samples, {moved}" if len(r.stacks) > 1 else ""
    name = f"rank {r.rank}" if r.rank >= 0 else "rank ?"
    return f"{name} on node {r.node} (PID {r.pid}{gpu}): {r.state.value}, {where}"


def evidence_lines(reports: Sequence[NodeReport]) -> tuple[str, ...]:
    """Every node's answer, one line per rank, and one line per node that did not answer."""
    out: list[str] = []
    for node in reports:
        if not node.answered:
            out.append(f"node {node.node} did not answer: {node.error or 'no reason given'}")
        elif not node.ranks:
            out.append(f"node {node.node} answered with no engine rank")
        out += [rank_line(r) for r in node.ranks] if node.answered else []
    return tuple(out)
