"""The bundle writer: atomic placement, permissions, manifest, step isolation, retention."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import shutil
import stat
import tarfile
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest

from engine_watchdog.capture.bundle import (
    BundleError,
    BundleSettings,
    bundle_name,
    write_bundle,
)
from engine_watchdog.capture.evidence import log_tail
from engine_watchdog.capture.manifest import SCHEMA_VERSION
from engine_watchdog.capture.retention import new_tmp_dir, prune, release
from engine_watchdog.capture.step import CaptureContext, StepResult
from engine_watchdog.core.model import Cause, ProcInfo, State, Verdict, incident_id
from engine_watchdog.core.redact import REDACTED, is_secret_name, redact_argv, redact_env
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.host.tools import write_private

T0 = 1796018400.0  # 2026-11-30T06:00:00Z
CORE = ProcInfo(
    pid=4242, ppid=1, role="engine-core", title="VLLM::EngineCore", state="stopped", cpu_s=1.5
)
VERDICT = Verdict(t=T0, engine="0", state=State.STALLED, cause=Cause.STOPPED, since=T0 - 10)


def settings(tmp_path: Path, **kw: object) -> BundleSettings:
    """Bundle settings for tests; keyword arguments that are CaptureSettings fields go there."""
    capture_fields = {f.name for f in fields(CaptureSettings)}
    capture = {k: v for k, v in kw.items() if k in capture_fields}
    capture.setdefault("incident_dir", tmp_path / "inc")
    base: dict[str, object] = {
        "tools": {},
        "proc_root": tmp_path / "proc",
        "clock": lambda: T0,
    }
    base.update({k: v for k, v in kw.items() if k not in capture_fields})
    return BundleSettings(CaptureSettings(**capture), **base)  # type: ignore[arg-type]


async def ok_step(ctx: CaptureContext) -> StepResult:
    (ctx.workdir / "gpu").mkdir()
    # Written with the umask on purpose: the writer must lock it down.
    (ctx.workdir / "gpu" / "snapshot.json").write_text('{"gpus": []}')
    return StepResult("gpu", "ok", ("gpu/snapshot.json",), "1 GPU")


async def crashing_step(ctx: CaptureContext) -> StepResult:
    raise RuntimeError("bug in a step")


async def hanging_step(ctx: CaptureContext) -> StepResult:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def fake_proc(root: Path, pid: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(
        b"vllm\0serve\0m\0--api-key\0sk-123\0--max-num-batched-tokens\08192\0--hf-token=hf_abc\0"
    )
    (d / "environ").write_bytes(
        b"HF_TOKEN=hf_abc\0PATH=/bin\0TOKENIZERS_PARALLELISM=false\0"
        b"DB=postgres://u:pw@db/x\0AWS_SECRET_ACCESS_KEY=x\0"
    )


async def test_bundle_layout_manifest_and_permissions(tmp_path: Path) -> None:
    fake_proc(tmp_path / "proc", 4242)
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(10000)))
    s = settings(tmp_path, engine_log=log, log_tail_bytes=100)
    timeline = [{"t": T0 - 5, "kind": "scrape", "running": 6}, {"t": T0, "state": "stalled"}]
    res = await write_bundle(s, VERDICT, [CORE], timeline, [ok_step, crashing_step])
    # Named by its incident, as the log lines and action records name it (since: T0 - 10 s).
    assert res.path == tmp_path / "inc" / "20261130T055950Z-0-stopped"
    assert res.path.name == incident_id(VERDICT)
    assert leftovers(tmp_path / "inc") == [res.path.name]  # no temporary directory left
    m = json.loads((res.path / "manifest.json").read_text())
    assert m["incident"] == res.path.name
    assert (m["schema_version"], m["engine"], m["cause"]) == (SCHEMA_VERSION, "vllm", "stopped")
    assert m["verdict"]["state"] == "stalled" and m["trigger"] == "verdict"
    steps = {st["name"]: st for st in m["steps"]}
    assert steps["gpu"]["status"] == "ok"
    assert steps["crashing_step"]["status"] == "failed"
    assert "bug in a step" in steps["crashing_step"]["detail"]
    files = {f["path"]: f for f in m["files"]}
    assert {
        "summary.md",
        "processes.json",
        "versions.json",
        "timeline.jsonl",
        "engine.log",
        "gpu/snapshot.json",
    } <= set(files)
    for rel, f in files.items():
        data = (res.path / rel).read_bytes()
        assert (f["size"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert files["gpu/snapshot.json"]["step"] == "gpu"
    for p in [res.path, *res.path.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), p
    assert (res.path / "engine.log").read_text().startswith("line ")
    assert len((res.path / "engine.log").read_bytes()) <= 100
    assert (res.path / "timeline.jsonl").read_text().count("\n") == 2


async def test_secrets_are_redacted(tmp_path: Path) -> None:
    fake_proc(tmp_path / "proc", 4242)
    res = await write_bundle(settings(tmp_path), None, [CORE], [], [])
    text = (res.path / "processes.json").read_text()
    assert "sk-123" not in text and "hf_abc" not in text and "pw@" not in text
    rec = json.loads(text)[0]
    assert rec["cmdline"][4:7] == [REDACTED, "--max-num-batched-tokens", "8192"]
    assert rec["environ"]["TOKENIZERS_PARALLELISM"] == "false"
    assert rec["environ"]["AWS_SECRET_ACCESS_KEY"] == REDACTED


async def test_unreadable_process_is_recorded_not_fatal(tmp_path: Path) -> None:
    res = await write_bundle(settings(tmp_path), None, [CORE], [], [])
    rec = json.loads((res.path / "processes.json").read_text())[0]
    assert "cmdline_error" in rec and "environ_error" in rec
    assert res.path.name.endswith("-vllm-manual")


async def test_hanging_step_times_out_and_others_go_on(tmp_path: Path) -> None:
    s = settings(tmp_path, step_timeout_s=0.5, step_grace_s=0.2)
    t0 = time.monotonic()
    res = await write_bundle(s, VERDICT, [CORE], [], [hanging_step, ok_step])
    assert time.monotonic() - t0 < 5
    assert [(r.name, r.status) for r in res.steps] == [("hanging_step", "timeout"), ("gpu", "ok")]


async def test_a_destructive_bundle_ends_the_process_only_after_the_other_steps(
    tmp_path: Path,
) -> None:
    """The CUDA core dump ends the process: in the restart's bundle the stacks come first (on
    an H200 a concurrent py-spy found the engine core already gone)."""
    alive = True
    seen: list[str] = []

    async def stacks(ctx: CaptureContext) -> StepResult:
        await asyncio.sleep(0.2)
        seen.append(f"stacks of a {'live' if alive else 'dead'} process")
        return StepResult("py-spy", "ok")

    async def core_dump(ctx: CaptureContext) -> StepResult:
        nonlocal alive
        alive = False
        return StepResult("cuda-coredump", "ok")

    res = await write_bundle(
        settings(tmp_path, destructive=True), VERDICT, [CORE], [], [stacks, core_dump]
    )
    assert seen == ["stacks of a live process"]
    assert [r.name for r in res.steps] == ["py-spy", "cuda-coredump"]


async def test_the_steps_never_act_on_an_orphan_that_may_be_another_engines(
    tmp_path: Path,
) -> None:
    """An orphan beside the engine's server (probes/procs.py) is in the bundle's records, never
    in what a step attaches to, signals or ends (the CUDA core dump ends its process)."""
    orphan = replace(CORE, pid=4343, orphan=True)
    given: list[tuple[int, ...]] = []

    async def core_dump(ctx: CaptureContext) -> StepResult:
        given.append(tuple(p.pid for p in ctx.procs))
        return StepResult("cuda-coredump", "ok")

    for pid in (CORE.pid, orphan.pid):
        fake_proc(tmp_path / "proc", pid)
    res = await write_bundle(
        settings(tmp_path, destructive=True), VERDICT, [CORE, orphan], [], [core_dump]
    )
    assert given == [(CORE.pid,)]
    records = json.loads((res.path / "processes.json").read_text())
    assert {r["pid"] for r in records} == {CORE.pid, orphan.pid}


async def test_stacks_are_taken_before_the_flight_recorder_wakes_the_engine(
    tmp_path: Path,
) -> None:
    """The flight-recorder trigger makes PyTorch's dump thread run in the engine: on an H200 a
    concurrent py-spy caught that thread mid-dump and the summary called it "in a collective".
    The stacks and the GPU come first; the results keep the steps' order."""
    woken = False
    seen: list[str] = []

    async def stacks(ctx: CaptureContext) -> StepResult:
        await asyncio.sleep(0.2)
        seen.append("dump thread running" if woken else "engine as the stall left it")
        return StepResult("py-spy", "ok")

    async def flight_recorder(ctx: CaptureContext) -> StepResult:
        nonlocal woken
        woken = True
        return StepResult("flight-recorder", "ok")

    flight_recorder.__name__ = "flight-recorder"
    res = await write_bundle(settings(tmp_path), VERDICT, [CORE], [], [flight_recorder, stacks])
    assert seen == ["engine as the stall left it"]
    assert [r.name for r in res.steps] == ["flight-recorder", "py-spy"]


