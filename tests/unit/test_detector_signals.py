"""Multi-signal verdicts: processes, GPUs and canaries on top of the metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from engine_watchdog.core.detector import Detector, DetectorSettings
from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    GpuInfo,
    GpuObs,
    GuardObs,
    Observation,
    ProcInfo,
    ProcsObs,
    QuietStream,
    ScrapeObs,
    State,
)
from tests.tools.detector_feed import T0, Eng, first_stall, run, scrape

CORE = 101


def procs(t: float, state: str = "sleeping", cpu_s: float = 0.0, alive: bool = True) -> ProcsObs:
    ps = [ProcInfo(100, 1, "api-server", "python -m vllm...", "sleeping", 1.0)]
    if alive:
        ps.append(ProcInfo(CORE, 100, "engine-core", "VLLM::EngineCore", state, cpu_s))
    return ProcsObs(T0 + t, tuple(ps))


def gpu(t: float, util: float, tensor: float, dram: float) -> GpuObs:
    return GpuObs(T0 + t, (GpuInfo(0, util, 137.0, util, tensor, dram, (CORE,)),))


def frozen_engine(seconds: int, extra: Mapping[int, Sequence[Observation]]) -> list[Observation]:
    """Decodes for 5 s, then freezes with a request running; ``extra[t]`` added after scrape t."""
    e = Eng()
    obs: list[Observation] = []
    for t in range(seconds):
        if t < 5:
            e.running, e.tokens = 1, e.tokens + 5
        obs.append(scrape(t, e))
        obs += extra.get(t, [])
    return obs


def every_second(
    seconds: int, make: Callable[[float], Observation]
) -> dict[int, list[Observation]]:
    return {t: [make(t + 0.5)] for t in range(seconds)}


def test_stopped_engine_is_stalled_fast_with_cause_stopped() -> None:
    extra = every_second(60, lambda t: procs(t, "stopped" if t > 5 else "running"))
    _, seen = run(frozen_engine(60, extra))
    stall = first_stall(seen)
    assert stall is not None and stall[1] == "stopped" and stall[0] <= 4 + 15


def test_gpu_spin_is_stalled_fast() -> None:
    extra = every_second(60, lambda t: gpu(t, 100.0, 0.0, 0.0))
    _, seen = run(frozen_engine(60, extra))
    stall = first_stall(seen)
    assert stall is not None and stall[1] == "gpu-spin" and stall[0] <= 4 + 15


def test_gpu_spin_is_found_although_the_first_sample_still_holds_the_last_compute() -> None:
    """GPM averages the time since the previous sample: the first sample after the last token
    shows the last steps' tensor work (as on the H200), the later ones the spin alone. That
    sample counts as life (the quiet clock restarts there); the spin after it is still found."""

    def sample(t: float) -> GpuObs:
        return gpu(t, 100.0, 3.0, 1.5) if t <= 5.5 else gpu(t, 100.0, 0.0, 0.0)

    extra = every_second(60, sample)
    _, seen = run(frozen_engine(60, extra))
    stall = first_stall(seen)
    assert stall is not None and stall[1] == "gpu-spin" and stall[0] <= 4 + 15


def test_gpu_computing_is_life_during_a_long_prefill() -> None:
    extra = every_second(200, lambda t: gpu(t, 100.0, 35.0, 20.0))
    _, seen = run(frozen_engine(200, extra))
    assert first_stall(seen) is None


def test_failed_canary_makes_the_stall_fast() -> None:
    # Sent at t=10 (5 s flat), timed out 8 s later.
    extra = {18: [CanaryObs(T0 + 18.2, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 10.2)]}
    _, seen = run(frozen_engine(60, extra))
    assert first_stall(seen) == (18.2, "no-progress")


def test_the_last_steps_cpu_does_not_hide_a_failed_canary() -> None:
    """Seen on a real vLLM (CPU build) deadlocked behind --api-key: its worker burned 0.73 s of
    CPU in the second after the engine core blocked, then 0.02 cores. Averaged from the start
    of the quiet spell that read as busy until 24 s; the canary waited on an idle engine, so
    its failure is strong evidence when it comes (it was ignored, and the stall came ~8 s
    later)."""

    def worker(t: float) -> ProcsObs:
        cpu = 70.0 if t < 5 else 70.73 + 0.02 * (t - 5)
        core = ProcInfo(CORE, 1, "engine-core", "VLLM::EngineCore", "sleeping", 16.89)
        return ProcsObs(T0 + t, (core, ProcInfo(102, 1, "worker", "VLLM::Worker", "sleeping", cpu)))

    extra = every_second(40, worker)
    extra[18].append(CanaryObs(T0 + 18.6, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 10.2))
    _, seen = run(frozen_engine(40, extra))
    assert first_stall(seen) == (18.6, "no-progress")


def test_completed_canaries_keep_a_quiet_long_prefill_alive() -> None:
    extra = {t: [CanaryObs(T0 + t + 0.5, ok=True, latency_s=0.3)] for t in range(10, 300, 10)}
    _, seen = run(frozen_engine(300, extra))
    assert first_stall(seen) is None


def test_unusable_canary_is_not_evidence() -> None:
    extra = {18: [CanaryObs(T0 + 18.2, ok=False, error="unusable: http-401", sent_t=T0 + 10)]}
    _, seen = run(frozen_engine(30, extra))
    assert first_stall(seen) is None


def test_cpu_idle_engine_is_a_host_deadlock_at_stall_seconds() -> None:
    extra = every_second(60, lambda t: procs(t, "sleeping", cpu_s=5.0))
    _, seen = run(frozen_engine(60, extra))
    assert first_stall(seen) == (34.0, "host-deadlock")


def test_cpu_pegged_engine_is_host_busy() -> None:
    extra = every_second(60, lambda t: procs(t, "running", cpu_s=t))
    _, seen = run(frozen_engine(60, extra))
    assert first_stall(seen) == (34.0, "host-busy")


def test_another_engines_orphan_is_neither_our_stop_nor_our_life() -> None:
    """A title-matched orphan beside the server (probes/procs.py marks it): stopped, it did not
    make our frozen engine's cause ``stopped``; alive, it did not keep our dead engine alive."""

    def with_orphan(t: float, state: str, alive: bool = True) -> ProcsObs:
        orphan = ProcInfo(400, 1, "engine-core", "VLLM::EngineCore", state, 1.0, orphan=True)
        return ProcsObs(T0 + t, (*procs(t, alive=alive).procs, orphan))

    _, seen = run(frozen_engine(60, every_second(60, lambda t: with_orphan(t, "stopped"))))
    stall = first_stall(seen)
    assert stall is not None and stall[1] != "stopped", stall
    dies = {3: [with_orphan(3.5, "sleeping")], 6: [with_orphan(6.5, "sleeping", alive=False)]}
    dies[7] = [with_orphan(7.5, "sleeping", alive=False)]
    _, seen = run(frozen_engine(10, dies))
    assert first_stall(seen) == (7.5, "engine-dead")


