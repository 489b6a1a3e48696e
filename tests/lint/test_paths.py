"""Every path of this repository that the code, the tests and the docs name exists, so a rename
that leaves a docstring, a comment or a page behind fails here instead of sending a reader
nowhere. A path is ours when it starts at the repository's root (``engine_watchdog/``, ``tests/``,
``benchmarks/``, ``deploy/``, a page ``docs/<name>.md``) or at one of the package's layers
(``guard/sse.c``, beside the module that names it or under the package). Upstream paths
(``vllm/v1/engine/core.py``, LeaderWorkerSet's ``docs/examples/...``) are not ours and are not
checked; the committed evidence and vendored trees are quoted, not written, and are skipped."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "engine_watchdog"
LAYERS = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
ROOTS = {"engine_watchdog", "tests", "benchmarks", "deploy", "docs"}
PATH = re.compile(
    r"(?<![\w/.:@-])((?:[\w.-]+/)+[\w.-]+\.(?:py|c|h|md|json|yml|yaml|sh|toml|txt))\b"
)
SUFFIXES = (".py", ".md", ".c", ".h", ".sh", ".yml", ".yaml", ".toml")
QUOTED = ("tests/data/", "engine_watchdog/guard/vendor/")
"""Committed evidence and vendored code: what they name is another machine's or project's."""
UPSTREAM = {
    "tests/deploy/manifests.py": {"tests/assets/values-05-secure-vllm.yaml"},
    "tests/lint/test_paths.py": {
        "runtime/nowhere.py",
        "docs/nowhere.md",
        "tests/unit/test_nowhere.py",
    },
    "tests/lint/test_map.py": {"runtime/nowhere.py"},
}
"""Paths under one of our roots that name another repository's file, or the checks' own bait."""


def ours(path: str) -> bool:
    first, _, rest = path.partition("/")
    if first == "docs":
        return "/" not in rest  # a page of ours; deeper, an upstream project's docs tree
    return first in ROOTS or first in LAYERS


def missing(source: Path, text: str) -> list[str]:
    """The paths of ours that ``text`` (of the file ``source``) names and that do not exist."""
    gone = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            path = match.group(1)
            if not ours(path):
                continue
            if not any(p.exists() for p in (ROOT / path, PACKAGE / path, source.parent / path)):
                gone.append(f"{source.relative_to(ROOT)}:{number}: {path}")
    return gone


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split("\0")
    return [
        ROOT / n
        for n in names
        if n.endswith(SUFFIXES) and not n.startswith(QUOTED) and (ROOT / n).is_file()
    ]


def test_every_path_of_ours_that_is_named_exists() -> None:
    gone = []
    for source in tracked():
        allowed = UPSTREAM.get(str(source.relative_to(ROOT)), set())
        if source == Path(__file__).resolve():  # this file names them all, to allow them
            allowed = set().union(*UPSTREAM.values())
        text = source.read_text(encoding="utf-8", errors="replace")
        gone += [g for g in missing(source, text) if g.rsplit(" ", 1)[1] not in allowed]
    assert gone == [], "named, but not there (renamed or removed?):\n" + "\n".join(gone)


def test_the_check_can_fail() -> None:
    source = PACKAGE / "guard" / "lanes.py"
    text = (
        "the C is guard/sse.c beside fast.py's twin, runtime/nowhere.py is not; "
        "vllm/v1/engine/core.py and docs/serving/parallelism_scaling.md are upstream's; "
        "docs/nowhere.md and tests/unit/test_nowhere.py are gone"
    )
    assert [g.rsplit(" ", 1)[1] for g in missing(source, text)] == [
        "runtime/nowhere.py",
        "docs/nowhere.md",
        "tests/unit/test_nowhere.py",
    ]
