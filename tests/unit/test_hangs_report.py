"""report.md: the engine's bug-template shape, the facts from the bundle, GitHub's size limit,
and no secret in it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine_watchdog.core.redact import redact_text
from engine_watchdog.hangs import (
    GITHUB_LIMIT,
    explain_bundle,
    load_signatures,
    match_bundle,
    read_bundle,
    render_report,
    write_report,
)
from engine_watchdog.hangs.timeline import last_progress, parse_exposition, points, rows

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "hangs"
SIGS = load_signatures()


def report_of(bundle: Path) -> str:
    view = read_bundle(bundle)
    return render_report(view, match_bundle(view, SIGS), SIGS)


def test_the_report_has_vllms_template_and_the_bundles_facts() -> None:
    text = report_of(FIXTURES / "vllm-sm12x-flashinfer-topk-sampler-hang")
    env, bug = text.index("### Your current environment"), text.index("### 🐛 Describe the bug")
    assert env < bug
    for fact in (
        "engine: vllm 0.21.0",
        "GPU: 1x NVIDIA GeForce RTX 5090",
        "NVIDIA driver: 595.45.04",
        "NCCL: not in the bundle",
        "vllm serve RedHatAI/Qwen3.6-35B-A3B-NVFP4",
        "cuEventSynchronize (libcuda.so.595.45.04)",
        "EngineCore main thread waiting in cuEventSynchronize",
        "vllm-sm12x-flashinfer-topk-sampler-hang",
        "VLLM_USE_FLASHINFER_SAMPLER=0",
        "Capture steps: py-spy ok",
    ):
        assert fact in text, fact
    assert "Trimmed" not in text and len(text) < GITHUB_LIMIT


def test_the_timeline_shows_the_rate_before_and_after_the_freeze() -> None:
    text = report_of(FIXTURES / "vllm-nvfp4-mtp-blackwell-stall")
    assert "| 2026-05-28 20:22:00Z | 8 | 24 | 50.0 |" in text
    assert "| 2026-05-28 20:22:20Z (after the freeze) | 1 | 54 | 0.0 |" in text
    assert "Last token progress: 2026-05-28 20:22:10Z" in text


def test_sglang_reports_use_sglangs_template() -> None:
    text = report_of(FIXTURES / "sglang-overlap-copy-done-hang")
    assert text.index("### Describe the bug") < text.index("### Environment")
    assert "--disable-overlap-schedule" in text  # the reported workaround
    assert "PID 203 sglang::scheduler_TP3: the same stacks as PID 200" in text


def test_the_watchdogs_actions_are_in_the_report_those_of_its_incident_only(
    tmp_path: Path,
) -> None:
    """The incident dir's history holds every incident's: the report lists its own. Before:
    the last 50 records whatever their incident, 9 of them written by the test suite, one
    "SIGKILL sent to engine core"."""
    b = tmp_path / "incidents" / "b"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest |= {"incident": "20260528T202640Z-0-no-progress", "target": "http://127.0.0.1:8000"}
    (b / "manifest.json").write_text(json.dumps(manifest))
    ours = {"t": 1780000010.0, "target": "http://127.0.0.1:8000", "action": "abort"}
    ours |= {"result": "failed", "detail": "engine still stuck after abort"}
    ours |= {"engine": "0", "incident": "20260528T202640Z-0-no-progress"}
    other_incident = ours | {"incident": "20260101T000000Z-0-stopped", "action": "restart"}
    other_target = ours | {"target": "http://127.0.0.1:9000", "detail": "another engine's"}
    old = {k: v for k, v in ours.items() if k not in ("engine", "incident")}
    old |= {"action": "restart", "detail": "SIGKILL sent to engine core [13725]"}
    records = (ours, other_incident, other_target, old)
    (b.parent / "actions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = report_of(b)
    row = "| 2026-05-28 20:26:50Z | http://127.0.0.1:8000 | abort | failed | engine still stuck"
    assert row in text
    assert "| restart |" not in text and "another engine's" not in text and "SIGKILL" not in text


def test_a_bundle_that_names_no_incident_lists_no_one_else_s_actions(tmp_path: Path) -> None:
    """Written before manifests named their incident (or on demand): the history beside it is
    other incidents', so none of it is listed as tried."""
    b = tmp_path / "incidents" / "b"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    assert "incident" not in json.loads((b / "manifest.json").read_text())
    rec = {"t": 1780000010.0, "target": "t", "action": "restart", "result": "ok"}
    rec |= {"detail": "SIGKILL sent to engine core [1]"}
    (b.parent / "actions.jsonl").write_text(json.dumps(rec) + "\n")
    text = report_of(b)
    assert "SIGKILL" not in text and "the bundle names no incident" in text


def huge_bundle(tmp_path: Path) -> Path:
    b = tmp_path / "huge"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    frames = [
        {
            "name": f"f{i}",
            "filename": f"/x/mod{i}.py",
            "module": None,
            "short_filename": f"mod{i}.py",
            "line": i + 1,
        }
        for i in range(120)
    ]
    for pid in range(300, 308):
        threads = [
            {
                "os_thread_id": pid * 1000 + t,
                "thread_name": f"t{t}",
                "active": False,
                "frames": frames[t:],
            }
            for t in range(60)
        ]
        (b / "pyspy" / f"{pid}.json").write_text(json.dumps(threads))
    (b / "engine.log").write_text(("y" * 900 + "\n") * 4000)
    scrape = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:generation_tokens_total{engine="0"} %d\n'
    )
    with (b / "timeline.jsonl").open("w") as f:
        for i in range(3000):
            f.write(
                json.dumps({"t": 1780000000.0 + i, "kind": "scrape", "body": scrape % min(i, 2000)})
                + "\n"
            )
    with (b.parent / "actions.jsonl").open("w") as f:
        for i in range(2000):
            f.write(
                json.dumps(
                    {
                        "t": 1780000000.0 + i,
                        "target": "t",
                        "action": "restart",
                        "result": "ok",
                        "detail": "z" * 150,
                    }
                )
                + "\n"
            )
    return b


