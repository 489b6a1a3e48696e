"""The simulator as a user sees it: vLLM's metrics, OpenAI endpoints, process layout, gating,
signals. Real simulator processes on free loopback ports; real HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import psutil

FAST = ("--tokens-per-second", "200")
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:engine_sleep_state",
    "vllm:cache_config_info",
)
COUNTERS = (
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
)
HISTOGRAMS = (
    "vllm:iteration_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
)


def cmdline(pid: int) -> str:
    # setproctitle pads the title to the original command line's length.
    return " ".join(psutil.Process(pid).cmdline()).strip()


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_metrics_have_vllm_names_labels_types_and_start_at_zero(sim_factory, sim_http):
    sim = await sim_factory("--served-model-name", "tiny-sim")
    m = await sim_http.scrape(sim)
    types = {name: fam.type for name, fam in m.families.items()}
    for names, kind in ((GAUGES, "gauge"), (COUNTERS, "counter"), (HISTOGRAMS, "histogram")):
        for name in names:
            assert types.get(name) == kind, (name, types.get(name))
    ours = {"engine": "0", "model_name": "tiny-sim"}
    for name in (*GAUGES[:-1], *COUNTERS, *HISTOGRAMS):
        for s in m.families[name].samples:
            assert ours.items() <= s.labels.items(), s
    assert m.value("vllm:generation_tokens_total", **ours) == 0
    assert m.value("vllm:prompt_tokens_total", **ours) == 0
    assert m.value("vllm:iteration_tokens_total_count", **ours) == 0
    assert m.value("vllm:num_requests_running", **ours) == 0
    assert m.value("vllm:engine_sleep_state", sleep_state="awake") == 1
    assert m.value("vllm:engine_sleep_state", sleep_state="weights_offloaded") == 0
    reasons = {
        s.labels["reason"] for s in m.families["vllm:num_requests_waiting_by_reason"].samples
    }
    assert reasons == {"capacity", "deferred"}
    finished = {s.labels["finished_reason"] for s in m.families["vllm:request_success"].samples}
    assert {"stop", "length", "abort", "error"} <= finished
    assert m.value("vllm:cache_config_info", engine="0") == 1
    # Process layout as in vLLM: the API keeps its command line, the child carries the title.
    (core,) = sim.engine_pids()
    assert cmdline(core) == "VLLM::EngineCore"
    assert "engine_watchdog.sim" in cmdline(sim.pid)
    assert psutil.Process(core).ppid() == sim.pid


async def test_completions_answer_like_vllm_and_move_the_counters(sim_factory, sim_http, poll):
    sim = await sim_factory(*FAST, "--log-stats-interval", "0.3")
    status, models = await sim_http.get(sim, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "sim-model"

    status, doc = await sim_http.complete(sim, max_tokens=5)
    assert status == 200 and doc["id"].startswith("cmpl-") and doc["object"] == "text_completion"
    assert doc["choices"][0]["finish_reason"] == "length"
    assert len(doc["choices"][0]["text"].split()) == 5
    assert doc["usage"]["completion_tokens"] == 5
    status, default = await sim_http.complete(sim, headers={"X-Request-Id": "abc"})
    assert default["id"] == "cmpl-abc" and default["usage"]["completion_tokens"] == 16

    events = await sim_http.stream(sim, [], max_tokens=4, stream_options={"include_usage": True})
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"]]
    assert len(texts) == 4 and events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 4

    status, chat = await sim_http.complete(sim, chat=True, max_tokens=3)
    assert chat["id"].startswith("chatcmpl-") and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    chunks = await sim_http.stream(sim, [], chat=True, max_tokens=3)
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[-1] == "[DONE]"

    prompt_total = sum(d["usage"]["prompt_tokens"] for d in (doc, default, chat))
    prompt_total += events[-2]["usage"]["prompt_tokens"] + chat["usage"]["prompt_tokens"]
    m = await sim_http.scrape(sim)
    assert m.value("vllm:generation_tokens_total") == 5 + 16 + 4 + 3 + 3
    assert m.value("vllm:prompt_tokens_total") == prompt_total
    assert m.value("vllm:request_success_total", finished_reason="length") == 5
    assert m.value("vllm:time_to_first_token_seconds_count") == 5
    assert m.value("vllm:iteration_tokens_total_count") >= 16  # one per step with output
    assert m.value("vllm:num_requests_running") == 0

    async def stats_line() -> bool:
        return "Engine 000: Avg prompt throughput:" in sim.log_text()

    await poll(stats_line, what="periodic stats log line")


async def test_bad_requests_get_vllm_style_errors(sim_factory, sim_http):
    sim = await sim_factory(*FAST)
    status, err = await sim_http.complete(sim, model="other")
    assert status == 404 and err["error"]["type"] == "NotFoundError"
    status, err = await sim_http.complete(sim, max_tokens=10**6)
    assert status == 400 and "maximum context length" in err["error"]["message"]
    status, err = await sim_http.complete(sim, prompt={"not": "a prompt"})
    assert status == 400 and err["error"]["code"] == 400
    m = await sim_http.scrape(sim)
    assert m.value("vllm:num_requests_running") == 0


async def test_disable_log_stats_removes_every_vllm_series(sim_factory, sim_http):
    sim = await sim_factory(*FAST, "--disable-log-stats")
    status, _ = await sim_http.complete(sim, max_tokens=2)
    assert status == 200
    names = (await sim_http.scrape(sim)).names()
    assert names and not any(n.startswith("vllm:") for n in names)


async def test_data_parallel_ranks_have_their_own_process_and_engine_label(sim_factory, sim_http):
    sim = await sim_factory(*FAST, "--data-parallel-size", "2")
    titles = sorted(cmdline(pid) for pid in sim.engine_pids())
    assert titles == ["VLLM::EngineCore_DP0", "VLLM::EngineCore_DP1"]
    results = await asyncio.gather(*(sim_http.complete(sim, max_tokens=20) for _ in range(4)))
    assert all(status == 200 for status, _ in results)
    m = await sim_http.scrape(sim)
    for rank in ("0", "1"):
        assert m.value("vllm:generation_tokens_total", engine=rank) > 0
        assert m.value("vllm:num_requests_running", engine=rank) == 0
    doc = await sim_http.set_fault(sim, "slow", engine="1")  # a fault can target one rank
    assert doc["engines"]["1"]["fault"] == "slow" and doc["engines"]["0"]["fault"] == "none"


async def test_abort_endpoints_are_gated_like_vllm(sim_factory, sim_http):
    sim = await sim_factory(*FAST)
    status, doc = await sim_http.post(sim, "/inference/v1/abort_requests", {"request_ids": ["x"]})
    assert status == 403 and "Scale-out endpoints are disabled" in doc["error"]
    for path in ("/abort_requests", "/pause", "/sleep"):
        async with sim_http.session.post(sim.url + path) as resp:
            assert resp.status == 404, path  # dev endpoints exist only in dev mode


async def test_scale_out_abort_and_dev_endpoints(sim_factory, sim_http, poll):
    sim = await sim_factory(
        "--tokens-per-second", "50", "--enable-scale-out", env={"VLLM_SERVER_DEV_MODE": "1"}
    )
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=1000, ignore_eos=True))
    await poll(lambda: len(events) >= 2, what="first tokens")
    rid = events[0]["id"]
    status, doc = await sim_http.post(sim, "/inference/v1/abort_requests", {"request_ids": [rid]})
    assert status == 200 and doc["aborted"] == [rid]
    await asyncio.wait_for(stream, 10)
    assert events[-2]["choices"][0]["finish_reason"] == "abort" and events[-1] == "[DONE]"

    assert (await sim_http.post(sim, "/abort_requests", {"request_ids": ["nope"]}))[0] == 200
    # vLLM's dev-mode endpoint: an empty body aborts every in-flight request; the scale-out
    # one needs the ids.
    streams: list[list[Any]] = [[], []]
    tasks = [
        asyncio.create_task(sim_http.stream(sim, ev, max_tokens=1000, ignore_eos=True))
        for ev in streams
    ]
    await poll(lambda: all(len(ev) >= 2 for ev in streams), what="both streams")
    assert (await sim_http.post(sim, "/inference/v1/abort_requests", {}))[0] == 400
    status, doc = await sim_http.post(sim, "/abort_requests", {})
    assert status == 200 and sorted(doc["aborted"]) == sorted(ev[0]["id"] for ev in streams)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert all(ev[-2]["choices"][0]["finish_reason"] == "abort" for ev in streams)
    assert (await sim_http.get(sim, "/is_paused"))[1] == {"is_paused": False}
    assert (await sim_http.post(sim, "/pause?mode=keep"))[0] == 200
    assert (await sim_http.get(sim, "/is_paused"))[1] == {"is_paused": True}
    assert (await sim_http.post(sim, "/resume"))[0] == 200
    assert (await sim_http.post(sim, "/sleep?level=1"))[0] == 200
    m = await sim_http.scrape(sim)
    assert m.value("vllm:engine_sleep_state", sleep_state="awake") == 0
    assert m.value("vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1
    assert (await sim_http.post(sim, "/wake_up"))[0] == 200
    m = await sim_http.scrape(sim)
    assert m.value("vllm:engine_sleep_state", sleep_state="awake") == 1
    assert (await sim_http.complete(sim, max_tokens=2))[0] == 200


async def test_sigstop_of_engine_core_freezes_metrics_and_sigcont_resumes(
    sim_factory, sim_http, poll, hold
):
    sim = await sim_factory("--tokens-per-second", "100")
    (core,) = sim.engine_pids()
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=120, ignore_eos=True))

    async def generated() -> float:
        return float((await sim_http.scrape(sim)).value("vllm:generation_tokens_total"))

    await poll(lambda: len(events) >= 5, what="tokens before SIGSTOP")
    os.kill(core, signal.SIGSTOP)
    try:
        await poll(lambda: psutil.Process(core).status() == psutil.STATUS_STOPPED)
        frozen = await hold(generated, 1.5, what="generation tokens while stopped")
        assert 0 < frozen < 120
        assert (await sim_http.scrape(sim)).value("vllm:num_requests_running") == 1
        assert await sim_http.health(sim) == 200
    finally:
        os.kill(core, signal.SIGCONT)
    await asyncio.wait_for(stream, 20)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert await generated() == 120


async def test_sigterm_stops_api_and_engine_core(sim_factory, poll):
    sim = await sim_factory()
    (core,) = sim.engine_pids()
    os.kill(sim.pid, signal.SIGTERM)
    assert await sim.wait_exit(15) == 0
    await poll(lambda: pid_gone(core), timeout=10, what="engine core gone")


async def test_engine_core_never_outlives_a_killed_api_process(sim_factory, poll):
    sim = await sim_factory()
    (core,) = sim.engine_pids()
    os.kill(sim.pid, signal.SIGKILL)
    await poll(lambda: pid_gone(core), timeout=10, what="orphaned engine core gone")
