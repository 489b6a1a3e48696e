"""Each injectable fault of the simulator does what it says, as seen from outside: HTTP,
/metrics, the process table and py-spy."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

PY_SPY = Path(sys.executable).with_name("py-spy")
DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def py_spy_dump(pid: int) -> str:
    out = subprocess.run(
        [str(PY_SPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
    )
    return out.stdout + out.stderr


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def test_freeze_last_hangs_the_last_request_behind_a_healthy_api(
    sim_factory, sim_http, poll, hold
):
    sim = await sim_factory(
        "--tokens-per-second", "50", "--fault", "freeze-last", "--log-stats-interval", "0.25"
    )
    streams: list[list[Any]] = [[], [], [], []]
    lengths = (8, 12, 16, 60)
    tasks = [
        asyncio.create_task(sim_http.stream(sim, ev, max_tokens=n, ignore_eos=True))
        for ev, n in zip(streams, lengths, strict=True)
    ]
    await poll(lambda: sum(t.done() for t in tasks) == 3, what="all but the last finish")
    assert not tasks[3].done()

    async def frozen_view() -> tuple[float, ...]:
        m = await sim_http.scrape(sim)
        names = ("generation_tokens_total", "num_requests_running", "iteration_tokens_total_count")
        return (*(m.value(f"vllm:{n}") for n in names), len(streams[3]))

    view = await hold(frozen_view, 2.0, what="metrics and last stream of a frozen engine")
    generated, running = view[:2]
    assert running == 1 and 0 < generated < sum(lengths)
    assert await sim_http.health(sim) == 200
    # The seed's log: a last line at 0.0 tokens/s with 1 running, then silence (DEBUG).
    lines = [line for line in sim.log_text().splitlines() if "Engine 000:" in line]
    assert "Avg generation throughput: 0.0 tokens/s, Running: 1 reqs" in lines[-1], lines[-3:]
    await hold(lambda: _engine_lines(sim), 1.0, what="stats log lines of a frozen engine")
    # A new request piles up unseen behind the frozen loop.
    with pytest.raises(asyncio.TimeoutError):
        await sim_http.complete(sim, max_tokens=2, timeout=1.0)
    assert (await sim_http.get(sim, "/sim/fault"))[1]["engines"]["0"]["state"] == "fired"

    await sim_http.set_fault(sim, "none")  # let go: the last request completes
    await asyncio.wait_for(tasks[3], 30)
    assert streams[3][-2]["choices"][0]["finish_reason"] == "length"


async def test_deadlock_is_a_real_blocked_thread_and_aborts_still_end_streams(
    sim_factory, sim_http, poll
):
    sim = await sim_factory("--tokens-per-second", "50", "--enable-scale-out", env=DEV)
    (core,) = sim.engine_pids()
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=5000, ignore_eos=True))
    await poll(lambda: len(events) >= 3, what="first tokens")
    await sim_http.set_fault(sim, "deadlock")

    async def generated() -> float:
        return float((await sim_http.scrape(sim)).value("vllm:generation_tokens_total"))

    await poll(lambda: _stalled(generated), what="generation stops")
    dump = await asyncio.to_thread(py_spy_dump, core)
    assert "_step_with_lock" in dump, dump
    assert await sim_http.health(sim) == 200
    # vLLM's pause/is_paused run on the busy loop: they hang with it.
    with pytest.raises(asyncio.TimeoutError):
        await sim_http.get(sim, "/is_paused", timeout=1.0)
    # An abort is finished by the API process: the stream ends, the engine stays blocked.
    rid = events[0]["id"]
    status, doc = await sim_http.post(sim, "/inference/v1/abort_requests", {"request_ids": [rid]})
    assert status == 200 and doc["aborted"] == [rid]
    await asyncio.wait_for(stream, 10)
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert "_step_with_lock" in await asyncio.to_thread(py_spy_dump, core)

    await sim_http.set_fault(sim, "none")  # the lock is released: the engine serves again
    status, doc = await sim_http.complete(sim, max_tokens=3, timeout=15.0)
    assert status == 200 and doc["usage"]["completion_tokens"] == 3


async def test_spin_burns_cpu_without_progress(sim_factory, sim_http, poll):
    sim = await sim_factory("--tokens-per-second", "50")
    (core,) = sim.engine_pids()
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=5000, ignore_eos=True))
    await poll(lambda: len(events) >= 3, what="first tokens")
    await sim_http.set_fault(sim, "spin")

    async def generated() -> float:
        return float((await sim_http.scrape(sim)).value("vllm:generation_tokens_total"))

    await poll(lambda: _stalled(generated), what="generation stops")
    stalled_at = await generated()
    dump = await asyncio.to_thread(py_spy_dump, core)
    # The busy loop's thread is running Python (holding the GIL), not waiting.
    main = next(line for line in dump.splitlines() if '"MainThread"' in line)
    assert "(active" in main and "_spin_without_progress" in dump, dump
    # A blocked engine core uses no CPU; this one keeps burning it (100 % of a CPU when it has
    # one; the CI machine is shared, so count CPU seconds rather than a share of wall time).
    before = cpu_seconds(core)
    await poll(lambda: cpu_seconds(core) - before >= 0.5, timeout=30, what="CPU burnt")
    assert await generated() == stalled_at
    await sim_http.set_fault(sim, "none")
    await poll(lambda: _above(generated, stalled_at), what="generation resumes")
    stream.cancel()


async def test_crash_fails_requests_then_health_503_and_the_api_exits(sim_factory, sim_http, poll):
    sim = await sim_factory("--tokens-per-second", "50")
    (core,) = sim.engine_pids()
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=5000, ignore_eos=True))
    plain = asyncio.create_task(sim_http.complete(sim, max_tokens=5000, ignore_eos=True))
    await poll(lambda: len(events) >= 3, what="first tokens")
    await sim_http.set_fault(sim, "crash")
    await asyncio.wait_for(stream, 10)
    assert "error" in events[-2] and events[-1] == "[DONE]"
    status, doc = await asyncio.wait_for(plain, 10)
    assert status == 500 and doc["error"]["code"] == 500
    await poll(lambda: _is(sim_http.health(sim), 503), timeout=5, what="/health 503")
    assert await sim.wait_exit(15) == 0
    assert not psutil.pid_exists(core) or psutil.Process(core).status() == "zombie"


async def test_slow_tokens_trickle_but_move(sim_factory, sim_http):
    sim = await sim_factory(
        "--tokens-per-second", "200", "--fault", "slow", "--slow-tokens-per-second", "5"
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, doc = await sim_http.complete(sim, max_tokens=4)
    slow = loop.time() - started
    assert status == 200 and doc["usage"]["completion_tokens"] == 4
    assert slow >= 0.5, f"4 tokens at 5 tok/s took only {slow:.2f} s"  # 3 steps of 0.2 s
    await sim_http.set_fault(sim, "none")
    await sim_http.complete(sim, max_tokens=1)  # the step already scheduled at the slow pace
    started = loop.time()
    status, doc = await sim_http.complete(sim, max_tokens=4)
    assert status == 200 and loop.time() - started < slow


async def test_a_slow_engine_admits_a_new_request_at_its_next_step(sim_factory, sim_http):
    """vLLM handles its input queue before every step; a slow engine's steps run back to back,
    and a request sent meanwhile must not wait for the running ones to end."""
    sim = await sim_factory("--fault", "slow", "--slow-tokens-per-second", "4")
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(sim_http.complete(sim, max_tokens=12))  # 3 s at 4 steps/s
    await asyncio.sleep(0.6)
    started = loop.time()
    status, _ = await sim_http.complete(sim, max_tokens=1)
    second_s = loop.time() - started
    assert status == 200 and not first.done(), "the new request waited for the running one"
    assert second_s < 1.5, second_s  # prefill and a token: two steps of 0.25 s, with slack
    assert (await first)[0] == 200


async def test_long_prefill_grows_kv_with_no_token_and_no_counter(sim_factory, sim_http, poll):
    sim = await sim_factory(
        "--fault", "long-prefill", "--long-prefill-seconds", "5", "--kv-capacity-tokens", "4096"
    )
    prompt = " ".join(["word"] * 2000)
    request = asyncio.create_task(sim_http.complete(sim, prompt=prompt, max_tokens=4))
    usages: list[float] = []

    async def sample() -> bool:
        m = await sim_http.scrape(sim)
        for name in ("generation_tokens", "prompt_tokens", "iteration_tokens_total_count"):
            sample_name = f"vllm:{name}" + ("" if name.endswith("count") else "_total")
            assert m.value(sample_name) == 0, (sample_name, usages)
        usage = m.value("vllm:kv_cache_usage_perc")
        if usage and (not usages or usage > usages[-1]):
            usages.append(usage)
        return len(usages) >= 3

    await poll(sample, timeout=10, interval=0.2, what="KV usage grows chunk by chunk")
    assert usages == sorted(usages) and usages[-1] < 2000 / 4096
    status, doc = await asyncio.wait_for(request, 20)
    assert status == 200 and doc["usage"]["completion_tokens"] == 4
    m = await sim_http.scrape(sim)
    assert m.value("vllm:prompt_tokens_total") == 2000
    assert m.value("vllm:generation_tokens_total") == 4


async def test_api_freeze_makes_metrics_time_out_until_sigusr2(sim_factory, sim_http, poll):
    sim = await sim_factory()
    await sim_http.set_fault(sim, "api-freeze", api_freeze_seconds=600)

    async def metrics_times_out() -> bool:
        try:
            await sim_http.scrape(sim, timeout=1.0)
        except asyncio.TimeoutError:
            return True
        return False

    await poll(metrics_times_out, timeout=10, what="/metrics times out")
    assert await sim_http.health(sim, timeout=1.0) is None  # nothing is served at all
    os.kill(sim.pid, signal.SIGUSR2)
    await poll(lambda: _is(sim_http.health(sim), 200), timeout=10, what="API serves again")
    assert (await sim_http.scrape(sim)).value("vllm:num_requests_running") == 0


async def _engine_lines(sim: Any) -> int:
    return sum("Engine 000:" in line for line in sim.log_text().splitlines())


async def _is(awaitable: Awaitable[Any], expected: Any) -> bool:
    return bool(await awaitable == expected)


async def _stalled(read: Callable[[], Awaitable[float]]) -> bool:
    """True once two reads 0.3 s apart agree (a fresh read each time: no stale sample)."""
    first = await read()
    await asyncio.sleep(0.3)
    return bool(await read() == first)


async def _above(read: Callable[[], Awaitable[float]], value: float) -> bool:
    return bool(await read() > value)
