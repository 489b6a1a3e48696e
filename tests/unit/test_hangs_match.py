"""Matching fixture bundles (tests/data/hangs/<id>, shaped on each signature's upstream report)
against the shipped signatures, and staying upright on broken or hostile bundles."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from engine_watchdog.hangs import (
    NO_MATCH,
    BundleNotFound,
    label_values,
    load_signatures,
    match_bundle,
    read_bundle,
    render_report,
    reported,
    section_markdown,
    top_signature_id,
)
from tests.data.hangs.build import write_bundle
from tests.data.hangs.specs_multinode import NEAR_MISSES

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "hangs"
SIGS = load_signatures()
IDS = SIGS.ids()


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


EVAL = FIXTURES.parent / "hangs_eval"


def test_every_signature_has_a_fixture_or_an_evaluation_case() -> None:
    """A fixture shaped on the cited report (tests/data/hangs), or a positive case made only from
    a report the catalog does not cite (tests/data/hangs_eval)."""
    fixtures = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    index = json.loads((EVAL / "index.json").read_text())
    positives = {c["expect"] for c in index.values() if c["kind"] == "positive"}
    assert set(IDS) <= fixtures | positives


WITH_FIXTURE = tuple(i for i in IDS if (FIXTURES / i).is_dir())


@pytest.mark.parametrize("sig_id", WITH_FIXTURE)
def test_each_fixture_matches_its_own_signature_and_no_other(sig_id: str) -> None:
    matches = match_bundle(read_bundle(FIXTURES / sig_id), SIGS)
    assert matches[0].signature.id == sig_id
    assert matches[0].reported, matches[0].gate
    assert matches[0].kind == "match", matches[0].headline()
    # Below it, another signature may be a possible match (its deciding evidence absent from
    # the fixture), never a match.
    others = [(m.signature.id, m.confidence) for m in matches[1:] if m.kind == "match"]
    assert others == []
    assert top_signature_id(matches) == sig_id
    # The evidence names the file and what matched in it.
    assert all(e.file and e.detail for r in matches[0].matched for e in r.evidence)


def test_evidence_names_the_frame_the_line_and_the_flag() -> None:
    m = match_bundle(read_bundle(FIXTURES / "vllm-mtp-engine-core-waits-on-workers"), SIGS)[0]
    details: dict[str, list[str]] = {}
    for r in m.matched:
        details.setdefault(r.rule.kind, []).extend(e.detail for e in r.evidence)
    assert "step_with_batch_queue (vllm/v1/engine/core.py:523)" in details["frame"][0]
    assert "pyspy/200.json" in [e.file for r in m.matched for e in r.evidence]
    assert "RPC call to sample_tokens timed out" in " ".join(details["log"])
    assert any("--speculative-config" in d for d in details["flag"])


def test_a_bundle_that_matches_nothing_says_so() -> None:
    matches = match_bundle(read_bundle(FIXTURES / "no-match-sigstop-cpu"), SIGS)
    assert reported(matches) == [] and top_signature_id(matches) == NO_MATCH
    text = section_markdown(matches, SIGS)
    assert text.startswith("## Resembles known issues")
    assert "Nothing in this bundle matches a known hang" in text
    assert f"{len(IDS)} signatures" in text


def test_the_label_is_bounded_by_the_signature_file() -> None:
    values = label_values(SIGS)
    assert len(values) == 2 * len(IDS) + 1 and values[-1] == "none"
    assert len(set(values)) == len(values)
    assert {f"possible:{i}" for i in IDS} <= set(values)


def test_the_workaround_flag_removes_the_match(tmp_path: Path) -> None:
    b = copy_fixture("vllm-custom-allreduce-rank-hang", tmp_path)
    procs = json.loads((b / "processes.json").read_text())
    procs[0]["cmdline"].append("--disable-custom-all-reduce")
    (b / "processes.json").write_text(json.dumps(procs))
    m = next(
        x
        for x in match_bundle(read_bundle(b), SIGS)
        if x.signature.id == "vllm-custom-allreduce-rank-hang"
    )
    assert m.confidence == 0.0 and "required" in m.gate


def test_another_engine_is_not_matched(tmp_path: Path) -> None:
    b = copy_fixture("sglang-overlap-copy-done-hang", tmp_path)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["engine"] = "vllm"
    (b / "manifest.json").write_text(json.dumps(manifest))
    m = next(
        x
        for x in match_bundle(read_bundle(b), SIGS)
        if x.signature.id == "sglang-overlap-copy-done-hang"
    )
    assert m.confidence == 0.0 and "this bundle is vllm" in m.gate


def test_missing_files_leave_rules_unknown_not_errors(tmp_path: Path) -> None:
    b = copy_fixture("vllm-sm12x-flashinfer-topk-sampler-hang", tmp_path)
    shutil.rmtree(b / "pyspy")
    for name in ("gpu.json", "engine.log", "processes.json", "summary.md", "timeline.jsonl"):
        (b / name).unlink()
    view = read_bundle(b)
    m = next(
        x
        for x in match_bundle(view, SIGS)
        if x.signature.id == "vllm-sm12x-flashinfer-topk-sampler-hang"
    )
    assert not m.reported and {r.status for r in m.results} == {"unknown"}
    assert "## Resembles known issues" in section_markdown(match_bundle(view, SIGS), SIGS)
    assert "not in the bundle" in render_report(view, match_bundle(view, SIGS), SIGS)


def test_the_gpu_rule_reads_the_split(tmp_path: Path) -> None:
    """vllm #8395's discriminator: one GPU idle while its peers spin; without it, no match."""
    b = copy_fixture("vllm-v0-driver-scheduler-spin", tmp_path)
    snap = json.loads((b / "gpu.json").read_text())
    for g in snap["gpus"]:
        g["classification"] = "spinning"
    (b / "gpu.json").write_text(json.dumps(snap))
    assert top_signature_id(match_bundle(read_bundle(b), SIGS)) == NO_MATCH


