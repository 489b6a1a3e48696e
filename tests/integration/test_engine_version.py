"""The engine's version, asked of it (GET /version) on every capture, is in the bundle's
manifest, versions.json, summary.md and report.md, with no engine log to read it from."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine_watchdog.sim.api import VERSION
from tests.integration.conftest import SimFactory
from tests.tools.cli import run_cli


async def test_an_on_demand_bundle_names_the_engine_version(
    sim_factory: SimFactory, tmp_path: Path
) -> None:
    sim = await sim_factory()
    ran = await run_cli("capture", "--url", sim.url, "--incident-dir", str(tmp_path / "inc"))
    assert ran.code == 0, ran
    bundle = Path(ran.out.strip())
    assert not (bundle / "engine.log").exists()  # the version comes from the engine, not a log
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["engine_version"] == VERSION
    assert json.loads((bundle / "versions.json").read_text())["engine_version"] == VERSION
    assert f"Engine version: {VERSION}" in (bundle / "summary.md").read_text()
    out = tmp_path / "report.md"
    reported = await run_cli("report", str(bundle), "-o", str(out))
    assert reported.code == 0, reported
    assert f"engine: vllm {VERSION}" in out.read_text()


async def test_an_engine_without_version_is_said_so(tmp_path: Path) -> None:
    """--pid without --url: nothing to ask; the bundle says the version is unknown."""
    pid = str(os.getpid())  # a process of ours: readable here
    ran = await run_cli("capture", "--pid", pid, "--incident-dir", str(tmp_path), timeout=60)
    assert ran.code == 0, ran
    summary = (Path(ran.out.strip()) / "summary.md").read_text()
    assert "Engine version: unknown (the engine did not answer /version)" in summary