def test_engine_core_gone_is_engine_dead() -> None:
    extra = {3: [procs(3.5)], 6: [procs(6.5, alive=False)], 7: [procs(7.5, alive=False)]}
    _, seen = run(frozen_engine(10, extra))
    assert first_stall(seen) == (7.5, "engine-dead")  # two samples: one may miss it in a race


def test_an_engine_of_workers_alone_is_dead_only_when_its_workers_are() -> None:
    """A rank that serves the API itself (a torch rank titled ``VLLM::Worker_TP0``, watched by
    its port or --pid) has no engine core: it was judged engine-dead at its second process
    sample, while it served. Only its workers gone is dead."""

    def rank(t: float, alive: bool = True) -> ProcsObs:
        ps = (ProcInfo(CORE, 1, "worker", "VLLM::Worker_TP0", "sleeping", 1.0),) if alive else ()
        return ProcsObs(T0 + t, ps)

    serving = {t: [rank(t + 0.5)] for t in range(8)}
    _, seen = run(frozen_engine(8, serving))
    assert first_stall(seen) is None
    dies = {3: [rank(3.5)], 4: [rank(4.5)], 6: [rank(6.5, False)], 7: [rank(7.5, False)]}
    _, seen = run(frozen_engine(10, dies))
    assert first_stall(seen) == (7.5, "engine-dead")


def test_wedged_idle_engine_fails_its_idle_canary() -> None:
    obs: list[Observation] = [scrape(t, Eng()) for t in range(70)]
    obs.insert(65, CanaryObs(T0 + 64.5, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 56.5))
    d, seen = run(obs)
    assert first_stall(seen) == (64.5, "wedged-idle")
    assert d.verdicts["0"].state is State.STALLED  # stays stalled on later idle scrapes
    d.feed(CanaryObs(T0 + 80, ok=True, latency_s=0.1))
    d.feed(scrape(81, Eng()))
    after = d.verdicts["0"]
    assert after.state is State.IDLE


