"""The GitHub Actions workflows (.github/workflows): actionlint finds nothing in them, and the
release workflow's assumptions about the tree hold (versions agree, its image line exists)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.tools import REPO

WORKFLOWS = REPO / ".github" / "workflows"
CHART = REPO / "deploy" / "helm" / "engine-watchdog"


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "actionlint"  # the dev dependency's binary
    if not exe.exists():
        pytest.fail("actionlint is missing: `make install` (a dev dependency)", pytrace=False)
    return subprocess.run(
        [str(exe), "-no-color", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert files, "no workflow under .github/workflows"
    done = actionlint(*files)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_actionlint_has_teeth(tmp_path: Path) -> None:
    """An unknown expression context and a missing `runs-on` are reported: a finding fails."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    steps:\n      - run: echo ${{ github.nope.ref }}\n")
    done = actionlint(bad)
    assert done.returncode == 1
    assert '"runs-on" section is missing' in done.stdout, done.stdout


def test_the_release_workflow_s_versions_and_image_line_hold() -> None:
    """The release job refuses a tag whose version the tree does not carry, and rewrites the
    chart's default image line: both must match what is in the tree now."""
    project = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    chart = (CHART / "Chart.yaml").read_text()
    version = re.search(r"^version: *(\S+)$", chart, re.M)
    app = re.search(r'^appVersion: *"?([^"\n]+)"?$', chart, re.M)
    assert project and version and app
    assert project.group(1) == version.group(1) == app.group(1)
    values = (CHART / "values.yaml").read_text()
    assert len(re.findall(r"^  repository: engine-watchdog ", values, re.M)) == 1
