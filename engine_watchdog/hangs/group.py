"""A multi-node bundle's culprit, as summary.md and report.md say it first.

The leader's fan-out step (peers/fanout.py) writes ``nodes/group.json`` with every node's
answer and the culprit core/culprit.py named; this reads it back, bounded and tolerant (a
bundle may come from anywhere), and words it the same way in both files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

GROUP_FILE = "nodes/group.json"
MAX_EVIDENCE = 12


def group_of(data: bytes | None) -> Mapping[str, Any] | None:
    """nodes/group.json's document, or None (absent, not JSON, not an object)."""
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def culprit_lines(group: Mapping[str, Any] | None) -> list[str]:
    """The culprit paragraph: who, how sure, the facts, and the nodes that did not answer;
    no lines for a single-node bundle."""
    if group is None:
        return []
    culprit = group.get("culprit") if isinstance(group.get("culprit"), dict) else {}
    assert isinstance(culprit, dict)
    where = [
        f"{label} {culprit[key]}"
        for key, label in (("node", "node"), ("rank", "rank"), ("gpu", "GPU"))
        if culprit.get(key) is not None
    ]
    confidence = str(culprit.get("confidence") or "none")
    head = (
        f"**Culprit: {', '.join(where)}** ({confidence} confidence)."
        if where
        else ("**Culprit: none named** (nothing in the evidence tells one rank from the others).")
    )
    lines = [head, "", str(culprit.get("why") or "")]
    evidence = culprit.get("evidence")
    if isinstance(evidence, list) and evidence:
        lines += ["", *(f"- {e}" for e in evidence[:MAX_EVIDENCE])]
    nodes = group.get("nodes")
    silent = [n for n in nodes or [] if isinstance(n, dict) and not n.get("answered")]
    if silent:
        named = ", ".join(f"{n.get('node')} ({n.get('error') or 'no answer'})" for n in silent)
        lines += ["", f"Did not answer in time: {named}."]
    return lines