def test_a_huge_bundle_stays_under_githubs_limit_and_says_what_it_cut(tmp_path: Path) -> None:
    text = report_of(huge_bundle(tmp_path))
    assert len(text) <= GITHUB_LIMIT
    assert "_Trimmed to fit GitHub's 65,536-character limit: left out" in text
    assert "engine log lines beyond" in text or "the engine log" in text
    assert "vllm-mtp-engine-core-waits-on-workers" in text  # the match survives the trimming
    assert "### 🐛 Describe the bug" in text and "**Where it is stuck**" in text


def test_even_an_absurd_bundle_is_cut_at_the_limit(tmp_path: Path) -> None:
    b = tmp_path / "absurd"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    procs = json.loads((b / "processes.json").read_text())
    procs[0]["cmdline"] = ["vllm", "serve"] + ["--x" + "w" * 300] * 400
    (b / "processes.json").write_text(json.dumps(procs))
    text = report_of(b)
    assert len(text) <= GITHUB_LIMIT and "the rest is in the bundle" in text


SECRETS = ("sk-1234567890abcdefghij", "hf_abcdefghijklmnopqrstuv", "hunter2pw", "s3cr3tvalue")


def test_no_secret_reaches_the_report(tmp_path: Path) -> None:
    """A bundle from an older or foreign writer, not redacted: the report still hides them."""
    b = tmp_path / "leaky"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    procs = json.loads((b / "processes.json").read_text())
    procs[0]["cmdline"] += [
        "--api-key",
        SECRETS[0],
        "--hf-token=" + SECRETS[1],
        "--kv-transfer-config",
        "https://user:hunter2pw@example.com/x",
    ]
    (b / "processes.json").write_text(json.dumps(procs))
    with (b / "engine.log").open("a") as f:
        f.write(f"HF_TOKEN={SECRETS[1]} AWS_SECRET_ACCESS_KEY={SECRETS[3]}\n")
        f.write(f"Authorization: Bearer {SECRETS[0]}\n")
        f.write(f"--api-key {SECRETS[3]} --max-num-batched-tokens 8192\n")
    text = report_of(b)
    assert not [s for s in SECRETS if s in text]
    assert "--max-num-batched-tokens 8192" in text  # counts are not secrets


def test_scrub_keeps_what_is_not_secret() -> None:
    assert redact_text("TOKENIZERS_PARALLELISM=false --max-num-batched-tokens 8192") == (
        "TOKENIZERS_PARALLELISM=false --max-num-batched-tokens 8192"
    )
    assert redact_text("--api-key abc123 --port 8000") == "--api-key <redacted> --port 8000"


def test_write_report_and_explain(tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(FIXTURES / "vllm-ray-pp-shm-deadlock", b)
    out = write_report(b)
    assert out == b / "report.md" and out.stat().st_mode & 0o777 == 0o600
    section, matches = explain_bundle(b)
    assert "vllm-ray-pp-shm-deadlock" in section and matches[0].reported


def test_the_exposition_parser_sums_ranks_and_skips_noise() -> None:
    body = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        'vllm:num_requests_running_other{engine="1"} 100\n'
        "vllm:generation_tokens_total 7 1780000000\n"
        'vllm:num_requests_waiting{engine="0"} NaN\n'
    )
    got = parse_exposition(
        body,
        ["vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:num_requests_waiting"],
    )
    assert got == {"vllm:num_requests_running": 5.0, "vllm:generation_tokens_total": 7.0}
    recs = [
        {"t": float(t), "kind": "scrape", "body": f"vllm:generation_tokens_total {tok}\n"}
        for t, tok in ((0, 0), (10, 100), (20, 100))
    ]
    pts = points(recs, "vllm")
    assert [r.rate for r in rows(pts)] == [None, 10.0, 0.0] and last_progress(pts) == 10.0


SECRET_FIXTURES = Path(__file__).resolve().parents[1] / "data" / "bad_input" / "secrets.json"


def test_the_hardening_secret_fixtures_never_reach_the_report(tmp_path: Path) -> None:
    """Every form of the secret corpus (tests/data/bad_input/secrets.json), put unredacted into
    every file the report reads (command line, environment, log, timeline): none of them is in
    report.md."""
    fixtures = json.loads(SECRET_FIXTURES.read_text())
    b = tmp_path / "foreign"
    shutil.copytree(FIXTURES / "vllm-mtp-engine-core-waits-on-workers", b)
    procs = json.loads((b / "processes.json").read_text())
    procs[0]["cmdline"] += fixtures["engine_argv"]
    procs[0]["title"] = " ".join(fixtures["shell_argv"])
    (b / "processes.json").write_text(json.dumps(procs))
    with (b / "engine.log").open("a") as f:
        f.write(" ".join(fixtures["engine_argv"]) + "\n" + " ".join(fixtures["env_prefix"]) + "\n")
        f.write(f"connecting to http://{fixtures['target_userinfo']}@127.0.0.1:8000/v1\n")
    with (b / "timeline.jsonl").open("a") as f:
        detail = f"http://{fixtures['target_userinfo']}@127.0.0.1:8000/metrics: timeout"
        f.write(json.dumps({"t": 1.0, "kind": "scrape", "detail": detail}))
    text = report_of(b)
    assert [s for s in fixtures["secrets"] if s in text] == []
