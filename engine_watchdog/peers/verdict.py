"""Who the culprit is, from every node's report: the one call the fan-out makes.

A placeholder until core/culprit.py lands: swap the body of :func:`culprit_of` for
``return name_culprit(reports)`` (``from engine_watchdog.core.culprit import name_culprit``).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_watchdog.core.ranks import Confidence, Culprit, NodeReport


def culprit_of(reports: Sequence[NodeReport]) -> Culprit:
    """The culprit the reports point at (for now: none, there is no culprit logic yet)."""
    silent = tuple(f"{r.node} did not answer: {r.error}" for r in reports if not r.answered)
    return Culprit(Confidence.NONE, "no culprit logic", evidence=silent)
