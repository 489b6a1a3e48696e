"""Known hangs at capture time: every signature scored against the bundle being written, for
the "Resembles known issues" section of summary.md (and its section on the flight recorder's
collectives, read by the same view), ``known_hangs`` in manifest.json and the
incident metric's ``signature`` label (engine_watchdog/hangs does the matching)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.hangs import (
    NO_MATCH,
    Match,
    SignatureSet,
    build_view,
    load_signatures,
    manifest_matches,
    match_bundle,
    read_bundle_files,
    section_markdown,
    top_signature_id,
)
from engine_watchdog.hangs.collectives import CollectiveView, collectives_lines

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownHangs:
    """What the signatures say of one bundle."""

    section: str
    """The markdown section for summary.md (says so plainly when nothing matched)."""
    listed: list[dict[str, Any]]
    """manifest.json's ``known_hangs``: the reported matches, best first."""
    top: str
    """The best reported signature's id, or "none": the incident metric's label."""
    collectives: str = ""
    """summary.md's section on the flight-recorder dumps ("" when the bundle holds none)."""


@functools.cache
def signatures_at(path: Path | None) -> SignatureSet:
    """The signature file at ``path``, or the one installed with the package (each loaded once
    per process; a bad file raises SignatureFileError with one line)."""
    return load_signatures(path)


def known_hangs(tmp: Path, draft: Mapping[str, Any], signatures: Path | None = None) -> KnownHangs:
    """Score every signature against the files in ``tmp`` and the draft manifest (blocking).

    Matching must never cost the bundle: any failure is one log line and "none"."""
    try:
        sigs = signatures_at(signatures)
        raw = read_bundle_files(tmp)
        raw.files["manifest.json"] = json.dumps(draft, default=str).encode()
        view = build_view(raw)
        matches: list[Match] = match_bundle(view, sigs)
    except Exception as exc:  # a bug in matching must not lose the evidence
        log.warning("known-hang matching failed: %s: %s", type(exc).__name__, exc)
        return KnownHangs("", [], NO_MATCH)
    return KnownHangs(
        section_markdown(matches, sigs),
        manifest_matches(matches),
        top_signature_id(matches),
        _collectives_section(view.collectives),
    )


def _collectives_section(cols: tuple[CollectiveView, ...] | None) -> str:
    if not cols:
        return ""
    return "\n".join(["## Collectives (flight recorder)", "", *collectives_lines(cols), ""])
