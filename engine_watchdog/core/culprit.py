"""Which node, rank and GPU stopped the group, and how sure that is (pure).

The leader reads every node's :class:`NodeReport` and asks :func:`name_culprit`. The rules,
strongest first, each naming one rank only when that one rank differs from all the others
(docs/multi-node.md, "The culprit"):

1. one rank stopped (SIGSTOP), dead or a zombie while the others run: high;
2. one rank outside the collective the others wait in, in every sample: high when two or more
   wait in the same collective and there are two samples or more, medium otherwise;
3. one GPU at ~100 % utilisation while the others sit at ~0 % (an NCCL kernel spinning):
   medium; one GPU idle while the others spin: low (the rank that never entered);
4. one rank's stack unchanged between samples while the others' move, the rank off the CPU
   and outside any collective: medium, low with a single other rank to compare;
5. one node that did not answer, the rest showing nothing: low;
6. else no culprit (Confidence.NONE), saying so.

Stacks alone are not enough under a jammed GPU queue: every host thread then sits in a
different kernel launch (vllm-project/vllm#51921), no rule 2 fires, and the GPUs (rule 3) tell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine_watchdog.core.collective_frames import collective_wait, innermost_python
from engine_watchdog.core.rank_words import (
    GONE,
    busy,
    evidence_lines,
    idle,
    others_doing,
    ranks_text,
    who,
)
from engine_watchdog.core.ranks import Confidence, Culprit, NodeReport, RankSample, RankState

Rule = Callable[[Sequence[RankSample]], "Culprit | None"]


def name_culprit(reports: Sequence[NodeReport]) -> Culprit:
    """The culprit the reports point to; Confidence.NONE when nothing tells one rank apart."""
    ranks = sorted((r for n in reports if n.answered for r in n.ranks), key=_order)
    silent = [n for n in reports if not n.answered]
    facts = evidence_lines(reports)
    for rule in RULES:
        found = rule(ranks) if len(ranks) >= 2 else None
        if found is not None:
            return _with(found, facts)
    if len(silent) == 1 and len(reports) >= 2:
        node = silent[0]
        why = f"node {node.node} did not answer" + (f" ({node.error})" if node.error else "")
        why += "; the ranks that answered show nothing that tells one of them apart"
        return _with(Culprit(Confidence.LOW, why, node=node.node, rule="node-silent"), facts)
    return _with(Culprit(Confidence.NONE, _nothing(ranks, silent), rule="none"), facts)


def _order(r: RankSample) -> tuple[int, str, int]:
    return (r.rank if r.rank >= 0 else 1 << 30, r.node, r.pid)


def _with(found: Culprit, facts: tuple[str, ...]) -> Culprit:
    return Culprit(
        found.confidence,
        found.why,
        found.node,
        found.rank,
        found.gpu,
        found.evidence + facts,
        pid=found.pid,
        rule=found.rule,
    )


def _blame(r: RankSample, confidence: Confidence, why: str, rule: str) -> Culprit:
    rank = r.rank if r.rank >= 0 else None
    return Culprit(confidence, why, r.node, rank, r.gpu, pid=r.pid, rule=rule)


def _one(ranks: Sequence[RankSample], odd: Callable[[RankSample], bool]) -> RankSample | None:
    """The one rank ``odd`` picks, when exactly one is picked and others are left."""
    picked = [r for r in ranks if odd(r)]
    return picked[0] if len(picked) == 1 and len(ranks) > 1 else None


def stopped_rule(ranks: Sequence[RankSample]) -> Culprit | None:
    bad = _one(ranks, lambda r: r.state in GONE)
    if bad is None:
        return None
    rest = [r for r in ranks if r is not bad]
    if not all(r.state in (RankState.RUNNING, RankState.SLEEPING) for r in rest):
        return None
    why = f"{who(bad)} is {GONE[bad.state]} while {others_doing(rest)}"
    return _blame(bad, Confidence.HIGH, why, "rank-stopped")


def outside_collective_rule(ranks: Sequence[RankSample]) -> Culprit | None:
    known = [r for r in ranks if r.stacks]
    # Every sample agrees: the odd rank outside each time, the others waiting each time (a
    # healthy group shows one rank late to the collective now and then, not sample after
    # sample).
    waits = {id(r): [collective_wait(s) for s in r.stacks] for r in known}
    odd = _one(known, lambda r: all(w is None for w in waits[id(r)]))
    if odd is None:
        return None
    rest = [r for r in known if r is not odd]
    if not all(all(waits[id(r)]) for r in rest):
        return None
    kinds = {w for r in rest for w in waits[id(r)]}
    sure = len(kinds) == 1 and len(rest) >= 2 and len(odd.stacks) >= 2
    where = innermost_python(odd.stacks[-1]) or "no frame"
    why = f"{who(odd)} is outside the collective (in {where}) while {others_doing(rest)}"
    confidence = Confidence.HIGH if sure else Confidence.MEDIUM
    return _blame(odd, confidence, why, "outside-collective")


def gpu_spin_rule(ranks: Sequence[RankSample]) -> Culprit | None:
    gpus = [r for r in ranks if r.gpu_util is not None]
    if len(gpus) < 2:
        return None
    hot = _one(gpus, busy)
    if hot is not None and all(idle(r) for r in gpus if r is not hot):
        rest = ranks_text([r for r in gpus if r is not hot])
        why = (
            f"{who(hot)} has its GPU at {hot.gpu_util:.0f} % utilisation while the GPUs of "
            f"{rest} sit at ~0 % (a kernel spinning, as an NCCL wait does)"
        )
        return _blame(hot, Confidence.MEDIUM, why, "gpu-spin")
    cold = _one(gpus, idle)
    if cold is not None and all(busy(r) for r in gpus if r is not cold) and len(gpus) >= 3:
        rest = ranks_text([r for r in gpus if r is not cold])
        why = (
            f"{who(cold)} has its GPU idle ({cold.gpu_util:.0f} %) while the GPUs of {rest} "
            "spin at ~100 % (waiting for a rank that never entered the collective)"
        )
        return _blame(cold, Confidence.LOW, why, "gpu-idle")
    return None


def stack_unchanged_rule(ranks: Sequence[RankSample]) -> Culprit | None:
    sampled = [r for r in ranks if len(r.stacks) >= 2]
    # A rank waiting in a collective is still by nature (a victim): only a still rank
    # elsewhere tells. A running rank's stack can repeat between two samples by chance (a
    # tight loop): only a rank blocked off the CPU counts.
    still = _one(
        sampled,
        lambda r: (
            len(set(r.stacks)) == 1
            and collective_wait(r.stacks[-1]) is None
            and r.state is not RankState.RUNNING
        ),
    )
    if still is None:
        return None
    rest = [r for r in sampled if r is not still]
    confidence = Confidence.MEDIUM if len(rest) >= 2 else Confidence.LOW
    why = (
        f"{who(still)} kept the same stack over {len(still.stacks)} samples "
        f"(in {innermost_python(still.stacks[-1])}) while the stacks of {ranks_text(rest)} moved"
    )
    return _blame(still, confidence, why, "stack-unchanged")


RULES: tuple[Rule, ...] = (
    stopped_rule,
    outside_collective_rule,
    gpu_spin_rule,
    stack_unchanged_rule,
)


def _nothing(ranks: Sequence[RankSample], silent: Sequence[NodeReport]) -> str:
    if not ranks:
        return "no culprit: no node reported any engine rank"
    nodes = len({r.node for r in ranks})
    why = (
        f"no culprit: nothing tells one rank apart among {ranks_text(ranks)} on "
        f"{nodes} node{'s' if nodes != 1 else ''} ({others_doing(ranks, verb_plural=False)})"
    )
    if len(silent) > 1:
        why += f"; {len(silent)} nodes did not answer"
    return why
