"""Score every signature against a bundle, on what the bundle shows.

Each rule is matched, not matched (the bundle contradicts it) or unknown (the bundle lacks what
it reads: no stacks when py-spy lacked SYS_PTRACE or timed out, no GPU snapshot, a user's own
log without the environment). Missing evidence weighs nothing either way:

- **confidence** is the matched weight over the weight of the rules the bundle could check
  ("0.8 of what was seen"); **seen** is that checkable weight over the signature's whole weight.
- A ``required`` rule the bundle contradicts excludes the signature (confidence 0, and the gate
  says which); one it cannot check leaves it a *possible* match, never a match.
- A negated rule ("no ``--enforce-eager``") is true of almost every engine: it gates (required)
  or ranks (a contradiction counts against), and adds no weight of its own when it holds.
- A signature is named only when something that shows the hang itself matched (a stack, a log
  line, the GPU state, a collective), not the set-up alone, at ``REPORT_THRESHOLD`` or more of
  what was seen, with at least ``MIN_SEEN`` of its weight checkable.

A **match** has every required rule matched; a **possible match** has some of them unknown, and
says what was missing ("the stacks were not captured, and they decide it"). Named candidates
rank by the evidence seen for them: matched weight over the signature's whole weight
(confidence x seen), so a signature whose evidence was all there and matched ranks above one
that fits a few rules and cannot be checked on the rest; ties by confidence. A signature of
another engine, or of one engine on a bundle that names none (manifest, command lines), gets 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine_watchdog.hangs.describe import describe
from engine_watchdog.hangs.rules import RuleResult, evaluate
from engine_watchdog.hangs.schema import SYMPTOM_KINDS, Signature, SignatureSet
from engine_watchdog.hangs.view import BundleView

REPORT_THRESHOLD = 0.6
"""At least 60 % of what was seen, by weight, no required rule contradicted."""
MIN_SEEN = 0.5
"""At least half a signature's weight must have been checkable for it to be named at all."""
NO_MATCH = "none"
"""The metric label value when nothing is named."""
POSSIBLE_PREFIX = "possible:"
"""The metric label of a possible match: ``possible:<id>`` (an id cannot hold a colon)."""

Kind = Literal["match", "possible", "none"]

_MISSING = {
    "frame": "the stacks were not captured",
    "gpu": "the GPU state was not captured",
    "gpu_model": "the GPU model is not in the bundle",
    "flight_recorder": "no flight-recorder dump was captured",
    "log": "the engine log does not tell",
    "flag": "the command line is not in the bundle",
    "cmdline": "the command line is not in the bundle",
    "env": "the environment is not in the bundle",
    "version": "the version is not in the bundle",
    "multi_node": "the launch is not in the bundle",
}


@dataclass(frozen=True)
class Match:
    signature: Signature
    confidence: float
    """Matched weight over the weight of the rules the bundle could check (0 to 1)."""
    results: tuple[RuleResult, ...]
    gate: str = ""
    """Why the confidence is 0 despite matched rules (a required rule, another engine)."""
    seen: float = 0.0
    """The share of the signature's weight the bundle could check."""
    kind: Kind = "none"
    """``match``, ``possible`` (a required rule could not be checked) or ``none``."""
    why_not: str = ""
    """For ``none`` with a confidence: why it is not named (too little seen, set-up only)."""

    @property
    def support(self) -> float:
        """The evidence seen for it: matched weight over the signature's whole weight."""
        return round(self.confidence * self.seen, 4)

    @property
    def reported(self) -> bool:
        """Named: a match or a possible match (summary.md, manifest.json, the label)."""
        return self.kind != "none"

    @property
    def matched(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "matched")

    @property
    def unknown(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "unknown")

    @property
    def undecided(self) -> tuple[RuleResult, ...]:
        """The required rules the bundle could not check: what a possible match waits on."""
        return tuple(r for r in self.unknown if r.rule.required)

    def missing_text(self) -> str:
        """``the stacks were not captured, and they decide it`` (one clause per source)."""
        decide = list(dict.fromkeys(_MISSING[r.rule.kind] for r in self.undecided))
        if not decide:
            return ""
        they = "they decide it" if len(decide) > 1 or decide[0].startswith("the stacks") else ""
        return f"{', '.join(decide)}, and {they or 'that decides it'}"

    def headline(self) -> str:
        """``possible match: <id>, 0.70 of what was seen; the stacks were not captured, ...``."""
        sid, conf = self.signature.id, self.confidence
        if self.kind == "possible":
            return f"possible match: {sid}, {conf:.2f} of what was seen; {self.missing_text()}"
        if self.kind == "match":
            return f"match: {sid}, {conf:.2f} of what was seen"
        return f"no match: {sid} ({self.gate or self.why_not or f'{conf:.2f} of what was seen'})"


