"""docs/architecture.md is the map, not a copy of the docstrings: it names every layer, and
every file, module and test it points at exists (a rename that leaves the map behind fails
here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "engine_watchdog"
MAP = ROOT / "docs" / "architecture.md"
LAYERS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
TESTS = re.compile(r"(tests/\w+/test_\w+\.py)(?:::(\w+))?")
FILE = re.compile(r"(?<![\w/.])(\w+/)+\w+\.py\b")


def pointers(text: str) -> list[str]:
    """What the map points at that does not exist: a package file (``runtime/act/handle.py``), a
    test file, or a test function (``test_x.py::test_y``, or a ``test_...`` named after one)."""
    gone = []
    for match in FILE.finditer(text):
        path = match.group(0)
        if not path.startswith("tests/") and not (PACKAGE / path).exists():
            gone.append(path)
    for line in text.splitlines():
        files = [m.group(1) for m in TESTS.finditer(line)]
        gone += [f for f in files if not (ROOT / f).exists()]
        defined = set().union(*(_tests_in(ROOT / f) for f in files)) if files else set()
        for name in re.findall(r"`(?:[\w/.]+::)?(test_\w+)`", line):
            if files and name not in defined:
                gone.append(f"{files[0]}::{name}")
    return gone


def _tests_in(path: Path) -> set[str]:
    if not path.exists():
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_the_map_names_every_layer_and_nothing_gone() -> None:
    text = MAP.read_text(encoding="utf-8")
    assert [layer for layer in LAYERS if f"`{layer}/`" not in text] == []
    assert pointers(text) == [], "docs/architecture.md points at what is not there"


def test_the_check_can_fail() -> None:
    gone = pointers(
        "runtime/nowhere.py beside runtime/act/handle.py; "
        "`tests/unit/test_architecture.py::test_nothing_is_wired_by_attribute`, "
        "`test_no_such_check`"
    )
    assert gone == ["runtime/nowhere.py", "tests/unit/test_architecture.py::test_no_such_check"]
