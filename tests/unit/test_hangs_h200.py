"""The known-hang matcher against real bundles captured on an H200 (tests/data/hangs_real/h200-*,
docs/gpu-verification.md, 2026-12-01).

Each bundle must match the signature meant for it, or none, and never a wrong one. None of these
is an upstream bug: ``h200-verify-spin`` is tests/gpu/verify_gpu.py's hand-made CuPy kernel that
spins on a flag nobody sets; the two ``h200-demo-gpu-spin*`` bundles are ``engine-watchdog demo
--gpu``'s simulated vLLM whose engine core waits on ``torch.cuda._sleep`` (the first bundle at
the stall, the second the destructive one before the restart); ``h200-nccl-one-gpu`` is
tests/gpu/verify_nccl_one_gpu.py's two PyTorch ranks on the one GPU, rank 0 in an all_reduce
rank 1 never joins, captured by ``engine-watchdog capture --pid``. So the meant signature is none
for all four, and the tests also check that the evidence was there to be read (a spinning H200,
the stuck native stack), so that "none" is the matcher's answer and not an empty bundle's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine_watchdog.capture.known_hangs import known_hangs
from engine_watchdog.cli.hangscmd import explain_command
from engine_watchdog.hangs import (
    NO_MATCH,
    REPORT_THRESHOLD,
    load_signatures,
    match_bundle,
    read_bundle,
    render_report,
    reported,
    top_signature_id,
)
from engine_watchdog.hangs.collectives import collectives_lines
from engine_watchdog.hangs.view import BundleView

REAL = Path(__file__).resolve().parents[1] / "data" / "hangs_real"
SIGS = load_signatures()


@dataclass(frozen=True)
class Expect:
    meant: str | None
    """The signature meant for this bundle; None: it is no known upstream hang."""
    engine: str
    """The bundle's engine ("" when the capture wrote no manifest)."""
    stack: tuple[str, ...]
    """Frames of the stuck main thread, innermost first, each below the one before."""
    roles: frozenset[str]


SIM_STACK = (
    "cuCtxSynchronize_v2",
    "cudaDeviceSynchronize",
    "c10::cuda::device_synchronize",
    "synchronize",
    "GpuWork.spin_until",
    "EngineCore.run_busy_loop",
)
CASES = {
    "h200-verify-spin": Expect(
        None,
        "",
        ("cuCtxSynchronize_v2", "cudaDeviceSynchronize", "engine_step_wait"),
        frozenset({"other"}),
    ),
    "h200-demo-gpu-spin": Expect(None, "vllm", SIM_STACK, frozenset({"engine-core", "api-server"})),
    "h200-demo-gpu-spin-restart": Expect(
        None, "vllm", SIM_STACK, frozenset({"engine-core", "api-server"})
    ),
    "h200-nccl-one-gpu": Expect(
        None,
        "vllm",
        (
            "cuCtxSynchronize_v2",
            "cudaDeviceSynchronize",
            "c10::cuda::device_synchronize",
            "synchronize",
            "worker",
        ),
        frozenset({"other"}),
    ),
}


def view_of(name: str) -> BundleView:
    return read_bundle(REAL / name)


