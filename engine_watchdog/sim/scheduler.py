"""The engine core's scheduler: continuous batching, chunked prefill, KV accounting, preemption.

Plain bookkeeping: no I/O, no clock (time comes in as an argument), no faults beyond the
long-prefill stretch, so the engine loop that drives it stays short. Names follow vLLM's v1
scheduler where they mean the same thing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_watchdog.sim.protocol import AddRequest, SchedulerStats, TokenOutput

NATURAL_LENGTH_TOKENS = 256
"""The dummy model emits EOS (finish_reason stop) after this many tokens, unless ignore_eos."""


@dataclass
class Request:
    """One request inside the engine core."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    num_output: int = 0
    num_computed: int = 0
    """Tokens whose KV is held."""
    prefilling: bool = True
    prefill_target: int = 0
    """Tokens to compute before the next sample: the prompt, plus earlier output after a
    preemption (vLLM recomputes a preempted request from scratch)."""
    long_prefill_start: float | None = None
    """Set while the long-prefill fault stretches this request's prefill."""


@dataclass
class StepResult:
    """What one step produced."""

    outputs: list[TokenOutput] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    long_prefill_started: bool = False
    long_prefill_done: bool = False


class Scheduler:
    """FCFS admission into a running batch bounded by max_num_seqs and the KV capacity."""

    def __init__(
        self, max_num_seqs: int, kv_capacity: int, chunk_tokens: int, preemption: bool
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.kv_capacity = kv_capacity
        self.chunk_tokens = max(1, chunk_tokens)
        self.preemption = preemption
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.step_counter = 0
        self._long_prefill_assigned = False

    def add(self, add: AddRequest) -> None:
        self.waiting.append(
            Request(add.request_id, add.prompt_tokens, add.max_tokens, add.ignore_eos)
        )

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self.waiting = deque(r for r in self.waiting if r.request_id not in ids)
        self.running = [r for r in self.running if r.request_id not in ids]

    def abort_all(self) -> list[str]:
        ids = [r.request_id for r in (*self.running, *self.waiting)]
        self.running, self.waiting = [], deque()
        return ids

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def unfinished_after_next_step(self) -> int:
        """Requests still in flight after the next step, if it admits nothing new."""
        ending = sum(1 for r in self.running if not r.prefilling and self._ends_next(r))
        return len(self.running) - ending + len(self.waiting)

    def step(
        self,
        now: float,
        long_prefill_s: float | None,
        admit: bool,
        held: tuple[str, int] | None = None,
    ) -> StepResult:
        """One engine step: admit, prefill a chunk, decode one token per running request.
        ``held``: (marker, n): a running request whose id holds the marker gets no token past
        its n-th (the stuck-request fault: it stays running, unscheduled)."""
        result = StepResult()
        if long_prefill_s is None:
            self._drop_long_prefill()
        if admit:
            result.long_prefill_started = self._admit(now, long_prefill_s)
        budget = self.chunk_tokens
        preempted = 0
        for req in list(self.running):
            if req not in self.running:  # preempted earlier in this step
                continue
            if req.prefilling:
                budget -= self._prefill(req, budget, now, long_prefill_s)
                if req.prefilling:
                    continue
                result.long_prefill_done |= req.long_prefill_start is not None
                req.long_prefill_start = None
            elif held is not None and held[0] in req.request_id and req.num_output >= held[1]:
                continue
            else:
                room, n = self._make_room(req)
                preempted += n
                if not room:
                    continue
                req.num_computed += 1
            result.outputs.append(self._sample(req))
        self.step_counter += 1
        result.stats = self._stats(preempted)
        return result

    def _admit(self, now: float, long_prefill_s: float | None) -> bool:
        started = False
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            req.prefill_target = req.prompt_tokens + req.num_output
            if self._admission_need(req) > self._kv_free():
                break  # head-of-line: FCFS like vLLM; the rest wait for capacity
            self.waiting.popleft()
            req.prefilling, req.num_computed = True, 0
            if long_prefill_s is not None and not self._long_prefill_assigned:
                req.long_prefill_start, started = now, True
                self._long_prefill_assigned = True
            self.running.append(req)
        return started

    def _prefill(self, req: Request, budget: int, now: float, long_s: float | None) -> int:
        """Compute one chunk of the request's prefill; return the tokens used from the budget."""
        remaining = req.prefill_target - req.num_computed
        if req.long_prefill_start is not None and long_s is not None:
            # The fault: the prompt's KV fills in linearly over long_s seconds, whatever its size.
            share = min(1.0, (now - req.long_prefill_start) / long_s)
            chunk = min(remaining, int(req.prefill_target * share) - req.num_computed)
            chunk = remaining if share >= 1.0 else max(0, chunk)
            used = 0
        else:
            chunk = used = min(remaining, max(0, budget))
        req.num_computed += chunk
        req.prefilling = req.num_computed < req.prefill_target
        return used

    def _make_room(self, req: Request) -> tuple[bool, int]:
        """Find one KV slot for a decode step, preempting the newest requests if needed."""
        if not self.preemption:
            return True, 0  # its whole length was reserved at admission
        preempted = 0
        while self._kv_free() < 1:
            victim = self.running.pop()
            victim.num_computed, victim.prefilling = 0, True
            self.waiting.appendleft(victim)
            preempted += 1
            if victim is req:
                return False, preempted
        return True, preempted

    def _sample(self, req: Request) -> TokenOutput:
        token_id = req.num_output
        req.num_output += 1
        reason: str | None = None
        if not req.ignore_eos and req.num_output >= NATURAL_LENGTH_TOKENS:
            reason = "stop"
        elif req.num_output >= req.max_tokens:
            reason = "length"
        if reason is not None:
            self.running.remove(req)
        return TokenOutput(req.request_id, [token_id], reason)

    def _ends_next(self, req: Request) -> bool:
        n = req.num_output + 1
        return n >= req.max_tokens or (not req.ignore_eos and n >= NATURAL_LENGTH_TOKENS)

    def _drop_long_prefill(self) -> None:
        # The fault was cleared or has ended: any stretched prefill continues at the normal rate.
        self._long_prefill_assigned = False
        for req in self.running:
            req.long_prefill_start = None

    def _admission_need(self, req: Request) -> int:
        if not self.preemption:
            return req.prompt_tokens + req.max_tokens
        return req.prefill_target + 1

    def _reserved(self, req: Request) -> int:
        if not self.preemption:
            return req.prompt_tokens + req.max_tokens
        return req.prefill_target if req.prefilling else req.num_computed

    def _kv_free(self) -> int:
        return self.kv_capacity - sum(self._reserved(r) for r in self.running)

    def stats_now(self) -> SchedulerStats:
        """The counts as they stand, between steps."""
        return self._stats(0)

    def _stats(self, preempted: int) -> SchedulerStats:
        held = sum(r.num_computed for r in self.running)
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            # Every waiting request here waits for room (batch slots or KV blocks); the
            # simulator has nothing that vLLM defers (grammar compilation, remote KV).
            num_waiting_capacity=len(self.waiting),
            num_waiting_deferred=0,
            kv_cache_usage=min(1.0, held / self.kv_capacity),
            num_preemptions=preempted,
            step_counter=self.step_counter,
        )
