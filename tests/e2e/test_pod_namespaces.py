"""The sidecar's promise, proved with the kernel's own mechanisms: a real vLLM (CPU) and the
watchdog in one new PID namespace, the engine as a non-root UID, the watchdog as the same UID
with exactly what the manifests grant, and no_new_privs (tests/tools/pod.py).

- ptrace variant (components/ptrace): the watchdog keeps CAP_SYS_PTRACE and nothing else;
- Baseline variant (components/baseline-fallback): no capability at all, same UID;
- and, on the second engine before the Baseline run, a watchdog of another UID: what a node
  whose kernel refuses ptrace (yama.ptrace_scope above 0, or the UIDs differ) looks like.

In each: SIGSTOP of the engine core is stalled (stopped), a bundle is captured (native stacks
where ptrace is allowed, the refusal and its fix recorded where it is not), and the restart
ends only the watched engine: a second engine in the same PID namespace, of the same UID, with
the same process titles, is still running afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.cli import CONSOLE_SCRIPT
from tests.tools.pod import (
    CAP_SYS_PTRACE_BIT,
    Container,
    Pod,
    capabilities,
    ptrace_scope,
    tools_missing,
)
from tests.tools.vllm_env import VllmEnv
from tests.tools.vllm_server import (
    ENGINE_CORE_TITLE,
    SERVED_MODEL,
    http_get,
    process_title,
    server_argv,
    server_env,
)
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

ENGINE_UID = 1000
OTHER_UID = 1001
READY_S = 300.0
VERDICT_S = 60.0
STALL_S = "10"
FINDINGS: list[str] = []


@pytest.fixture(scope="module")
def pod_dir() -> Iterator[Path]:
    """World-readable scratch: pytest's own tmp is private to root, the pod's UIDs need in."""
    reason = tools_missing()
    if reason:
        pytest.skip(f"no pod here: {reason}")
    path = Path(tempfile.mkdtemp(prefix="engine-watchdog-pod-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def private_dir(parent: Path, name: str, uid: int) -> Path:
    path = parent / name
    path.mkdir(mode=0o700)
    os.chown(path, uid, uid)
    return path


def compile_cache(uid: int) -> Path:
    """vLLM's torch.compile cache for ``uid``, kept between runs (a cold compile is ~1 min)."""
    path = Path(tempfile.gettempdir()) / f"engine-watchdog-vllm-cache-{uid}"
    path.mkdir(mode=0o700, exist_ok=True)
    os.chown(path, uid, uid)
    return path


async def start_engines(pod: Pod, env: VllmEnv, work: Path) -> tuple[Container, str, Container]:
    """The watched vLLM, and a bystander engine (the simulator: same UID, same titles)."""
    port = free_port()
    other = next(p for p in iter(free_port, None) if p != port)  # two of one port: one answers
    home = private_dir(work, "home", ENGINE_UID)
    engine_env = server_env({"HOME": str(home), "VLLM_CACHE_ROOT": str(compile_cache(ENGINE_UID))})
    vllm = pod.run("vllm", server_argv(env, port), ENGINE_UID, env=engine_env)
    sim = [str(Path(CONSOLE_SCRIPT).with_name("python")), "-m", "engine_watchdog.sim"]
    bystander = pod.run("bystander", [*sim, "--port", str(other)], ENGINE_UID)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    # Serving the model, not merely answering: a port the bystander took would answer too.
    while f'"{SERVED_MODEL}"' not in http_get(url + "/v1/models", timeout=2)[1]:
        assert vllm.proc.poll() is None, vllm.log_tail()
        assert time.monotonic() < deadline, f"vLLM not serving in {READY_S:.0f} s"
        await asyncio.sleep(1.0)
    return vllm, url, bystander


def watchdog(pod: Pod, url: str, work: Path, uid: int, caps: tuple[str, ...], name: str) -> Any:
    incidents = private_dir(work, f"incidents-{name}", uid)
    argv = [str(CONSOLE_SCRIPT), "watch", url, "--json", "--listen", "", "--no-gpu"]
    argv += ["--action", "capture,restart", "--stall-seconds", STALL_S]
    argv += ["--incident-dir", str(incidents), "--restart-backoff", "0"]
    return pod.run(name, argv, uid, caps=caps, env={"PATH": os.environ["PATH"]}), incidents


def transitions(container: Container) -> list[dict[str, Any]]:
    out = []
    for line in container.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if "state" in doc:
                out.append(doc)
    return out


