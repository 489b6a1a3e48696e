"""The "Resembles known issues" section of summary.md and the list for manifest.json. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_watchdog.hangs.describe import describe
from engine_watchdog.hangs.match import MIN_SEEN, REPORT_THRESHOLD, Match, reported
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


def verdict_text(m: Match) -> str:
    """``match, 0.85 of what was seen`` or ``possible match, 0.70 of what was seen; the stacks
    were not captured, and they decide it``."""
    text = f"{m.confidence:.2f} of what was seen"
    if m.seen < 1:
        text += f" ({m.seen:.2f} of its evidence could be checked)"
    if m.kind == "possible":
        return f"possible match, {text}; {m.missing_text()}"
    return f"match, {text}"


def match_lines(m: Match) -> list[str]:
    sig = m.signature
    fixed = sig.fixed_in or "not known"
    seen = ", ".join(sig.seen_in) or "not stated"
    lines = [
        f"- **{sig.title}** (`{sig.id}`): {verdict_text(m)}",
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
        f" The closest was `{closest.signature.id}` at {closest.confidence:.2f} of what was "
        f"seen ({closest.why_not or closest.gate})."
        if closest
        else " No signature had its required evidence."
    )
    return (
        f"Nothing in this bundle matches a known hang, not even possibly: "
        f"{len(signatures.signatures)} signatures (revision {signatures.revision}) were checked."
        f"{near} This may be a new hang: `engine-watchdog report` writes an upstream report."
    )


def named_lines(named: Sequence[Match], evidence: bool = True) -> list[str]:
    """The matches, then the possible matches under a heading of their own."""
    out: list[str] = []
    sure = [m for m in named if m.kind == "match"]
    maybe = [m for m in named if m.kind == "possible"]
    for m in sure:
        out += _shown(m, evidence)
    if maybe:
        if sure:
            out.append("")
        out += ["**Possible matches** (not confirmed: the bundle lacks what decides them):", ""]
        for m in maybe:
            out += _shown(m, evidence)
    return out


def _shown(m: Match, evidence: bool) -> list[str]:
    lines = match_lines(m)
    return lines if evidence else lines[: lines.index("  - Evidence:")]


RULE_OF_THUMB = (
    "a **match** has every required rule seen and matched; a **possible match** has the "
    "evidence that decides it missing from the bundle. Both need {t:.2f} or more of what was "
    "seen, by weight, with at least {s:.2f} of the signature's evidence checkable."
)


def section_markdown(matches: Sequence[Match], signatures: SignatureSet) -> str:
    """The whole section, heading included: matches, then possible matches apart (each saying
    what was missing); says so plainly when nothing is named."""
    out = [HEADING, ""]
    best = reported(matches)
    if not best:
        return "\n".join([*out, nothing_matched(matches, signatures), ""])
    rule = RULE_OF_THUMB.format(t=REPORT_THRESHOLD, s=MIN_SEEN)
    out += [f"Signatures revision {signatures.revision}; {rule}", ""]
    out += named_lines(best[:SECTION_MAX_MATCHES])
    if len(best) > SECTION_MAX_MATCHES:
        rest = ", ".join(
            f"`{m.signature.id}` ({m.kind} {m.confidence:.2f})" for m in best[SECTION_MAX_MATCHES:]
        )
        out.append(f"- Also named: {rest}")
    return "\n".join([*out, ""])


def manifest_matches(matches: Sequence[Match]) -> list[dict[str, Any]]:
    """JSON-able list for manifest.json (``known_hangs``): named matches only, best first;
    ``match`` says ``match`` or ``possible``, ``missing`` what could not be checked."""
    return [
        {
            "id": m.signature.id,
            "match": m.kind,
            "title": m.signature.title,
            "confidence": m.confidence,
            "seen": m.seen,
            "missing": [
                {"rule": describe(r.rule), "note": r.note} for r in m.unknown if not r.rule.negate
            ],
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
