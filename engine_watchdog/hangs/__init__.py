"""Known hangs: match an incident bundle to the upstream reports it resembles, and
write the report a maintainer asks for.

Self-contained: imports nothing from the rest of engine_watchdog but the one redaction module,
``core/redact.py`` (pure). The pieces, for the capture
step and the ``explain`` / ``report`` commands:

- :func:`load_signatures` (the installed ``signatures.json`` or a given file; a bad file raises
  :class:`SignatureFileError` with one line naming the signature and the field);
- :func:`read_bundle` (thin, bounded file reads; raises :class:`BundleNotFound` only when the path
  is not a directory) = :func:`read_bundle_files` + the pure :func:`build_view`;
- :func:`match_bundle` (every signature scored; :data:`REPORT_THRESHOLD`);
- :func:`section_markdown` and :func:`manifest_matches` (summary.md and manifest.json);
- :func:`render_report` (report.md, under GitHub's limit);
- :func:`top_signature_id` and :func:`label_values` (the metric label and its bounded values).

docs/known-hangs.md describes the signature format and how confidence is computed.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine_watchdog.hangs.files import BundleNotFound, RawBundle, read_bundle_files
from engine_watchdog.hangs.load import SignatureFileError, load_signatures, parse_signatures
from engine_watchdog.hangs.match import (
    NO_MATCH,
    REPORT_THRESHOLD,
    Match,
    label_values,
    match_bundle,
    reported,
    top_signature_id,
)
from engine_watchdog.hangs.render import manifest_matches, section_markdown
from engine_watchdog.hangs.report import GITHUB_LIMIT, render_report
from engine_watchdog.hangs.schema import Signature, SignatureSet
from engine_watchdog.hangs.view import BundleView, build_view

__all__ = [
    "GITHUB_LIMIT",
    "NO_MATCH",
    "REPORT_THRESHOLD",
    "BundleNotFound",
    "BundleView",
    "Match",
    "RawBundle",
    "Signature",
    "SignatureFileError",
    "SignatureSet",
    "build_view",
    "explain_bundle",
    "label_values",
    "load_signatures",
    "manifest_matches",
    "match_bundle",
    "parse_signatures",
    "read_bundle",
    "read_bundle_files",
    "render_report",
    "reported",
    "section_markdown",
    "top_signature_id",
    "write_report",
]


def read_bundle(bundle: Path) -> BundleView:
    """The bundle directory as the matcher sees it. Blocking (file reads)."""
    return build_view(read_bundle_files(bundle))


def explain_bundle(bundle: Path, signatures: SignatureSet | None = None) -> tuple[str, list[Match]]:
    """The "Resembles known issues" section for a bundle on disk, and the matches behind it."""
    sigs = signatures or load_signatures()
    matches = match_bundle(read_bundle(bundle), sigs)
    return section_markdown(matches, sigs), matches


def write_report(
    bundle: Path, signatures: SignatureSet | None = None, out: Path | None = None
) -> Path:
    """Write report.md (default: inside the bundle, private like the bundle's files)."""
    sigs = signatures or load_signatures()
    view = read_bundle(bundle)
    text = render_report(view, match_bundle(view, sigs), sigs)
    target = out or bundle / "report.md"
    fd = os.open(
        target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600
    )
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return target