async def wait_for(container: Container, state: str, cause: str | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + VERDICT_S
    while time.monotonic() < deadline:
        for doc in transitions(container):
            if doc["state"] == state and cause in (None, doc["cause"]):
                return doc
        assert container.proc.poll() is None, container.log_tail()
        await asyncio.sleep(0.5)
    pytest.fail(f"no {state} ({cause}) from {container.name}:\n{container.log_tail()}")


def engine_core(vllm: Container) -> psutil.Process:
    cores = [p for p in vllm.processes() if process_title(p).startswith(ENGINE_CORE_TITLE)]
    assert cores, [process_title(p) for p in vllm.processes()]
    return cores[0]


def watchdog_process(container: Container) -> psutil.Process:
    return next(p for p in container.processes() if "engine-watchdog" in " ".join(p.cmdline()))


async def stall(
    vllm: Container, url: str, dog: Container, cause: str | None = "stopped"
) -> psutil.Process:
    """Load, the watchdog sees progress, then SIGSTOP of the engine core until it says stalled
    (``cause``: the stopped process seen; None where the process table hides it)."""
    async with StreamingLoad(url, clients=3, max_tokens=400, model=SERVED_MODEL) as load:
        await load.wait_for(chunks=20, in_flight=2, timeout=120)
        await wait_for(dog, "progressing")
        core = engine_core(vllm)
        core.send_signal(signal.SIGSTOP)
        load.stop_new()
        await wait_for(dog, "stalled", cause)
    return core


def bundle(incidents: Path) -> dict[str, Any]:
    deadline = time.monotonic() + VERDICT_S
    while time.monotonic() < deadline:
        found = sorted(p for p in incidents.glob("2*") if (p / "manifest.json").exists())
        if found:
            return dict(json.loads((found[0] / "manifest.json").read_text()), path=found[0])
        time.sleep(0.5)
    pytest.fail(f"no bundle in {incidents}")


def native_frames(path: Path) -> bool:
    stacks = [json.loads(f.read_text()) for f in (path / "pyspy").glob("*.json")]
    return any(".so" in (fr.get("module") or "") for s in stacks for th in s for fr in th["frames"])


def restarts(incidents: Path) -> list[dict[str, Any]]:
    path = incidents / "actions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r["action"] == "restart"]


async def ended_only_the_watched(vllm: Container, bystander: Container, incidents: Path) -> None:
    await eventually(lambda: vllm.proc.poll() is not None, VERDICT_S, what="the vLLM ended")
    assert [r["result"] for r in restarts(incidents)][:1] == ["ok"], restarts(incidents)
    alive = [p for p in bystander.processes() if p.status() != psutil.STATUS_ZOMBIE]
    assert any(process_title(p).startswith(ENGINE_CORE_TITLE) for p in alive), "bystander killed"


async def test_sidecar_with_sys_ptrace_only(pod_dir: Path, vllm_env: VllmEnv) -> None:
    pod = Pod(private_dir(pod_dir, "ptrace", 0))
    pod.workdir.chmod(0o755)
    pod.start(reachable=(vllm_env.python, Path(CONSOLE_SCRIPT).with_name("python")))
    try:
        vllm, url, bystander = await start_engines(pod, vllm_env, pod.workdir)
        dog, incidents = watchdog(pod, url, pod.workdir, ENGINE_UID, ("sys_ptrace",), "watchdog")
        await asyncio.sleep(1.0)
        assert capabilities(watchdog_process(dog).pid) == (1 << CAP_SYS_PTRACE_BIT, True)
        await stall(vllm, url, dog)
        manifest = bundle(incidents)
        pyspy = next(s for s in manifest["steps"] if s["name"] == "py-spy")
        assert pyspy["status"] in ("ok", "partial"), pyspy
        assert native_frames(manifest["path"]), "no native frame with CAP_SYS_PTRACE"
        await ended_only_the_watched(vllm, bystander, incidents)
        FINDINGS.append(f"ptrace_scope={ptrace_scope()}: CAP_SYS_PTRACE only -> {pyspy['status']}")
    finally:
        pod.close()


async def test_sidecar_with_no_capability(pod_dir: Path, vllm_env: VllmEnv) -> None:
    pod = Pod(private_dir(pod_dir, "baseline", 0))
    pod.workdir.chmod(0o755)
    pod.start(reachable=(vllm_env.python, Path(CONSOLE_SCRIPT).with_name("python")))
    try:
        vllm, url, bystander = await start_engines(pod, vllm_env, pod.workdir)
        # Another UID sees neither the engine's sockets nor may it trace it: the metrics alone
        # call the stall, and the bundle says why it holds no stacks.
        stranger, theirs = watchdog(pod, url, pod.workdir, OTHER_UID, (), "stranger")
        core = await stall(vllm, url, stranger, cause=None)
        refused = bundle(theirs)
        pyspy = next(s for s in refused["steps"] if s["name"] == "py-spy")
        assert pyspy["status"] in ("permission-denied", "not-available"), pyspy
        summary = (refused["path"] / "summary.md").read_text()
        assert "No stacks were captured" in summary, summary[:1500]
        await asyncio.sleep(3.0)  # its restart rung ran: it must not have ended another UID's
        assert vllm.proc.poll() is None and core.is_running(), restarts(theirs)
        stranger.stop()
        core.send_signal(signal.SIGCONT)

        dog, incidents = watchdog(pod, url, pod.workdir, ENGINE_UID, (), "watchdog")
        await asyncio.sleep(1.0)
        assert capabilities(watchdog_process(dog).pid) == (0, True)
        await stall(vllm, url, dog)
        manifest = bundle(incidents)
        same_uid = next(s for s in manifest["steps"] if s["name"] == "py-spy")
        scope = ptrace_scope()
        if scope in ("absent", "0"):  # same-UID ptrace needs no capability here
            assert same_uid["status"] in ("ok", "partial") and native_frames(manifest["path"])
        else:
            assert same_uid["status"] == "permission-denied", same_uid
        await ended_only_the_watched(vllm, bystander, incidents)
        FINDINGS.append(
            f"ptrace_scope={scope}: no capability, same UID -> {same_uid['status']}; "
            f"another UID -> {pyspy['status']}, restart {restarts(theirs)[-1:]}"
        )
    finally:
        pod.close()
        print("\n[e2e] pod variants: " + " | ".join(FINDINGS))
