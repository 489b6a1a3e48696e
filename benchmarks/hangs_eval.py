"""How well the known-hang matcher names upstream hangs it was not written from.

Run: ``.venv/bin/python -m benchmarks.hangs_eval`` (``--json`` for the figures as JSON,
``--cases DIR`` for another evaluation set, ``--signatures FILE`` for another catalog).

The set is tests/data/hangs_eval (its build.py says how each case was made, each case's
source.md which report it comes from). Positives are reports of a catalog hang that the catalog
does not cite; negatives are real hangs of other causes that look alike; healthy ones are
engines that are not hung. Every case is scored twice: as built (with the stacks its report
quotes) and with its stacks taken out (what a bundle holds when py-spy was refused).

- top-1: the expected signature is the first one named (a match or a possible match);
- top-3: it is among the first three named;
- of those, how many were named as a match rather than a possible match;
- false matches: a negative or healthy case for which anything was named (a possible match
  counts: an operator would read it).

Only the package's public reading and matching functions are used, so the same script scores
an older engine_watchdog (docs/known-hangs.md gives the figures before and after).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_watchdog.hangs import (
    build_view,
    load_signatures,
    match_bundle,
    read_bundle_files,
    reported,
)

CASES = Path(__file__).resolve().parents[1] / "tests" / "data" / "hangs_eval"


@dataclass
class Tally:
    cases: int = 0
    top1: int = 0
    top3: int = 0
    top1_match: int = 0
    misses: list[str] = field(default_factory=list)

    def pct(self, n: int) -> float:
        return round(100.0 * n / self.cases, 1) if self.cases else 0.0


@dataclass
class Figures:
    positives: dict[str, Tally]
    """``as-built`` (the stacks the reports quote, where they quote some), ``with-stacks``
    (only the positives whose report quotes stacks) and ``without-stacks`` (every positive,
    its stacks taken out)."""
    false_matches: dict[str, list[str]]
    """Per kind (negative, healthy) and variant: the cases something was named for."""
    counts: dict[str, int]


def named(bundle: Path, sigs: Any, strip_stacks: bool) -> list[tuple[str, str]]:
    """(signature id, match or possible) for each signature named, best first."""
    raw = read_bundle_files(bundle)
    if strip_stacks:
        raw.files = {k: v for k, v in raw.files.items() if not k.startswith("pyspy/")}
    matches = match_bundle(build_view(raw), sigs)
    return [(m.signature.id, getattr(m, "kind", "match")) for m in reported(matches)]


def evaluate(cases_dir: Path, sigs: Any) -> Figures:
    index = json.loads((cases_dir / "index.json").read_text())
    pos = {"as-built": Tally(), "with-stacks": Tally(), "without-stacks": Tally()}
    false: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for name, case in sorted(index.items()):
        kind = case["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        bundle = cases_dir / name
        has_stacks = (bundle / "pyspy").is_dir()
        variants = {"as-built": False, "without-stacks": True}
        if kind == "positive" and has_stacks:
            variants["with-stacks"] = False
        for variant, strip in variants.items():
            got = named(bundle, sigs, strip)
            if kind == "positive":
                _score(pos[variant], name, case["expect"], got)
            elif got:
                false.setdefault(f"{kind} {variant}", []).append(f"{name}: {got[0][0]}")
    return Figures(pos, false, counts)


def _score(t: Tally, name: str, expect: str, got: Sequence[tuple[str, str]]) -> None:
    t.cases += 1
    ids = [sid for sid, _ in got]
    if ids[:1] == [expect]:
        t.top1 += 1
        t.top1_match += got[0][1] == "match"
    else:
        t.misses.append(f"{name}: {ids[0] if ids else 'nothing'}")
    t.top3 += expect in ids[:3]


def report(f: Figures) -> str:
    c = f.counts
    lines = [
        f"cases: {sum(c.values())} ({c.get('positive', 0)} positive, "
        f"{c.get('negative', 0)} hard negative, {c.get('healthy', 0)} healthy)",
    ]
    for variant, t in f.positives.items():
        lines.append(
            f"positives {variant}: top-1 {t.top1}/{t.cases} ({t.pct(t.top1)} %), "
            f"top-3 {t.top3}/{t.cases} ({t.pct(t.top3)} %); top-1 as a match {t.top1_match}"
        )
    for variant in ("as-built", "without-stacks"):
        for kind in ("negative", "healthy"):
            hits = f.false_matches.get(f"{kind} {variant}", [])
            lines.append(f"false matches on {kind} cases {variant}: {len(hits)}")
            lines += [f"  {h}" for h in hits]
    for variant, t in f.positives.items():
        lines += [f"  missed {variant}: {m}" for m in t.misses]
    return "\n".join(lines)


def as_json(f: Figures) -> dict[str, Any]:
    return {
        "counts": f.counts,
        "positives": {v: _tally_json(t) for v, t in f.positives.items()},
        "false_matches": f.false_matches,
    }


def _tally_json(t: Tally) -> dict[str, Any]:
    return {
        "cases": t.cases,
        "top1": t.top1,
        "top3": t.top3,
        "top1_match": t.top1_match,
        "top1_pct": t.pct(t.top1),
        "top3_pct": t.pct(t.top3),
        "missed": t.misses,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=Path, default=CASES)
    p.add_argument("--signatures", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    figures = evaluate(args.cases, load_signatures(args.signatures))
    print(json.dumps(as_json(figures), indent=1) if args.json else report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
