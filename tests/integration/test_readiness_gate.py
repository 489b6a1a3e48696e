"""--readiness-gate: the pod's condition engine-watchdog.io/progressing goes False within
seconds of a stall verdict and True again after recovery, with no restart. No cluster runs
here: the API server is a loopback stand-in (tests/tools/fake_k8s_api.py) that checks path,
verb, token, patch type and body as the API server does; the installed console script, the
simulator and its deadlock are real, and the watchdog finds all of it as a pod would (the
service's host and port, the service-account token and CA, the downward API's pod)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine_watchdog.sim.launcher import SimProcess
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import run_cli
from tests.tools.fake_k8s_api import FakeApi, pod_env
from tests.tools.stub_engine import self_signed, server_tls
from tests.tools.watch import WatchProcess, get, metric, start_watch, stop_watch
from tests.waiting import eventually

TOKEN = "sa-token-5f3c9e1d7b2a4e6f"


def gate_env(tmp: Path, api: FakeApi, cert: Path) -> dict[str, str]:
    return pod_env(tmp, api, cert, TOKEN, ENGINE_WATCHDOG_READINESS_GATE="in-cluster")


async def _watch(sim: SimProcess, env: dict[str, str], stderr: Path) -> WatchProcess:
    return await start_watch(
        sim.url, "--action", "none", "--idle-canary-interval", "2", "--canary-after", "1",
        stderr=stderr, env=env,
    )  # fmt: skip


async def test_the_condition_goes_false_on_a_stall_and_true_after_recovery(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    api = FakeApi("llm", "vllm-0", TOKEN)
    await api.start(server_tls(cert, key))
    sim = await sim_factory("--tokens-per-second", "30")
    stderr = tmp_path / "watch.err"
    watch = await _watch(sim, gate_env(tmp_path, api, cert), stderr)
    try:
        await eventually(lambda: api.statuses() == ["True"], timeout=30, what="True at start")
        await sim_http.set_fault(sim, "deadlock")  # fires on the idle canary's step
        stalled = await watch.next_state("stalled", timeout=60)
        seen = time.monotonic()
        await eventually(lambda: "False" in api.statuses(), timeout=10, what="False")
        false_at, cond = next((t, c) for t, c in api.conditions if c["status"] == "False")
        assert false_at - seen < 5.0, "the condition followed the verdict within seconds"
        assert cond["reason"] == "WedgedIdle" and stalled["cause"] == "wedged-idle"
        assert "wedged-idle" in cond["message"]
        await sim_http.set_fault(sim, "none")  # the engine steps again: no restart
        await eventually(lambda: api.statuses()[-1:] == ["True"], timeout=60, what="True again")
        _, text = await get(watch.base + "/metrics")
    finally:
        await stop_watch(watch)
        await api.stop()
    assert api.statuses() == ["True", "False", "True"], api.conditions
    assert api.refused == []
    flips = "engine_watchdog_readiness_flips_total"
    assert metric(text, flips, status="False") == 1.0
    assert metric(text, flips, status="True") == 1.0
    assert metric(text, "engine_watchdog_readiness_patch_errors_total") == 0.0
    said = stderr.read_text() + "".join(str(line) for line in watch.lines)
    assert TOKEN not in said


async def test_a_refused_patch_is_counted_and_sent_again_with_the_rotated_token(
    sim_factory: SimFactory, tmp_path: Path
) -> None:
    """The token file rotates (a projected token): it is read for every request, and a PATCH the
    API refused is sent again (backoff) without a verdict change."""
    cert, key = self_signed(tmp_path)
    api = FakeApi("llm", "vllm-0", "the-rotated-token")
    await api.start(server_tls(cert, key))
    sim = await sim_factory("--tokens-per-second", "30")
    env = gate_env(tmp_path, api, cert)
    stderr = tmp_path / "watch.err"
    watch = await _watch(sim, env, stderr)
    try:
        await eventually(lambda: api.refused, timeout=30, what="a 401")
        assert api.refused[0][0] == 401
        token_file = Path(env["ENGINE_WATCHDOG_SERVICEACCOUNT_DIR"]) / "token"
        token_file.write_text("the-rotated-token")
        await eventually(lambda: api.statuses() == ["True"], timeout=60, what="True at last")
        _, text = await get(watch.base + "/metrics")
    finally:
        await stop_watch(watch)
        await api.stop()
    errors = metric(text, "engine_watchdog_readiness_patch_errors_total")
    assert errors is not None and errors >= 1
    assert "HTTP 401" in stderr.read_text() and TOKEN not in stderr.read_text()


async def test_missing_pod_env_is_one_line_naming_the_fix(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POD_", "KUBERNETES_"))}
    ran = await run_cli(
        "watch", "http://127.0.0.1:9", "--readiness-gate", "in-cluster", "--listen", "",
        "--incident-dir", str(tmp_path), env=env, timeout=60,
    )  # fmt: skip
    assert ran.code == 64 and "Traceback" not in ran.err, ran.err  # EX_USAGE
    errors = [line for line in ran.err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: --readiness-gate needs POD_NAME, POD_NAMESPACE, KUBERNETES_SERVICE_HOST "
        "(the readiness-gate component sets them)"
    ], ran.err


async def test_the_stand_in_refuses_what_the_api_server_refuses(tmp_path: Path) -> None:
    """A stand-in that took anything would prove nothing: wrong token, pod, verb, patch type
    and body each get the API server's answer."""
    import aiohttp

    api = FakeApi("llm", "vllm-0", TOKEN)
    base = await api.start(None)
    good = f"{base}/api/v1/namespaces/llm/pods/vllm-0/status"
    cond = {
        "type": "engine-watchdog.io/progressing", "status": "False", "reason": "HostDeadlock",
        "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    body = {"status": {"conditions": [cond]}}
    smp = "application/strategic-merge-patch+json"
    cases = [
        ("PATCH", good, "Bearer wrong", smp, body, 401),
        ("PATCH", good.replace("vllm-0", "vllm-1"), f"Bearer {TOKEN}", smp, body, 404),
        ("PUT", good, f"Bearer {TOKEN}", smp, body, 405),
        ("PATCH", good, f"Bearer {TOKEN}", "application/merge-patch+json", body, 415),
        (
            "PATCH",
            good,
            f"Bearer {TOKEN}",
            smp,
            {"status": {"conditions": [{**cond, "reason": "host-deadlock"}]}},
            422,
        ),
        ("PATCH", good, f"Bearer {TOKEN}", smp, {"status": {"phase": "Running"}}, 422),
        ("PATCH", good, f"Bearer {TOKEN}", smp, body, 200),
    ]
    try:
        async with aiohttp.ClientSession() as s:
            for method, url, auth, ctype, doc, want in cases:
                headers = {"Authorization": auth, "Content-Type": ctype}
                async with s.request(method, url, json=doc, headers=headers) as r:
                    assert r.status == want, (method, url, ctype, doc)
    finally:
        await api.stop()
    assert api.statuses() == ["False"]


async def test_one_patch_per_change_and_the_transition_time_kept_within_a_status(
    tmp_path: Path,
) -> None:
    """The evidence changes every round while stalled: no PATCH for that; a new cause is a new
    reason with the same lastTransitionTime; a new status is a new one, and a flip."""
    import asyncio

    import aiohttp

    from engine_watchdog.core.model import Cause, State, Verdict
    from engine_watchdog.net.k8s_api import PodRef
    from engine_watchdog.report.readiness import ReadinessGate

    api = FakeApi("llm", "vllm-0", TOKEN)
    base = await api.start(None)
    stamps = iter(f"2026-01-01T00:00:0{i}Z" for i in range(10))
    flips: list[str] = []
    async with aiohttp.ClientSession() as session:
        (tmp_path / "token").write_text(TOKEN)
        pod = PodRef(base, "llm", "vllm-0", "u", token_file=tmp_path / "token", ca_file=None)
        gate = ReadinessGate(session, pod, flips.append, lambda: None, stamp=lambda: next(stamps))
        task = asyncio.create_task(gate.run())
        try:
            steps: list[tuple[State, str | None, tuple[str, ...]]] = [
                (State.IDLE, None, ()),
                (State.STALLED, "no-progress", ("a",)),
                (State.STALLED, "no-progress", ("b",)),  # evidence only: no PATCH
                (State.STALLED, "host-deadlock", ("c",)),
                (State.PROGRESSING, None, ()),
            ]
            for n, (state, cause, evidence) in enumerate(steps):
                why = None if cause is None else Cause(cause)
                verdict = Verdict(float(n), "0", state, why, evidence=evidence)
                gate.report("t", [], {"0": verdict})
                await eventually(lambda: gate.applied == gate.want, timeout=10, what="applied")
        finally:
            task.cancel()
            await api.stop()
    seen = [(c["status"], c["reason"], c["lastTransitionTime"]) for _, c in api.conditions]
    assert seen == [
        ("True", "Progressing", "2026-01-01T00:00:00Z"),
        ("False", "NoProgress", "2026-01-01T00:00:01Z"),
        ("False", "HostDeadlock", "2026-01-01T00:00:01Z"),
        ("True", "Progressing", "2026-01-01T00:00:02Z"),
    ]
    assert flips == ["False", "True"]
