"""A reader who clones the repository can follow every citation: no tracked file points at a
file outside it (a notes file the project's authors kept, a sibling checkout)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("FACTS" + ".md", "../" + "shared")  # split so this file does not match itself


def test_no_tracked_file_cites_a_file_outside_the_repo() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    hits = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(errors="ignore")
        except OSError:
            continue
        hits += [f"{name}: {word}" for word in OUTSIDE if word in text]
    assert hits == []
