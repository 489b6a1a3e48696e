"""Docs, code, tests and deploy files cite upstream sources (vllm-project/vllm#46611, a URL),
never this project's internal issue numbers: a reader outside it cannot open those, so each
place says what the thing is instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCOPE = ("docs", "README.md", "engine_watchdog", "tests", "benchmarks", "deploy", ".github")
TEXT = (".py", ".md", ".json", ".yaml", ".yml", ".sh", ".tpl", ".txt", ".toml", "Dockerfile")
INTERNAL = re.compile(r"(?<![\w/-])(issues?)\s+#?(\d+)\b", re.IGNORECASE)
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+\s*$")  # "owner/repo issue 12" names an upstream one


def internal_references(text: str) -> list[str]:
    found = []
    for match in INTERNAL.finditer(text):
        if UPSTREAM.search(text[max(0, match.start() - 60) : match.start()]):
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{line}: {match.group(0)}")
    return found


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--", *SCOPE], cwd=REPO, capture_output=True, text=True, timeout=30
    ).stdout.split()
    return [REPO / p for p in out if p.endswith(TEXT) and (REPO / p).is_file()]


def test_no_internal_issue_numbers_anywhere() -> None:
    wrong = [
        f"{path.relative_to(REPO)}:{ref}"
        for path in tracked_files()
        for ref in internal_references(path.read_text(errors="replace"))
    ]
    assert not wrong, f"internal issue numbers (say what the thing is instead): {wrong}"


def test_the_finder_tells_internal_from_upstream() -> None:
    word = "iss" + "ue"  # spelt apart so that this file holds no reference itself
    assert internal_references(f"the guard ({word} 15) and {word.title()} 21 cases")
    assert internal_references(f"the {word}s 3 and 5")
    upstream = (
        "vllm-project/vllm#46611, vLLM #40350, https://github.com/a/b/"
        + word
        + "s/12, sgl-project/sglang "
        + word
        + " 30919"
    )
    assert internal_references(upstream) == []
