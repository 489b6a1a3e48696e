"""``engine-watchdog demo``: the whole story on the embedded simulator, in about a minute.

A simulated vLLM under streaming load, every client through the guard; one request stuck while
the others go on (the guard ends it, and only it); the seed's hang (the last requests stop
producing tokens, /health stays 200); the watchdog's verdict; the guard answering every client
at once; the incident bundle; the restart; the engine serving again. Everything it starts, it
stops; it ends by itself.

With ``--gpu`` (a machine with PyTorch and a CUDA GPU) the simulated engine computes on the GPU
and hangs as a rank stuck in a collective does: spinning in a GPU kernel. The watchdog reads it
through NVML, and the restart takes a CUDA core dump of the engine first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import click

from engine_watchdog.cli.demo_summary import Story, bundles, report
from engine_watchdog.cli.option_group import all_consumed
from engine_watchdog.cli.options import CAPTURE, DETECTOR
from engine_watchdog.core.checks import validate
from engine_watchdog.core.detector import TARGET
from engine_watchdog.core.model import Action, Outcome, Result, State, Transition, Verdict
from engine_watchdog.core.settings import (
    CaptureSettings,
    DetectorSettings,
    PolicySettings,
    ProbeSettings,
    ProcessSettings,
    WatchSettings,
)
from engine_watchdog.net.http import error_text
from engine_watchdog.report.console import transition_text
from engine_watchdog.runtime.runner import run_watch
from engine_watchdog.sim.cuda_load import GpuUnavailableError, load_torch
from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad

MODEL = "demo-model"


class StoryReporter:
    """Prints the watchdog's transitions and actions into the story and notes stall, restart
    and recovery (structured events: a reporter and an action listener)."""

    def __init__(self, story: Story) -> None:
        self.story = story

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        if any(v.last_progress_t for v in verdicts.values()):
            self.story.progress_seen.set()
        for change in changes:
            if change.new.engine == TARGET:
                continue  # before the first scrape: the engine is still starting
            self.story.say("watchdog: " + transition_text(change))
            if change.new.state is State.STALLED and self.story.stall is None:
                self.story.stall = change.new
                self.story.marks["stalled"] = self.story.now()
            healthy = change.new.state in (State.PROGRESSING, State.IDLE)
            if self.story.stall is not None and healthy and "restart" in self.story.marks:
                self.story.marks.setdefault("back", self.story.now())
                self.story.recovered.set()

    def on_action(self, target: str, action: Action, phase: str, outcome: Outcome | None) -> None:
        if phase != "end" or outcome is None:
            return
        if action is Action.RESTART and outcome.result == Result.OK:
            self.story.marks.setdefault("restart", self.story.now())
        self.story.say(f"watchdog: action {action}: {outcome.result} {outcome.detail}")


# The engine's side of a user-triggered CUDA core dump (CUDA_ENABLE_USER_TRIGGERED_COREDUMP,
# CUDA_COREDUMP_PIPE); the dump goes to /tmp.
CORE_DUMP_ENV = (
    "CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1",
    "CUDA_COREDUMP_PIPE=/tmp/cuda_pipe_%p",
    "CUDA_COREDUMP_FILE=/tmp/cuda_core_%p.nvcudmp",
    "CUDA_COREDUMP_GENERATION_FLAGS=skip_nonrelocated_elf_images,skip_global_memory,"
    "skip_shared_memory,skip_local_memory,skip_constbank_memory",
)


def demo_settings(
    url: str,
    detector: DetectorSettings,
    capture: CaptureSettings,
    gpu: bool = False,
) -> WatchSettings:
    return validate(
        WatchSettings(
            url=url,
            probe=ProbeSettings(gpu=gpu),
            detector=detector,
            policy=PolicySettings(
                actions=frozenset({Action.ANSWER, Action.CAPTURE, Action.ABORT, Action.RESTART}),
                abort_grace_s=5.0,
            ),
            capture=capture,
        )
    )


async def wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(
                    url + "/health", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the simulator at {url} did not become healthy in {timeout_s:.0f} s")


async def post(url: str, body: dict[str, object], timeout_s: float = 10.0) -> int:
    async with aiohttp.ClientSession() as session:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, json=body, timeout=timeout) as resp:
            await error_text(resp)  # drained, bounded: only the status matters
            return resp.status


async def stuck_client(story: Story, url: str, guard: str) -> None:
    """One request the engine stops serving while it serves the others: the guard ends it."""
    await post(url + "/sim/fault", {"fault": "stuck-request"})
    story.mark("stuck", "fault: the engine stops scheduling one request (X-Request-Id stuck-demo)")
    body = {"model": MODEL, "prompt": "stuck", "max_tokens": 500, "stream": True}
    error = None
    async with aiohttp.ClientSession() as session:
        timeout = aiohttp.ClientTimeout(total=60)
        headers = {"X-Request-Id": "stuck-demo"}
        async with session.post(
            guard + "/v1/completions", json=body, headers=headers, timeout=timeout
        ) as r:
            async for line in r.content:
                if line.startswith(b'data: {"error"'):
                    error = json.loads(line[len(b"data: ") :])["error"]["message"]
    await post(url + "/sim/fault", {"fault": "none"})
    took = story.now() - story.marks["stuck"]
    story.mark("stuck-answered", f"client stuck-demo: answered after {took:.1f} s: {error}")


async def inject_hang(story: Story, url: str, load: StreamingLoad, gpu: bool) -> None:
    await load.wait_for(chunks=100, in_flight=4, timeout=30)
    # A slow engine start (--gpu: PyTorch and CUDA) can leave the watchdog a round behind.
    await asyncio.wait_for(story.progress_seen.wait(), 30)
    story.say(f"load: {load.in_flight} streaming requests in flight, {load.chunks} chunks so far")
    await post(url + "/sim/fault", {"fault": "spin" if gpu else "freeze-last"})
    load.stop_new()
    if gpu:
        story.mark(
            "fault", "fault: the engine spins in a GPU kernel, as in a collective no peer joins"
        )
    else:
        story.mark(
            "fault", "fault: freeze-last armed, clients stop sending: the last request will hang"
        )


def engine_command(port: int, gpu: bool) -> list[str]:
    # VLLM_SERVER_DEV_MODE=1 gives the engine vLLM's abort-all endpoint: the abort rung runs.
    command = ["env", "VLLM_SERVER_DEV_MODE=1", *(CORE_DUMP_ENV if gpu else ())]
    command += [sys.executable, "-m", "engine_watchdog.sim", "--port", str(port)]
    command += ["--served-model-name", MODEL, "--tokens-per-second", "25"]
    return command + (["--gpu"] if gpu else [])


async def serving_again(story: Story, url: str) -> bool:
    await wait_healthy(url, 30)
    body = {"model": MODEL, "prompt": "still there?", "max_tokens": 8}
    status = await post(url + "/v1/completions", body)
    story.mark("served", f"client: a new completion after the restart answered HTTP {status}")
    return status == 200


async def run_demo(detector: DetectorSettings, capture: CaptureSettings, gpu: bool = False) -> int:
    story = Story(bundles_before=set(bundles(capture.incident_dir)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    guard = f"127.0.0.1:{free_port()}"
    command = engine_command(port, gpu)
    # The story tells every transition, action and client itself (below); the log lines of the
    # supervisor, the guard and the engine's start would say the same again, in another format.
    # Errors still show.
    logging.getLogger("engine_watchdog").setLevel(logging.ERROR)
    stop = asyncio.Event()
    settings = demo_settings(url, detector, capture, gpu)
    stall_seconds = settings.detector.stall_seconds
    story.say(f"starting a simulated vLLM on {url} under engine-watchdog run (supervise mode)")
    story.say(f"clients connect to the guard in front of it, http://{guard}")
    teller = StoryReporter(story)
    watchdog = asyncio.create_task(
        run_watch(
            settings,
            ProcessSettings(listen=None, guard_listen=guard),
            stop,
            lambda _: None,
            [teller],
            command,
            echo_engine=False,
            action_listeners=[teller.on_action],
        )
    )
    load = StreamingLoad(
        f"http://{guard}", clients=6, max_tokens=80, model=MODEL, request_timeout_s=120
    )
    ok, drain_s = False, 10.0
    try:
        await wait_healthy(f"http://{guard}", 30)
        load.start()
        await load.wait_for(chunks=50, in_flight=4, timeout=30)
        await stuck_client(story, url, f"http://{guard}")
        await inject_hang(story, url, load, gpu)
        await asyncio.wait_for(story.recovered.wait(), stall_seconds + 90)
        ok = await serving_again(story, f"http://{guard}")
    except asyncio.CancelledError:  # Ctrl-C (asyncio's runner cancels this): the story ends
        story.interrupted()
        drain_s = 0.0  # its clients are cut, not waited for: the watchdog's stop is then short
        raise
    finally:
        outcome = await load.stop(drain_s=drain_s)
        stop.set()
        await asyncio.wait_for(watchdog, 60)
    return report(story, outcome, capture.incident_dir, ok)


@click.command()
@DETECTOR.options(startup_grace=0.0, request_stall_seconds=5.0)
@CAPTURE.options(incident_dir=Path("incidents/demo"))
@click.option(
    "--gpu",
    is_flag=True,
    help="The simulated engine computes on CUDA device 0 and hangs spinning in a GPU kernel "
    "(needs PyTorch with CUDA); the restart takes a CUDA core dump first.",
)
def demo(gpu: bool, **kw: Any) -> None:
    """Run the whole story on the embedded simulator: hang, verdict, bundle, restart."""
    detector, capture = DETECTOR.take(kw), CAPTURE.take(kw)
    all_consumed(kw)
    if gpu:
        try:
            load_torch()
        except GpuUnavailableError as exc:
            raise click.UsageError(str(exc)) from exc
    try:
        code = asyncio.run(run_demo(detector, capture, gpu))
    except TimeoutError as exc:
        click.echo(f"demo: FAILED: {exc}", err=True)
        code = 1
    sys.exit(code)
