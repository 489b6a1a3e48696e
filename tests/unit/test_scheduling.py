"""The suite's xdist scheduling (tests/conftest.py), run for real: a throwaway suite of two
e2e modules and some other tests under ``-n 3 --dist loadgroup``, as ``make test`` runs it.
Every e2e test must land in one worker; the rest may go anywhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = TESTS / "conftest.py"
E2E_MODULE = (
    "import time\n\ndef test_1():\n    time.sleep(0.3)\n\ndef test_2():\n    time.sleep(0.3)\n"
)


def test_every_e2e_test_runs_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    e2e = tmp_path / "tests" / "e2e"
    e2e.mkdir(parents=True)
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "tools").mkdir()
    for name in ("__init__.py", "tools/__init__.py", "tools/ci_skips.py"):  # what it imports
        shutil.copy(TESTS / name, tmp_path / "tests" / name)
    for name in ("a", "b", "c"):
        (e2e / f"test_{name}.py").write_text(E2E_MODULE)
    (tmp_path / "tests" / "test_other.py").write_text(E2E_MODULE.replace("0.3", "0.2"))
    # xdist alone: each of the 3 workers would load every installed plugin (seconds apiece).
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadgroup", "-v"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    placed = re.findall(r"\[(gw\d)\] \[[ \d]+%\] PASSED (tests/\S+)", ran.stdout)
    e2e_workers = {w for w, test in placed if test.startswith("tests/e2e/")}
    assert len([t for _, t in placed if t.startswith("tests/e2e/")]) == 6, ran.stdout
    assert len(e2e_workers) == 1, placed