def test_every_real_bundle_has_an_expectation() -> None:
    assert sorted(p.name for p in REAL.iterdir() if p.is_dir()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_bundle_holds_what_the_h200_showed(name: str) -> None:
    exp = CASES[name]
    view = view_of(name)
    assert view.notes == ()
    assert view.engine == exp.engine
    assert view.gpus is not None
    assert [(g.index, g.classification) for g in view.gpus] == [(0, "spinning")]
    assert "H200" in view.gpus[0].name and view.gpus[0].util_pct == 100.0
    assert {p.role for p in view.procs} == exp.roles
    mains = [
        t for p in view.procs for t in (p.threads or ()) if t.active and t.name == "MainThread"
    ]
    assert mains, "no active main thread in the stacks"
    names = [f.name for f in mains[0].frames]
    at = [names.index(want) for want in exp.stack]
    assert at == sorted(at), names


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_bundle_matches_the_signature_meant_for_it_and_never_a_wrong_one(name: str) -> None:
    exp = CASES[name]
    matches = match_bundle(view_of(name), SIGS)
    assert [m.signature.id for m in reported(matches)] == ([exp.meant] if exp.meant else [])
    assert top_signature_id(matches) == (exp.meant or NO_MATCH)
    wrong = [(m.signature.id, m.kind) for m in reported(matches) if m.signature.id != exp.meant]
    assert wrong == []
    if exp.meant is None:
        # Not only the required rules keep them out: even counted without that gate, no
        # signature has the threshold's share of its evidence in these bundles (a negated
        # rule that holds adds nothing).
        for m in matches:
            got = sum(
                r.rule.weight for r in m.results if r.status == "matched" and not r.rule.negate
            )
            total = sum(r.weight for r in m.signature.rules if not r.negate)
            assert got / total < REPORT_THRESHOLD, m.signature.id


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_json_says_the_same(name: str) -> None:
    exp = CASES[name]
    res = CliRunner().invoke(explain_command, [str(REAL / name), "--json"])
    assert res.exit_code == 0, res.output
    listed = [m["id"] for m in json.loads(res.output)["known_hangs"]]
    assert listed == ([exp.meant] if exp.meant else [])
    text = CliRunner().invoke(explain_command, [str(REAL / name)])
    assert text.exit_code == 0
    if exp.meant is None:
        assert "Nothing in this bundle matches a known hang" in text.output


@pytest.mark.parametrize("name", ["h200-demo-gpu-spin", "h200-demo-gpu-spin-restart"])
def test_the_capture_on_the_device_said_the_same(name: str) -> None:
    """The watchdog matched the bundle as it wrote it, on the H200: manifest and summary.md."""
    manifest = json.loads((REAL / name / "manifest.json").read_text())
    assert manifest["known_hangs"] == []
    assert manifest["cause"] == "gpu-spin"
    summary = (REAL / name / "summary.md").read_text()
    assert "## Resembles known issues" in summary
    assert "Nothing in this bundle matches a known hang" in summary


def test_the_real_nccl_dumps_say_which_rank_never_joined() -> None:
    """PyTorch 2.11's own flight-recorder dumps (pickles, read without unpickling a class):
    rank 0 is in all_reduce 2, rank 1 never issued it. The summary written now and the upstream
    report both say so."""
    view = view_of("h200-nccl-one-gpu")
    got = [(c.rank, c.op, c.seq, c.state) for c in view.collectives or ()]
    assert got == [(0, "nccl:all_reduce", 2, "scheduled"), (1, "nccl:all_reduce", 1, "completed")]
    reading = "rank 1 never issued it (its last is 1): look at rank 1, the peer that never joined"
    assert reading in "\n".join(collectives_lines(view.collectives or ()))
    report = render_report(view, match_bundle(view, SIGS), SIGS)
    assert "**Collectives**" in report and reading in report
    section = known_hangs(
        REAL / "h200-nccl-one-gpu",
        json.loads((REAL / "h200-nccl-one-gpu" / "manifest.json").read_text()),
    ).collectives
    assert section.startswith("## Collectives (flight recorder)") and reading in section


def test_a_bundle_without_dumps_has_no_collectives_section() -> None:
    view = view_of("h200-demo-gpu-spin")
    assert view.collectives is None
    assert "**Collectives**" not in render_report(view, match_bundle(view, SIGS), SIGS)


def test_the_device_wrote_the_collectives_and_no_dump_thread() -> None:
    """The bundle as the H200 wrote it with both fixes: the stacks taken before the flight
    recorder woke PyTorch's dump thread (the first run's summary named that thread "in a
    collective"), and the ranks' last collectives in summary.md."""
    name = "h200-nccl-one-gpu"
    summary = (REAL / name / "summary.md").read_text()
    where = summary.split("## Where it is stuck", 1)[1].split("## What happened", 1)[0]
    assert "getCollectiveTrace" not in where and "main thread waiting in cuCtxSynchronize" in where
    assert "## Collectives (flight recorder)" in summary
    assert "rank 1 never issued it (its last is 1)" in summary
    assert json.loads((REAL / name / "manifest.json").read_text())["known_hangs"] == []
