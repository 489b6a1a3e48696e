"""The "Resembles known issues" section of summary.md and the list for manifest.json. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_watchdog.hangs.describe import describe
from engine_watchdog.hangs.match import REPORT_THRESHOLD, Match, reported
from engine_watchdog.hangs.rules import RuleResult
from engine_watchdog.hangs.schema import Signature, SignatureSet

HEADING = "## Resembles known issues"
SECTION_MAX_MATCHES = 3


def _links(sig: Signature) -> str:
    return ", ".join(f"[{link.ref}]({link.url})" for link in sig.links)


def _evidence_lines(results: Sequence[RuleResult]) -> list[str]:
    out = []
    for r in results:
        mark = {"matched": "matched", "not-matched": "not matched", "unknown": "not checked"}
        first = f"  - {mark[r.status]}: {describe(r.rule)}"
        if r.status != "matched" and r.note:
            first += f" ({r.note})"
        out.append(first)
        out += [f"    - `{e.file}`: {_code(e.detail)}" for e in r.evidence if r.status == "matched"]
    return out


def _code(text: str) -> str:
    """Inline code that survives backticks and pipes in frames or log lines."""
    clean = text.replace("\n", " ").replace("`", "'")
    return f"`{clean}`"


def match_lines(m: Match) -> list[str]:
    sig = m.signature
    fixed = sig.fixed_in or "not known"
    seen = ", ".join(sig.seen_in) or "not stated"
    lines = [
        f"- **{sig.title}** (`{sig.id}`), confidence {m.confidence:.2f}",
        f"  - Upstream: {_links(sig)}",
        f"  - Seen in: {seen}; fixed: {fixed}",
        f"  - Workaround reported: {sig.workaround}",
    ]
    if sig.not_confirmed:
        lines.append(f"  - Not confirmed by the reports: {sig.not_confirmed}")
    lines.append("  - Evidence:")
    return lines + ["  " + line for line in _evidence_lines(m.results)]


def nothing_matched(matches: Sequence[Match], signatures: SignatureSet) -> str:
    closest = next((m for m in matches if m.confidence > 0), None)
    near = (
        f" The closest was `{closest.signature.id}` at {closest.confidence:.2f}."
        if closest
        else " No signature had its required evidence."
    )
    return (
        f"Nothing in this bundle matches a known hang: {len(signatures.signatures)} signatures "
        f"(revision {signatures.revision}) were checked and none reached the reporting "
        f"threshold of {REPORT_THRESHOLD:.2f}.{near} This may be a new hang: "
        "`engine-watchdog report` writes an upstream report."
    )


def section_markdown(matches: Sequence[Match], signatures: SignatureSet) -> str:
    """The whole section, heading included; says so plainly when nothing matched."""
    out = [HEADING, ""]
    best = reported(matches)
    if not best:
        return "\n".join([*out, nothing_matched(matches, signatures), ""])
    out.append(
        f"Signatures revision {signatures.revision}; a match is shown at confidence "
        f"{REPORT_THRESHOLD:.2f} or more (the weighted share of its rules that matched)."
    )
    out.append("")
    for m in best[:SECTION_MAX_MATCHES]:
        out += match_lines(m)
    if len(best) > SECTION_MAX_MATCHES:
        rest = ", ".join(
            f"`{m.signature.id}` {m.confidence:.2f}" for m in best[SECTION_MAX_MATCHES:]
        )
        out.append(f"- Also above the threshold: {rest}")
    return "\n".join([*out, ""])


def manifest_matches(matches: Sequence[Match]) -> list[dict[str, Any]]:
    """JSON-able list for manifest.json (``known_hangs``): reported matches only, best first."""
    return [
        {
            "id": m.signature.id,
            "title": m.signature.title,
            "confidence": m.confidence,
            "links": [link.url for link in m.signature.links],
            "fixed_in": m.signature.fixed_in,
            "workaround": m.signature.workaround,
            "evidence": [
                {"rule": describe(r.rule), "file": e.file, "detail": e.detail}
                for r in m.matched
                for e in r.evidence
            ],
        }
        for m in reported(matches)
    ]
