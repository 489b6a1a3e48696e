"""The engine-core child process (vLLM: EngineCoreProc): ``python -m engine_watchdog.sim.engine``.

Like vLLM's, it has an input thread that moves messages from the socket into a queue, and a busy
loop (the main thread) that takes inputs and runs scheduler steps while there is work, sending
each step's outputs and scheduler stats back to the API process. When the loop blocks, new
requests pile up in the queue unseen and nothing more is reported.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from engine_watchdog.sim import protocol as p
from engine_watchdog.sim.cuda_load import GpuWork
from engine_watchdog.sim.faults import API_FAULTS, EngineFaults, FaultSpec
from engine_watchdog.sim.scheduler import Scheduler
from engine_watchdog.sim.settings import SimSettings

log = logging.getLogger("engine_watchdog.sim.core")

IDLE_POLL_S = 1.0
"""Longest single wait of an idle busy loop (it waits again; this only bounds each wait)."""

INIT_TIMEOUT_S = 30.0
GPU_DUTY = 0.8
"""sim --gpu: share of each step's interval the GPU computes (a GPU-bound engine)."""
PR_SET_PDEATHSIG = 1


class EngineCore:
    """One data-parallel rank: scheduler, faults, and the loop that drives them."""

    def __init__(self, settings: SimSettings, rank: int, sock: socket.socket) -> None:
        self.settings = settings
        self.rank = rank
        self._sock = sock
        self._send_lock = threading.Lock()  # the busy loop and the input thread both send
        self.inputs: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.sched = Scheduler(
            settings.max_num_seqs,
            settings.kv_capacity_tokens,
            int(settings.prefill_tokens_per_second / settings.tokens_per_second),
            settings.preemption,
        )
        spec = FaultSpec.from_settings(settings)
        if spec.name in API_FAULTS:
            spec = replace(spec, name="none")  # the API process's fault, not ours
        # sim --gpu: a real CUDA process (imported here, in the engine core, only then).
        self.gpu = GpuWork() if settings.gpu else None
        spin = self.gpu.spin_until if self.gpu is not None else None
        self.faults = EngineFaults(spec, self._notify_fault, gpu_spin=spin)
        self.pause_state = "running"  # running | draining (pause mode=wait) | paused
        self.sleep_level = 0
        self._pause_waiters: list[int] = []
        self._next_step_at = 0.0

    def run(self) -> None:
        reader = threading.Thread(target=self._input_loop, name="EngineCoreInput", daemon=True)
        reader.start()
        self.send(p.READY, {"rank": self.rank, "pid": os.getpid()})
        log.info("EngineCore %d ready (pid %d)", self.rank, os.getpid())
        self.run_busy_loop()

    def send(self, kind: str, body: dict[str, Any]) -> None:
        with self._send_lock:
            self._sock.sendall(p.encode(kind, body))

    def _notify_fault(self, state: dict[str, Any]) -> None:
        self.send(p.FAULT_STATE, state)

    # -- input thread ---------------------------------------------------------------------

    def _input_loop(self) -> None:
        """Socket -> queue. EOF means the API process is gone: exit, never linger orphaned."""
        rfile = self._sock.makefile("rb")
        while True:
            line = rfile.readline(p.MAX_LINE_BYTES)
            if not line:
                log.info("EngineCore %d: API process gone, exiting", self.rank)
                os._exit(0)
            try:
                kind, body = p.decode(line)
            except ValueError:
                log.exception("EngineCore %d: undecodable message dropped", self.rank)
                continue
            if kind == p.CALL and body.get("method") in p.INPUT_THREAD_METHODS:
                self._input_thread_call(body)
            else:
                self.inputs.put((kind, body))

    def _input_thread_call(self, body: dict[str, Any]) -> None:
        spec = FaultSpec(**body["args"]["spec"])
        result = self.faults.apply(spec)
        self.send(p.RESULT, {"call_id": body["call_id"], "result": result})

    # -- busy loop ------------------------------------------------------------------------

    def run_busy_loop(self) -> None:
        """vLLM's EngineCoreProc.run_busy_loop: handle inputs, then step while there is work."""
        while True:
            self._wait_for_inputs()
            self._step()

    def _has_work(self) -> bool:
        if self.sleep_level or self.pause_state == "paused":
            return False
        if self.pause_state == "draining":
            return bool(self.sched.running)
        return self.sched.has_unfinished()

    def _wait_for_inputs(self) -> None:
        """Handle inputs until a step is due (idle: until there is work)."""
        while True:
            self._settle_pause()
            if self._has_work():
                delay = self._next_step_at - time.monotonic()
                if delay <= 0:
                    self._drain_inputs()
                    return
            else:
                delay = IDLE_POLL_S
            try:
                kind, body = self.inputs.get(timeout=delay)
            except queue.Empty:
                continue
            self._handle(kind, body)

    def _drain_inputs(self) -> None:
        """What came in meanwhile, before the step (vLLM's ``_process_input_queue``): else a
        slow engine's back-to-back steps let no new request in until the running ones end."""
        while True:
            try:
                kind, body = self.inputs.get_nowait()
            except queue.Empty:
                return
            self._handle(kind, body)

    def _step(self) -> None:
        sched = self.sched
        held = self.faults.before_step(
            len(sched.running), len(sched.waiting), sched.unfinished_after_next_step()
        )
        if held is not None:
            log.warning("EngineCore %d: fault %s let go of the loop", self.rank, held)
        now = time.monotonic()
        long_s = self.faults.long_prefill_seconds()
        hold = self.faults.held()
        result = sched.step(now, long_s, admit=self.pause_state == "running", held=hold)
        if result.long_prefill_started:
            self.faults.long_prefill_started()
        if result.long_prefill_done:
            self.faults.long_prefill_done()
        self.send(p.OUTPUTS, p.EngineOutputs(result.outputs, result.stats).to_wire())
        interval = 1.0 / self.faults.steps_per_second(self.settings.tokens_per_second)
        self._next_step_at = max(self._next_step_at, now) + interval
        if self.faults.is_slow():
            # A slow engine is busy computing its long step, not asleep: burn the CPU (or the
            # GPU) meanwhile, so it looks like a real slow engine (and unlike a deadlocked one).
            (self.gpu.compute_until if self.gpu else _compute_until)(self._next_step_at)
        elif self.gpu is not None:
            self.gpu.compute_until(now + GPU_DUTY * interval)  # a GPU-bound step

    def _handle(self, kind: str, body: dict[str, Any]) -> None:
        if kind == p.ADD:
            self.sched.add(p.AddRequest(**body))
        elif kind == p.ABORT:
            # The API already finished these requests for its clients: free them. vLLM keeps a
            # finished request in the batch until its next step, which reports the new counts;
            # with nothing else to run, report them here.
            self.sched.abort(list(body["request_ids"]))
            if not self._has_work():
                stats = self.sched.stats_now()
                self.send(p.OUTPUTS, p.EngineOutputs([], stats).to_wire())
        elif kind == p.CALL:
            self._utility(int(body["call_id"]), str(body["method"]), dict(body.get("args", {})))
        else:
            log.warning("EngineCore %d: unknown message %r ignored", self.rank, kind)

    def _utility(self, call_id: int, method: str, args: dict[str, Any]) -> None:
        """Calls that vLLM runs on the busy loop: they wait for it, and hang when it hangs."""
        if method == "pause":
            self._pause(call_id, str(args.get("mode", "abort")))
            return
        result: Any = None
        if method == "resume":
            self.pause_state = "running"
            for waiter in self._pause_waiters:  # a pause that never completed
                self.send(p.RESULT, {"call_id": waiter, "result": False})
            self._pause_waiters.clear()
        elif method == "is_paused":
            result = self.pause_state == "paused"
        elif method == "sleep":
            self.sleep_level = int(args.get("level", 1))
        elif method == "wake_up":
            self.sleep_level = 0
        elif method == "is_sleeping":
            result = self.sleep_level > 0
        elif method == "metrics":
            pass  # llama.cpp's metrics task: the answer only proves the loop turned
        else:
            result = {"error": f"unknown method {method!r}"}
        self.send(p.RESULT, {"call_id": call_id, "result": result})

    def _pause(self, call_id: int, mode: str) -> None:
        if mode == "abort":
            ids = self.sched.abort_all()
            outputs = [p.TokenOutput(i, [], "abort") for i in ids]
            stats = p.SchedulerStats(step_counter=self.sched.step_counter)
            self.send(p.OUTPUTS, p.EngineOutputs(outputs, stats).to_wire())
        # keep: in-flight requests stay where they are; wait: they finish first (no admission).
        self.pause_state = "draining" if mode == "wait" else "paused"
        self._pause_waiters.append(call_id)

    def _settle_pause(self) -> None:
        if self.pause_state == "draining" and not self.sched.running:
            self.pause_state = "paused"
        if self.pause_state == "paused" and self._pause_waiters:
            for call_id in self._pause_waiters:
                self.send(p.RESULT, {"call_id": call_id, "result": True})
            self._pause_waiters.clear()


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the API process dies, even while we hang or are
    stopped; then check it is not already gone (the race prctl leaves open)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the socket's EOF still ends us
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _read_init(sock: socket.socket) -> dict[str, Any]:
    sock.settimeout(INIT_TIMEOUT_S)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)  # byte by byte: whatever follows the line stays for the reader
        if not chunk:
            os._exit(0)
        buf += chunk
    sock.settimeout(None)
    kind, body = p.decode(buf)
    if kind != p.INIT:
        raise RuntimeError(f"expected {p.INIT!r}, got {kind!r}")
    return body


def process_title(rank: int, data_parallel_size: int) -> str:
    """vLLM's title: ``VLLM::EngineCore``, or ``VLLM::EngineCore_DP{rank}`` with DP > 1."""
    prefix = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")
    suffix = f"_DP{rank}" if data_parallel_size > 1 else ""
    return f"{prefix}::EngineCore{suffix}"


def _compute_until(deadline: float) -> None:
    """Busy CPU until ``deadline`` (monotonic), bounded by it."""
    while time.monotonic() < deadline:
        sum(range(2000))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engine_watchdog.sim.engine")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    # Ctrl-C reaches the whole process group; the API process decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    init = _read_init(sock)
    settings = SimSettings.from_wire(init["settings"])
    rank = int(init["rank"])
    import setproctitle  # only here: the API process keeps its command line, as vLLM's does

    setproctitle.setproctitle(process_title(rank, settings.data_parallel_size))
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
        datefmt="%m-%d %H:%M:%S",
    )
    EngineCore(settings, rank, sock).run()


if __name__ == "__main__":
    main()
