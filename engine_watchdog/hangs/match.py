"""Score every signature against a bundle.

Confidence is the weighted share of a signature's rules that matched: matched weight / total
weight, from 0 to 1. A rule the bundle cannot decide (no GPU snapshot, py-spy refused) counts as
not matched, so missing evidence lowers confidence rather than being assumed. A signature whose
``required`` rule did not match, or that names another engine, gets 0. A match is *reported*
(summary.md, manifest.json, the metric label) at ``REPORT_THRESHOLD`` or above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine_watchdog.hangs.describe import describe
from engine_watchdog.hangs.rules import RuleResult, evaluate
from engine_watchdog.hangs.schema import Signature, SignatureSet
from engine_watchdog.hangs.view import BundleView

REPORT_THRESHOLD = 0.6
"""At least 60 % of a signature's evidence, by weight, with every required rule matched."""
NO_MATCH = "none"
"""The metric label value when nothing reaches the threshold."""


@dataclass(frozen=True)
class Match:
    signature: Signature
    confidence: float
    results: tuple[RuleResult, ...]
    gate: str = ""
    """Why the confidence is 0 despite matched rules (a required rule, another engine)."""

    @property
    def reported(self) -> bool:
        return self.confidence >= REPORT_THRESHOLD

    @property
    def matched(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "matched")

    @property
    def unknown(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "unknown")


def engine_applies(sig: Signature, engine: str) -> bool:
    return sig.engine == "any" or not engine or sig.engine == engine


def score(sig: Signature, view: BundleView) -> Match:
    """One signature against one bundle."""
    if not engine_applies(sig, view.engine):
        return Match(sig, 0.0, (), f"for {sig.engine}, this bundle is {view.engine}")
    results = tuple(evaluate(rule, view) for rule in sig.rules)
    got = sum(r.rule.weight for r in results if r.status == "matched")
    confidence = round(got / sig.total_weight, 2) if sig.total_weight else 0.0
    failed = [r for r in results if r.rule.required and r.status != "matched"]
    if failed:
        first = failed[0]
        gate = f"required: {describe(first.rule)} ({first.status}{_note(first)})"
        return Match(sig, 0.0, results, gate)
    return Match(sig, confidence, results)


def _note(r: RuleResult) -> str:
    return f": {r.note}" if r.note else ""


def match_bundle(view: BundleView, signatures: SignatureSet) -> list[Match]:
    """Every signature's match, best first (ties: the file's order)."""
    scored = [score(sig, view) for sig in signatures.signatures]
    order = {m.signature.id: i for i, m in enumerate(scored)}
    return sorted(scored, key=lambda m: (-m.confidence, order[m.signature.id]))


def reported(matches: Sequence[Match]) -> list[Match]:
    return [m for m in matches if m.reported]


def top_signature_id(matches: Sequence[Match]) -> str:
    """The label for the incident metric: the best reported signature's id, or ``none``."""
    best = reported(matches)
    return best[0].signature.id if best else NO_MATCH


def label_values(signatures: SignatureSet) -> tuple[str, ...]:
    """Every value the label can take: the ids plus ``none`` (bounds its cardinality)."""
    return (*signatures.ids(), NO_MATCH)
