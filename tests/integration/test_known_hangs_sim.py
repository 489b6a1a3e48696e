"""Known hangs wired into the product, on real simulator processes through the console script:
the capture step matches signatures (summary.md, manifest.json, the incident metric's label),
``explain`` and ``report`` read a bundle on disk, a bad signature file is refused at start."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import run_cli
from tests.tools.scenarios import frozen_under_load
from tests.tools.watch import get, metric

SIM_HANG = {
    "id": "sim-freeze-forever",
    "title": "The simulator's engine loop frozen in _frozen_forever",
    "engine": "vllm",
    "summary": "The freeze-last fault: the engine core stops stepping with requests in flight.",
    "seen_in": ["engine-watchdog sim"],
    "fixed_in": "not fixed",
    "workaround": 'POST /sim/fault {"fault": "none"}',
    "links": [
        {
            "ref": "engine-watchdog/engine-watchdog#1",
            "url": "https://github.com/engine-watchdog/engine-watchdog/issues/1",
            "shows": "a test signature",
        }
    ],
    "rules": [
        {
            "kind": "frame",
            "role": "engine-core",
            "any_frames": ["_frozen_forever"],
            "weight": 3,
            "required": True,
            "why": "the engine core inside the freeze",
        }
    ],
}


def signature_file(tmp: Path, *signatures: dict[str, Any]) -> Path:
    path = tmp / "signatures.json"
    doc = {
        "format": "engine-watchdog/hang-signatures",
        "format_version": 1,
        "revision": "test.1",
        "description": "signatures of this test",
        "signatures": list(signatures),
    }
    path.write_text(json.dumps(doc))
    return path


async def test_a_stall_bundle_names_the_known_hang_it_resembles(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory("--tokens-per-second", "30")
    sigs, incidents = signature_file(tmp_path, SIM_HANG), tmp_path / "incidents"
    watch = await watch_factory(
        sim.url, "--stall-seconds", "8", "--action", "capture", "--signatures", str(sigs),
        "--incident-dir", str(incidents),
    )  # fmt: skip
    async with frozen_under_load(sim, sim_http, watch):
        for _ in range(100):  # the capture runs in the background
            bundles = [p for p in incidents.glob("2*") if p.is_dir()]
            if bundles and (bundles[0] / "manifest.json").exists():
                break
            await asyncio.sleep(0.2)
        _, text = await get(watch.base + "/metrics")
    manifest = json.loads((bundles[0] / "manifest.json").read_text())
    assert [m["id"] for m in manifest["known_hangs"]] == ["sim-freeze-forever"]
    summary = (bundles[0] / "summary.md").read_text()
    assert "## Resembles known issues" in summary and "sim-freeze-forever" in summary
    assert metric(text, "engine_watchdog_incidents_total", signature="sim-freeze-forever") == 1.0

    explained = await run_cli("explain", str(bundles[0]), "--signatures", str(sigs), "--json")
    assert explained.code == 0 and explained.json()["known_hangs"][0]["id"] == "sim-freeze-forever"
    plain = await run_cli("explain", str(bundles[0]))  # the shipped signatures: none fits
    assert plain.code == 0 and "Nothing in this bundle matches a known hang" in plain.out
    out = tmp_path / "report.md"
    reported = await run_cli("report", str(bundles[0]), "--signatures", str(sigs), "-o", str(out))
    assert reported.code == 0 and reported.out.strip() == str(out)
    report = out.read_text()
    assert "Your current environment" in report and "sim-freeze-forever" in report
    assert len(report) < 65_536 and out.stat().st_mode & 0o077 == 0


async def test_bad_signature_files_and_bundles_are_one_line_errors(tmp_path: Path) -> None:
    broken = signature_file(tmp_path, {**SIM_HANG, "rules": [{"kind": "frame", "weight": 99}]})
    for code, args in (
        (64, ("watch", "http://127.0.0.1:1", "--signatures", str(broken))),
        (64, ("capture", "--pid", "1", "--signatures", str(broken))),
        (64, ("explain", str(tmp_path), "--signatures", str(broken))),
        (66, ("explain", str(tmp_path / "no-such-bundle"))),  # an input that cannot be read
    ):
        ran = await run_cli(*args, timeout=60)
        assert ran.code == code, (args, ran)
        assert len(ran.err.strip().splitlines()) == 1 and "Traceback" not in ran.err, ran.err


FIXTURE_BUNDLE = Path(__file__).parents[1] / "data/hangs/no-match-sigstop-cpu"


async def test_explain_and_report_on_a_folder_that_is_no_bundle_exit_65(tmp_path: Path) -> None:
    """``explain`` of a folder that is no bundle exited 0 with "nothing
    matches". Now exit 65 and one line that says it is not a bundle and what one has."""
    empty = tmp_path / "empty"
    empty.mkdir()
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "engine.log").write_text("INFO some log\n")
    (stray / "summary.md").write_text("# not from the watchdog\n")
    incidents = tmp_path / "incidents"  # the incident directory given instead of one bundle
    bundle = incidents / "20261202T000000Z-vllm-no-progress"
    bundle.mkdir(parents=True)
    for f in FIXTURE_BUNDLE.iterdir():
        if f.is_file():
            (bundle / f.name).write_bytes(f.read_bytes())
    for command in ("explain", "report"):
        for folder in (empty, stray, incidents):
            ran = await run_cli(command, str(folder), timeout=60)
            assert ran.code == 65, (command, folder, ran)
            (line,) = ran.err.strip().splitlines()
            assert "is not an incident bundle: a bundle directory has a manifest.json" in line
            assert "Traceback" not in ran.err and "nothing" not in ran.out + ran.err
        assert f"give one, e.g. {bundle}" in line  # the incident directory: names a bundle in it
        assert not (empty / "report.md").exists() and not (stray / "report.md").exists()
    ran = await run_cli("explain", str(bundle), timeout=60)  # the real bundle inside: read
    assert ran.code == 0, ran