def test_canary_due_when_flat_and_when_idle() -> None:
    d = Detector(DetectorSettings(canary_after_seconds=5, idle_canary_seconds=60))
    busy = Eng(running=1)
    for t in range(7):
        d.feed(scrape(t, busy))
    assert d.canary_due(T0 + 6) == "flat"
    d.feed(CanaryObs(T0 + 6.5, ok=True, latency_s=0.2))
    assert d.canary_due(T0 + 6.6) is None  # one per quiet period
    idle = Detector()
    idle.feed(scrape(0, Eng()))
    assert idle.canary_due(T0 + 1) is None  # idle for a moment is no doubt yet
    assert idle.canary_due(T0 + 5) == "idle"
    idle.feed(CanaryObs(T0 + 6, ok=True, latency_s=0.1))
    idle.feed(scrape(7, Eng()))
    assert idle.canary_due(T0 + 30) is None and idle.canary_due(T0 + 67) == "idle"


def test_a_new_engine_after_death_is_judged_afresh() -> None:
    """Crash on the first request (the idle canary's): counters never moved, so the new
    engine's zeros show no reset; /health 503 -> 200 is what says the engine is new."""
    from engine_watchdog.core.model import HealthObs

    obs: list[Observation] = [scrape(0, Eng()), HealthObs(T0 + 0.1, 200)]
    obs += [CanaryObs(T0 + 1.2, ok=False, error="http-500", sent_t=T0 + 0.5)]
    obs += [HealthObs(T0 + 1.3, 503), scrape(2, Eng()), HealthObs(T0 + 2.1, 200), scrape(3, Eng())]
    d, seen = run(obs)
    assert ("stalled", "engine-dead") in [(s, c) for _, s, c in seen]
    assert d.verdicts["0"].state is State.IDLE


def test_guard_streams_the_engine_does_not_count_bring_canaries_every_few_seconds() -> None:
    """Idle is no proof, in `watch`: a wedged core reads 0 running while the guard holds streams
    waiting on it. That idle look is no proof: a canary every stalled_canary_seconds, not 60 s."""
    d = Detector(DetectorSettings(canary_after_seconds=5, idle_canary_seconds=60))
    for t in range(7):
        d.feed(scrape(t, Eng()))
    assert d.canary_due(T0 + 6) == "idle"
    d.feed(CanaryObs(T0 + 6.5, ok=True, latency_s=0.1))
    d.feed(scrape(7, Eng()))
    assert d.canary_due(T0 + 10.5) is None  # plain idle: the next in 60 s
    held = QuietStream("r1", T0 + 2, T0 + 2.5, T0 + 3, 4, waiting_since=T0 + 3)
    d.feed(GuardObs(T0 + 10, 4, 4, 0, 0, T0 + 3, (), (held,)))
    assert d.canary_due(T0 + 10.5) == "idle"


def test_an_engine_that_is_its_own_api_server_stopped_is_stalled_not_unreachable() -> None:
    """llama-server SIGSTOPped: /metrics times out (no frozen counters to read), and only the
    process state says the engine is stopped, not the network lost."""
    e = Eng(running=1)
    obs: list[Observation] = []
    for t in range(40):
        if t < 5:
            e.tokens += 5
            obs.append(scrape(t, e))
        else:
            obs.append(ScrapeObs(T0 + t, error=Cause.TIMEOUT))
        obs.append(procs(t + 0.5, "stopped" if t >= 5 else "running"))
    _, seen = run(obs, stall_seconds=30, fast_stall_seconds=10)
    stall = first_stall(seen)
    assert stall is not None and stall[1] == "stopped", seen
    assert 15.0 <= stall[0] <= 17.0, stall


def test_a_check_of_a_server_stopped_before_it_began_says_stopped() -> None:
    """No good scrape ever (``check`` of an already stopped server): stalled, cause stopped,
    once the fast-stall window has passed; unreachable processes say nothing of the kind."""
    stopped: list[Observation] = [ScrapeObs(T0 + t, error=Cause.TIMEOUT) for t in range(15)]
    stopped += [procs(t + 0.5, "stopped") for t in range(15)]
    _, seen = run(sorted(stopped, key=lambda o: o.t), fast_stall_seconds=10)
    stall = first_stall(seen)
    assert stall is not None and stall[1] == "stopped" and stall[0] >= 10.0, seen
    running: list[Observation] = [ScrapeObs(T0 + t, error=Cause.TIMEOUT) for t in range(15)]
    running += [procs(t + 0.5, "running") for t in range(15)]
    _, seen = run(sorted(running, key=lambda o: o.t), fast_stall_seconds=10)
    assert first_stall(seen) is None, seen


