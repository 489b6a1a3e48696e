"""The simulator's engine-core bookkeeping without processes: scheduler steps and fault rules
(fast; the process-level behaviour is in test_sim.py and test_sim_faults.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

from engine_watchdog.sim.faults import EngineFaults, FaultSpec
from engine_watchdog.sim.protocol import AddRequest
from engine_watchdog.sim.scheduler import NATURAL_LENGTH_TOKENS, Scheduler


def run_until_done(sched: Scheduler, max_steps: int = 10_000) -> dict[str, str]:
    reasons: dict[str, str] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return reasons
        for out in sched.step(0.0, None, admit=True).outputs:
            if out.finish_reason:
                reasons[out.request_id] = out.finish_reason
    raise AssertionError("scheduler did not finish its requests")


def test_chunked_prefill_fills_kv_before_the_first_token() -> None:
    sched = Scheduler(max_num_seqs=8, kv_capacity=1000, chunk_tokens=30, preemption=True)
    sched.add(AddRequest("a", prompt_tokens=100, max_tokens=3))
    usages = []
    for _ in range(3):
        result = sched.step(0.0, None, admit=True)
        assert result.outputs == []
        usages.append(result.stats.kv_cache_usage)
    assert usages == [0.03, 0.06, 0.09]
    first = sched.step(0.0, None, admit=True)  # the last 10 prompt tokens, and a token
    assert [o.new_token_ids for o in first.outputs] == [[0]]


def test_full_kv_preempts_and_every_request_still_finishes() -> None:
    sched = Scheduler(max_num_seqs=8, kv_capacity=40, chunk_tokens=100, preemption=True)
    for rid in "abcd":
        sched.add(AddRequest(rid, prompt_tokens=5, max_tokens=20))
    preemptions = 0
    reasons: dict[str, str] = {}
    while sched.has_unfinished():
        result = sched.step(0.0, None, admit=True)
        preemptions += result.stats.num_preemptions
        reasons |= {o.request_id: o.finish_reason for o in result.outputs if o.finish_reason}
        assert result.stats.kv_cache_usage <= 1.0
    assert preemptions > 0 and reasons == dict.fromkeys("abcd", "length")


def test_max_num_seqs_and_finish_reasons() -> None:
    sched = Scheduler(max_num_seqs=1, kv_capacity=10_000, chunk_tokens=100, preemption=False)
    sched.add(AddRequest("long", prompt_tokens=1, max_tokens=NATURAL_LENGTH_TOKENS + 10))
    sched.add(
        AddRequest(
            "forced", prompt_tokens=1, max_tokens=NATURAL_LENGTH_TOKENS + 10, ignore_eos=True
        )
    )
    stats = sched.step(0.0, None, admit=True).stats
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_waiting_capacity) == (1, 1, 1)
    assert run_until_done(sched) == {"long": "stop", "forced": "length"}


def test_long_prefill_stretches_one_prompt_over_its_seconds() -> None:
    sched = Scheduler(max_num_seqs=8, kv_capacity=1000, chunk_tokens=1000, preemption=True)
    sched.add(AddRequest("a", prompt_tokens=400, max_tokens=2))
    started = sched.step(0.0, 10.0, admit=True)
    assert started.long_prefill_started and started.outputs == []
    halfway = sched.step(5.0, 10.0, admit=True)
    assert halfway.outputs == [] and halfway.stats.kv_cache_usage == 0.2
    done = sched.step(10.0, 10.0, admit=True)
    assert done.long_prefill_done and [o.new_token_ids for o in done.outputs] == [[0]]


def test_freeze_last_holds_the_loop_once_the_last_request_is_left() -> None:
    states: list[dict[str, Any]] = []
    faults = EngineFaults(FaultSpec("freeze-last", freeze_last_n=1), states.append)
    assert faults.before_step(running=0, waiting=4, unfinished_after=4) is None
    assert faults.before_step(running=4, waiting=0, unfinished_after=2) is None
    assert faults.before_step(running=2, waiting=0, unfinished_after=1) is None
    held = run_blocked(lambda: faults.before_step(1, 0, 1), states, faults)
    assert held == ["freeze-last"]


def test_deadlock_blocks_on_a_real_lock_until_cleared() -> None:
    states: list[dict[str, Any]] = []
    faults = EngineFaults(FaultSpec("deadlock"), states.append)
    assert run_blocked(lambda: faults.before_step(1, 0, 1), states, faults) == ["deadlock"]
    assert faults.before_step(1, 0, 1) is None  # cleared: the loop steps again


def test_spin_with_a_gpu_spins_there_until_cleared() -> None:
    """sim --gpu: the spin fault hands the wait to the GPU spinner, which stops when told."""
    states: list[dict[str, Any]] = []
    kernels: list[float] = []

    def gpu_spin(stop: Any) -> None:  # stands in for GpuWork.spin_until (one kernel per loop)
        while not stop():
            kernels.append(time.monotonic())
            time.sleep(0.01)

    faults = EngineFaults(FaultSpec("spin"), states.append, gpu_spin=gpu_spin)
    assert run_blocked(lambda: faults.before_step(1, 0, 1), states, faults) == ["spin"]
    assert len(kernels) > 5  # it kept spinning on the "GPU" while the fault was on


def run_blocked(call: Any, states: list[dict[str, Any]], faults: EngineFaults) -> list[Any]:
    """Run ``call`` in a thread; once the fault says it fired, check the thread is stuck, then
    clear the fault and return what the call returned."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not any(s["state"] == "fired" for s in states):
        assert time.monotonic() < deadline, "fault never fired"
        time.sleep(0.01)
    thread.join(0.3)
    assert thread.is_alive() and out == []
    faults.apply(FaultSpec())
    thread.join(10)
    assert not thread.is_alive()
    return out