async def test_disk_full_in_a_step_leaves_nothing(tmp_path: Path) -> None:
    async def filling_step(ctx: CaptureContext) -> StepResult:
        write_private(ctx.workdir / "big.bin", b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(BundleError, match=r"no space left.*nothing was kept"):
        await write_bundle(settings(tmp_path), VERDICT, [CORE], [], [ok_step, filling_step])
    assert leftovers(tmp_path / "inc") == []


async def test_cancelled_capture_leaves_nothing(tmp_path: Path) -> None:
    inside = asyncio.Event()

    async def hanging_once_inside(ctx: CaptureContext) -> StepResult:
        inside.set()  # the bundle's work dir exists now: the cancel must clean it up
        return await hanging_step(ctx)

    steps = [hanging_once_inside]
    task = asyncio.create_task(write_bundle(settings(tmp_path), None, [CORE], [], steps))
    await asyncio.wait_for(inside.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(tmp_path / "inc") == []


async def test_an_unwritable_incident_dir_sends_the_bundle_elsewhere_and_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Never lost in silence: a private temporary folder takes it, and a log line names it."""
    (tmp_path / "file").write_text("")
    wanted = tmp_path / "file" / "x"
    res = await write_bundle(settings(tmp_path, incident_dir=wanted), None, [CORE], [], [])
    try:
        assert res.path.parent != wanted and (res.path / "manifest.json").is_file()
        assert stat.S_IMODE(res.path.parent.stat().st_mode) == 0o700
        said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert said == [
            f"cannot write bundles in {wanted} (Not a directory): this bundle goes to "
            f"{res.path.parent} instead; give --incident-dir a folder this user may write"
        ]
    finally:
        shutil.rmtree(res.path.parent)


async def test_tar_bundle(tmp_path: Path) -> None:
    res = await write_bundle(settings(tmp_path, tar=True), VERDICT, [CORE], [], [ok_step])
    assert res.path.name == "20261130T055950Z-0-stopped.tar.gz"
    assert leftovers(tmp_path / "inc") == [res.path.name]
    assert stat.S_IMODE(res.path.stat().st_mode) == 0o600
    with tarfile.open(res.path) as tar:
        names = tar.getnames()
    assert "20261130T055950Z-0-stopped/manifest.json" in names
    assert "20261130T055950Z-0-stopped/gpu/snapshot.json" in names


async def test_same_second_gets_a_suffix(tmp_path: Path) -> None:
    a = await write_bundle(settings(tmp_path), VERDICT, [CORE], [], [])
    b = await write_bundle(settings(tmp_path), VERDICT, [CORE], [], [])
    assert b.path.name == a.path.name + "-2"


def make_bundle(root: Path, name: str, size: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "blob").write_bytes(b"x" * size)


def test_retention_by_count_and_size(tmp_path: Path) -> None:
    names = [bundle_name(T0 + i * 60, "vllm", "stopped") for i in range(5)]
    for n in names:
        make_bundle(tmp_path, n, 1000)
    (tmp_path / "notes.txt").write_text("not a bundle")
    assert prune(tmp_path, keep_count=3, keep_bytes=10**9, keep=names[-1]) == names[:2]
    assert prune(tmp_path, keep_count=10, keep_bytes=1500, keep=names[-1]) == names[2:4]
    assert leftovers(tmp_path) == sorted([names[-1], "notes.txt"])
    # The bundle just written stays even when it alone is over the budget.
    assert prune(tmp_path, keep_count=0, keep_bytes=0, keep=names[-1]) == []


def test_retention_removes_temporaries_no_live_writer_holds(tmp_path: Path) -> None:
    """A writer killed mid-bundle leaves its .tmp-* unlocked (the kernel drops its lock); a
    live writer's, here one of this very process, stays, and so does a .new-* younger than
    an hour (a writer between creating and locking it)."""
    abandoned = tmp_path / ".tmp-dead-writer"
    abandoned.mkdir()
    live = new_tmp_dir(tmp_path, "live-writer")
    (tmp_path / ".new-0000").mkdir()
    try:
        prune(tmp_path, 10, 10**9, keep="")
        assert leftovers(tmp_path) == [".new-0000", live.name]
    finally:
        release(live)
    prune(tmp_path, 10, 10**9, keep="")
    assert leftovers(tmp_path) == [".new-0000"]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("api-key", True),
        ("OPENAI_APIKEY", True),
        ("DB_PASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("AUTHORIZATION", True),
        ("PATH", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("max-num-batched-tokens", False),
        ("VLLM_MAX_TOKENS_SECRET", True),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_redaction_helpers() -> None:
    assert redact_argv(["--api-key", "x", "--port", "1", "--hf-token=y", "--auth-header"]) == [
        "--api-key",
        REDACTED,
        "--port",
        "1",
        f"--hf-token={REDACTED}",
        "--auth-header",
    ]
    assert redact_env({"URL": "https://u:p@h/x", "A": "b"}) == {
        "A": "b",
        "URL": f"https://{REDACTED}@h/x",
    }


def test_log_tail_starts_on_a_line(tmp_path: Path) -> None:
    log = tmp_path / "l"
    log.write_bytes(b"aaaa\nbbbb\ncccc\n")
    assert log_tail(log, 7) == b"cccc\n"
    assert log_tail(log, 1000) == b"aaaa\nbbbb\ncccc\n"


async def test_large_files_do_not_block_the_event_loop(tmp_path: Path) -> None:
    async def big_step(ctx: CaptureContext) -> StepResult:
        await asyncio.to_thread((ctx.workdir / "core.bin").write_bytes, os.urandom(1 << 20) * 64)
        return StepResult("core", "ok", ("core.bin",))

    lags: list[float] = []

    async def ticker() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - t - 0.01)

    tick = asyncio.create_task(ticker())
    try:
        res = await write_bundle(settings(tmp_path), None, [CORE], [], [big_step])
    finally:
        tick.cancel()
    assert json.loads((res.path / "manifest.json").read_text())["files"][0]["size"] == 64 << 20
    # Hashing and moving 64 MB takes a while; the loop must keep ticking meanwhile.
    assert max(lags) < 0.5, max(lags)
