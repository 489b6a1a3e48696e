"""--pod-log: on Kubernetes, a bundle gets the engine container's log through the API's pods/log,
bounded in size, its secrets masked; a Role without pods/log costs one line naming the fix, not
the bundle. The API server is the loopback stand-in (tests/tools/fake_k8s_api.py: path, verb,
token, container, tailLines/limitBytes as the API server reads them); the simulator, its freeze
and the installed console script are real, and the watchdog finds the API as a pod would."""

from __future__ import annotations

from pathlib import Path

from engine_watchdog.core.redact import REDACTED
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.fake_k8s_api import FakeApi, pod_env
from tests.tools.stub_engine import self_signed, server_tls
from tests.tools.watch import start_watch, stop_watch
from tests.waiting import eventually

TOKEN = "sa-token-8d1e2f3a4b5c6d7e"
KEY = "sk-pod-log-4f1b9c2e7a"
LOG_LINES = 40_000
"""About 3.3 MB of log: more than the bundle keeps (1 MiB), as a long-running engine's is."""


def engine_log() -> bytes:
    head = f"INFO non-default args: {{'api_key': ['{KEY}'], 'port': 8000}}\n".encode()
    lines = (f"INFO engine step {i:06d} Running: 3 reqs\n" for i in range(LOG_LINES))
    body = "".join(lines).encode()
    return head + body + f"ERROR the last line, key {KEY}\n".encode()


async def _stall_bundle(
    sim_factory: SimFactory, sim_http: SimHttp, tmp: Path, api: FakeApi, cert: Path
) -> Path:
    """One capture of a frozen simulator by ``watch --action capture``: the bundle."""
    env = pod_env(tmp, api, cert, ENGINE_WATCHDOG_POD_LOG="vllm", VLLM_API_KEY=KEY)
    sim = await sim_factory("--tokens-per-second", "30", env={"VLLM_API_KEY": KEY})
    incidents = tmp / "incidents"
    watch = await start_watch(
        sim.url, "--action", "capture", "--incident-dir", str(incidents), "--canary-after", "1",
        "--idle-canary-interval", "2", stderr=tmp / "watch.err", env=env,
    )  # fmt: skip
    try:
        await watch.next_state("idle", timeout=30)
        await sim_http.set_fault(sim, "deadlock")  # fires on the idle canary's step
        await watch.next_state("stalled", timeout=60)
        bundles = await eventually(
            lambda: [p for p in incidents.glob("2*") if (p / "manifest.json").is_file()],
            timeout=60,
            what="a finished bundle",
        )
    finally:
        await stop_watch(watch)
    bundle: Path = bundles[0]
    return bundle


async def test_a_bundle_holds_the_engine_containers_last_log_masked(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    api = FakeApi("llm", "vllm-0", TOKEN, logs={"vllm": engine_log()})
    await api.start(server_tls(cert, key))
    try:
        bundle = await _stall_bundle(sim_factory, sim_http, tmp_path, api, cert)
    finally:
        await api.stop()
    log = (bundle / "engine.log").read_bytes()
    assert api.refused == [] and api.log_queries, api.refused
    assert api.log_queries[0]["container"] == "vllm"
    assert len(log) <= 1 << 20, len(log)  # the bundle's log_tail_bytes
    assert log.rstrip().endswith(f"the last line, key {REDACTED}".encode()), log[-200:]
    assert b"engine step" in log
    for path in bundle.rglob("*"):  # the key is in the log the API served, and nowhere here
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path
    assert TOKEN.encode() not in (tmp_path / "watch.err").read_bytes()


async def test_without_pods_log_in_the_role_the_bundle_says_how_to_grant_it(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    api = FakeApi("llm", "vllm-0", TOKEN, logs={"vllm": b"x\n"}, log_allowed=False)
    await api.start(server_tls(cert, key))
    try:
        bundle = await _stall_bundle(sim_factory, sim_http, tmp_path, api, cert)
    finally:
        await api.stop()
    said = (bundle / "engine.log").read_text()
    assert said.startswith("[engine-watchdog]") and "HTTP 403" in said, said
    assert "pods/log" in said and "pod-log component" in said, said
    assert (bundle / "summary.md").is_file()