def _idle(until: int, state: str, since: float | None = None) -> list[Observation]:
    """An idle engine (it counts nothing, a canary answered at 10 s), its engine core in
    ``state``; from ``T0 + since`` the guard holds one request without a first token."""
    obs: list[Observation] = []
    for t in range(until):
        obs.append(scrape(t, Eng()))
        obs.append(procs(t + 0.2, state if since is not None and t >= since else "sleeping"))
        if since is not None and t >= since:
            obs.append(GuardObs(T0 + t + 0.3, 1, 0, awaiting=1, awaiting_since=T0 + since))
        if t == 10:
            obs.append(CanaryObs(T0 + 10.5, ok=True, latency_s=0.1, sent_t=T0 + 10.4))
    return obs


def test_a_request_waiting_on_an_idle_stopped_core_is_a_stall_until_a_canary_answers() -> None:
    """An engine frozen while idle counts nothing (its core publishes no stats): the request
    the guard holds without a first token is the evidence, with the core in state T. Before:
    idle, until the idle canary 60 s later."""
    d, seen = run(_idle(24, "stopped", since=20))
    assert first_stall(seen) == (22.0, "stopped"), seen  # 2 samples in state T, 2 s waited
    assert "for a first token" in " ".join(d.verdicts["0"].evidence)
    # Answered and gone, the engine still stopped: stalled until a canary says otherwise.
    d.feed(GuardObs(T0 + 24.3, 0, 0))
    d.feed(scrape(25, Eng()))
    held = d.verdicts["0"]
    assert held.state is State.STALLED
    assert d.canary_due(T0 + 25.5) == "stalled"
    d.feed(CanaryObs(T0 + 26, ok=True, latency_s=0.1, sent_t=T0 + 25.5))
    d.feed(scrape(27, Eng()))
    assert d.verdicts["0"].state is State.IDLE


def test_a_request_waiting_on_an_idle_engine_brings_a_canary_at_once() -> None:
    """Not stopped (a deadlock sleeps): the canary decides, sent a probe round after the
    request came, not at the idle cadence (60 s); the next every stalled_canary_seconds."""
    d, seen = run(_idle(21, "sleeping", since=20))
    assert d.canary_due(T0 + 21.3) is None  # a moment: no doubt yet
    assert d.canary_due(T0 + 21.6) == "unanswered"
    d.feed(CanaryObs(T0 + 21.7, ok=True, latency_s=0.1, sent_t=T0 + 21.6))
    for t in range(22, 25):
        d.feed(scrape(t, Eng()))
        d.feed(GuardObs(T0 + t + 0.3, 1, 0, awaiting=1, awaiting_since=T0 + 20))
    assert d.canary_due(T0 + 22) is None and d.canary_due(T0 + 24.6) == "unanswered"
    assert d.verdicts["0"].state is State.IDLE and not first_stall(seen)
    d.feed(CanaryObs(T0 + 33, ok=False, error=Cause.TIMEOUT, sent_t=T0 + 24.6))
    assert (d.verdicts["0"].state, d.verdicts["0"].cause) == (State.STALLED, "wedged-idle")


def test_a_waiting_request_while_the_engine_moves_is_queued_not_doubted() -> None:
    """Tokens on the wire since the request came: it waits its turn (no canary, no stall, even
    with a process stopped: that is the wire's own rule, for streams silent 5 s)."""
    d, _ = run(_idle(22, "stopped"))
    d.feed(GuardObs(T0 + 22.3, 2, 1, events=3, last_event_t=T0 + 22.1, awaiting=1,
                    awaiting_since=T0 + 20))  # fmt: skip
    d.feed(procs(22.4, "stopped"))
    assert d.canary_due(T0 + 22.5) is None
    assert d.verdicts["0"].state is not State.STALLED


def test_the_last_request_s_progress_scraped_after_the_next_came_does_not_hide_it() -> None:
    """The counters of the request before moved on a scrape just after the next request came
    (stats come after the step): quiet counts from that move, not forever (before: no canary
    until the idle cadence, 69 s on the simulator)."""
    e = Eng()
    obs: list[Observation] = [scrape(t, e) for t in range(12)]
    obs.insert(10, CanaryObs(T0 + 9.5, ok=True, latency_s=0.1, sent_t=T0 + 9.4))
    e.tokens += 5
    obs += [GuardObs(T0 + 12.1, 1, 0, awaiting=1, awaiting_since=T0 + 11.9), scrape(12.2, e)]
    obs += [GuardObs(T0 + 13.1, 1, 0, awaiting=1, awaiting_since=T0 + 11.9)]
    d, _ = run(obs)
    assert d.canary_due(T0 + 13.2) is None
    d.feed(GuardObs(T0 + 13.8, 1, 0, awaiting=1, awaiting_since=T0 + 11.9))
    assert d.canary_due(T0 + 13.8) == "unanswered"