HOSTILE = {
    "manifest.json": b"{not json",
    "processes.json": json.dumps({"pid": "x"}).encode(),
    "gpu.json": b"[" * 100_000,
    "versions.json": b"\xff\xfe garbage",
    "timeline.jsonl": b'{"t": "x", "kind": "scrape", "body": 5}\nnot json\n[1,2]\n',
    "pyspy/12.json": json.dumps(
        [{"frames": None}, {"frames": [{"line": "abc", "name": None}]}, 7]
    ).encode(),
    "pyspy/13.json": json.dumps({"not": "a list"}).encode(),
    "flight_recorder/rank0_dump": pickle.dumps({"entries": [{"profiling_name": os.system}]}),
    "flight_recorder/rank1_dump": b"\x80\x04garbage",
}


def test_hostile_files_never_raise(tmp_path: Path) -> None:
    b = tmp_path / "hostile"
    for rel, data in HOSTILE.items():
        (b / rel).parent.mkdir(parents=True, exist_ok=True)
        (b / rel).write_bytes(data)
    view = read_bundle(b)
    notes = " ".join(view.notes)
    assert "manifest.json: not valid JSON" in notes and "gpu.json: not valid JSON" in notes
    assert "refused global" in notes  # the pickle with a callable was not unpickled
    assert "rank1_dump: not read" in notes and "timeline.jsonl: 2 unreadable" in notes
    matches = match_bundle(view, SIGS)
    assert top_signature_id(matches) == NO_MATCH
    assert len(render_report(view, matches, SIGS)) < 65536


def test_fifos_and_links_are_not_read(tmp_path: Path) -> None:
    b = copy_fixture("vllm-multinode-shm-reader-stall", tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("No available shared memory broadcast block found\n")
    (b / "engine.log").unlink()
    os.symlink(secret, b / "engine.log")
    (b / "gpu.json").unlink()
    os.mkfifo(b / "gpu.json")
    view = read_bundle(b)  # a FIFO opened for reading would block forever
    assert view.log is None and view.gpus is None
    assert any("engine.log: not read (a symbolic link)" in n for n in view.notes)
    assert any("gpu.json: not read" in n for n in view.notes)


def test_a_huge_log_is_read_from_its_end(tmp_path: Path) -> None:
    b = copy_fixture("vllm-multinode-shm-reader-stall", tmp_path)
    line = b"x" * 1000 + b"\n"
    with (b / "engine.log").open("ab") as f:
        f.write(line * 5000)  # ~5 MB, over the 4 MiB cap
        f.write(b"No available shared memory broadcast block found in 60 seconds.\n")
    view = read_bundle(b)
    assert any("engine.log: larger than 4 MiB" in n for n in view.notes)
    assert top_signature_id(match_bundle(view, SIGS)) == "vllm-multinode-shm-reader-stall"


def test_a_path_that_is_not_a_bundle_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BundleNotFound, match="No such file"):
        read_bundle(tmp_path / "absent")
    (tmp_path / "f.tar.gz").write_bytes(b"")
    with pytest.raises(BundleNotFound, match=r"unpack a \.tar\.gz first"):
        read_bundle(tmp_path / "f.tar.gz")


def test_py_spy_04_qualified_names_match_too(tmp_path: Path) -> None:
    """py-spy 0.4 names frames ``MultiprocExecutor.collective_rpc.<locals>.get_response`` (seen
    on the real vLLM here); the reports quote ``get_response``. Both match."""
    b = copy_fixture("vllm-mtp-engine-core-waits-on-workers", tmp_path)
    qualified = {
        "get_response": "MultiprocExecutor.collective_rpc.<locals>.get_response",
        "step_with_batch_queue": "EngineCore.step_with_batch_queue",
        "acquire_read": "MessageQueue.acquire_read",
    }
    threads = json.loads((b / "pyspy" / "200.json").read_text())
    for f in threads[0]["frames"]:
        f["name"] = qualified.get(f["name"], f["name"])
    (b / "pyspy" / "200.json").write_text(json.dumps(threads))
    assert (
        top_signature_id(match_bundle(read_bundle(b), SIGS))
        == "vllm-mtp-engine-core-waits-on-workers"
    )


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_a_near_miss_is_not_reported_as_the_signature_it_resembles(
    name: str, tmp_path: Path
) -> None:
    """The same bundle with the one thing changed that the report says avoids the hang (eager
    mode, NCCL 2.30.4, NCCL_P2P_DISABLE=1) or that tells it from a neighbour."""
    sig_id, spec = NEAR_MISSES[name]
    write_bundle(tmp_path / name, copy.deepcopy(spec))
    matches = {m.signature.id: m for m in match_bundle(read_bundle(tmp_path / name), SIGS)}
    assert not matches[sig_id].reported, (name, matches[sig_id].confidence)


def test_the_nccl_version_rule_reads_the_engine_log() -> None:
    m = next(
        m
        for m in match_bundle(
            read_bundle(FIXTURES / "nccl-2289-cross-node-cudagraph-deadlock"), SIGS
        )
        if m.signature.id == "nccl-2289-cross-node-cudagraph-deadlock"
    )
    details = [e.detail for r in m.matched for e in r.evidence]
    assert "NCCL version 2.28.9" in details