def engine_applies(sig: Signature, engine: str) -> bool:
    """A signature of one engine needs a bundle that says it runs that engine (the manifest, or
    the processes' command lines): without it, evidence such as a spinning GPU would name an
    engine's hang on a bundle that may run anything."""
    return sig.engine == "any" or sig.engine == engine


def score(sig: Signature, view: BundleView) -> Match:
    """One signature against one bundle."""
    if not engine_applies(sig, view.engine):
        which = f"this bundle is {view.engine}" if view.engine else "the bundle names no engine"
        return Match(sig, 0.0, (), f"for {sig.engine}, {which}")
    results = tuple(evaluate(rule, view) for rule in sig.rules)
    failed = [r for r in results if r.rule.required and r.status == "not-matched"]
    if failed:
        first = failed[0]
        gate = f"required: {describe(first.rule)} ({first.status}{_note(first)})"
        return Match(sig, 0.0, results, gate)
    scoring = [r for r in results if not r.rule.negate]
    checked = [r for r in scoring if r.status != "unknown"]
    against = [r for r in results if r.rule.negate and r.status == "not-matched"]
    got = sum(r.rule.weight * r.credit for r in checked if r.status == "matched")
    seen_weight = sum(r.rule.weight for r in checked) + sum(r.rule.weight for r in against)
    total = sum(r.rule.weight for r in scoring)
    confidence = round(got / seen_weight, 2) if seen_weight else 0.0
    seen = round(sum(r.rule.weight for r in checked) / total, 2) if total else 0.0
    why_not = _why_not(results, confidence, seen)
    if why_not:
        return Match(sig, confidence, results, "", seen, "none", why_not)
    open_required = any(r.rule.required and r.status == "unknown" for r in results)
    kind: Kind = "possible" if open_required else "match"
    return Match(sig, confidence, results, "", seen, kind)


def _why_not(results: Sequence[RuleResult], confidence: float, seen: float) -> str:
    if not any(r.status == "matched" and r.rule.kind in SYMPTOM_KINDS for r in results):
        return "nothing of the hang itself matched (stacks, log, GPU state, collectives)"
    if seen < MIN_SEEN:
        return f"too little could be checked ({seen:.2f} of its evidence)"
    if confidence < REPORT_THRESHOLD:
        return f"{confidence:.2f} of what was seen, under {REPORT_THRESHOLD:.2f}"
    return ""


def _note(r: RuleResult) -> str:
    return f": {r.note}" if r.note else ""


def match_bundle(view: BundleView, signatures: SignatureSet) -> list[Match]:
    """Every signature's match: named ones first, best first (by the evidence seen for them,
    then by confidence; ties: the file's order), then the rest alike."""
    scored = [score(sig, view) for sig in signatures.signatures]
    order = {m.signature.id: i for i, m in enumerate(scored)}
    return sorted(
        scored,
        key=lambda m: (not m.reported, -m.support, -m.confidence, order[m.signature.id]),
    )


def reported(matches: Sequence[Match]) -> list[Match]:
    return [m for m in matches if m.reported]


def label_of(m: Match) -> str:
    return m.signature.id if m.kind == "match" else POSSIBLE_PREFIX + m.signature.id


def top_signature_id(matches: Sequence[Match]) -> str:
    """The label for the incident metric: the best named signature's id (``possible:<id>`` for
    a possible match), or ``none``."""
    best = reported(matches)
    return label_of(best[0]) if best else NO_MATCH


def label_values(signatures: SignatureSet) -> tuple[str, ...]:
    """Every value the label can take: the ids, ``possible:<id>`` for each, and ``none`` (bounds
    its cardinality)."""
    ids = signatures.ids()
    return (*ids, *(POSSIBLE_PREFIX + i for i in ids), NO_MATCH)
