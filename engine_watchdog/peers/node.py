"""This node's engine ranks, sampled now: what a capture order (POST /v1/capture) answers.

Each rank process is dumped twice with py-spy (capture/pyspy.py's :func:`dump_process`:
``--native`` first under its own short bound, then plain, ``--nonblocking`` for a stopped
process), a short interval apart, so a stack that does not move is told from one that does;
NVML (capture/gpu_state.py's snapshot) gives each GPU's state and which rank holds it where a GPU is
present. The rank number comes from the process's ``RANK`` variable (torchrun, Ray's vLLM
workers) where it can be read, else from a vLLM worker's title where that alone names it, else -1.
After the samples, PyTorch's NCCL flight recorder is dumped where the ranks enable it
(peers/node_fr.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_watchdog.capture.flight_recorder import make_flight_recorder_step
from engine_watchdog.capture.gpu_state import snapshot
from engine_watchdog.capture.procfs import read_environ
from engine_watchdog.capture.pyspy import (
    DumpOutcome,
    PySpyOptions,
    dump_process,
    read_state_letter,
)
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.core.ranks import NodeReport, RankSample, RankState
from engine_watchdog.peers.node_fr import NodeFlightRecorder, dump_flight_recorder
from engine_watchdog.probes.nvml import GpuProbe

RANK_ROLES = ("engine-core", "worker")
"""Roles that run a model shard; where none is found, every process found is taken (--pid)."""
_STATES = {
    "running": RankState.RUNNING,
    "stopped": RankState.STOPPED,
    "zombie": RankState.ZOMBIE,
    "gone": RankState.DEAD,
}

FindProcs = Callable[[], Awaitable[tuple[ProcInfo, ...]]]


@dataclass(frozen=True)
class NodeCapture:
    """A node's answer: the report for the culprit logic, and the raw evidence for the bundle."""

    report: NodeReport
    stacks: dict[str, str] = field(default_factory=dict)
    """File name (``rank-<rank>-pid-<pid>.txt``) -> both py-spy samples as text."""
    nvml: dict[str, Any] | None = None
    """capture/gpu_state.py's snapshot; None where the node has no NVML."""
    notes: tuple[str, ...] = ()
    flight_recorder: NodeFlightRecorder | None = None
    """None where it was not run (the leader's own node: its bundle has the step itself)."""


def rank_procs(procs: Sequence[ProcInfo]) -> list[ProcInfo]:
    # An orphan found by its title may be another engine's (a stopped one, or one dying): as
    # one of our ranks it hid the culprit, and a group restart stopped it.
    live = [p for p in procs if p.state != "gone" and not p.orphan]
    ranks = [p for p in live if p.role in RANK_ROLES]
    return ranks or live


TP_ONLY_TITLE = re.compile(r"Worker_TP(\d+)")
"""vLLM's multiproc worker title (vllm/v1/executor/multiproc_executor.py,
``setup_proc_title_and_log_prefix``) adds ``_DP``, ``_PP``, ``_PCP``, ``_TP``, ``_DCP``, ``_EP``
for each parallel group larger than one; with ``_TP<n>`` alone, tensor parallelism is the whole
world and its TP rank is the torch.distributed rank."""


def rank_of(pid: int, proc_root: Path, title: str = "") -> int:
    """The process's ``RANK``; else the rank its vLLM title names; else -1. setproctitle zeroes
    /proc/PID/environ (capture/procfs.py), so a titled rank reads no ``RANK``."""
    try:
        text = read_environ(proc_root, pid).get("RANK", "").strip()
    except OSError:
        text = ""
    if text.isdigit():
        return int(text)
    named = TP_ONLY_TITLE.fullmatch(title.rsplit("::", 1)[-1]) if "::" in title else None
    return int(named.group(1)) if named else -1


def main_stack(threads: Any) -> tuple[str, ...]:
    """The main thread's frames (innermost first) from py-spy's JSON, "function (file:line)"."""
    if not isinstance(threads, list) or not threads:
        return ()
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    return tuple(
        f"{fr.get('name')} ({fr.get('short_filename') or fr.get('filename')}:{fr.get('line')})"
        for fr in main.get("frames") or []
    )


class LocalNode:
    """Samples this node's ranks on demand (the peer endpoint, and the leader in-process)."""

    def __init__(
        self,
        name: str,
        find_procs: FindProcs,
        pyspy: str | None,
        gpu: GpuProbe | None = None,
        interval_s: float = 0.5,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.name = name
        self.find_procs = find_procs
        self.pyspy = pyspy
        self.gpu = gpu
        self.interval_s = interval_s
        self.proc_root = proc_root
        self.flight_recorder = make_flight_recorder_step(proc_root)
        self._ranks: dict[int, int] = {}
        """PID -> rank, as last read: a rank that died since is still named by its number."""

    def rank(self, pid: int, title: str = "") -> int:
        found = rank_of(pid, self.proc_root, title)
        if found >= 0:
            self._ranks[pid] = found
        return self._ranks.get(pid, found)

    async def describe(self) -> dict[str, Any]:
        """GET /v1/node: the rank processes and their state, read-only."""
        procs = rank_procs(await self.find_procs())
        ranks = [
            {"pid": p.pid, "rank": self.rank(p.pid, p.title), "role": p.role, "state": p.state}
            for p in procs
        ]
        return {"node": self.name, "pyspy": bool(self.pyspy), "ranks": ranks}

    async def capture(self, budget_s: float, flight_recorder: bool = True) -> NodeCapture:
        """Two py-spy samples of every rank and one NVML snapshot, then (``flight_recorder``)
        the flight-recorder dump, all within ``budget_s``."""
        deadline = time.monotonic() + budget_s
        found = await self.find_procs()
        procs = rank_procs(found)
        # A rank given by --pid that has died is evidence (the culprit, often), not nothing.
        dead = [
            RankSample(self.name, self.rank(p.pid), p.pid, RankState.DEAD)
            for p in found
            if p.state == "gone"
        ]
        gpu_task = asyncio.ensure_future(self._nvml(procs))
        first, second = await self._two_samples(procs, deadline)
        nvml = await gpu_task
        holders = _gpu_holders(nvml)
        samples, stacks, notes = [], {}, []
        for proc, one, two in zip(procs, first, second, strict=True):
            rank = self.rank(proc.pid, proc.title)
            state = _state_now(proc, self.proc_root)
            index = holders.get(proc.pid)
            util = _util(nvml, index)
            stacks_of = tuple(s for s in (one[1], two[1]) if s)
            samples.append(RankSample(self.name, rank, proc.pid, state, stacks_of, index, util))
            stacks[f"rank-{rank}-pid-{proc.pid}.txt"] = _text(proc, (one, two))
            notes += [
                f"pid {proc.pid}: {o.status}, {o.detail}"
                for o, _, _ in (one, two)
                if o.status not in ("ok", "partial")
            ]
        if not procs:
            notes.append("no engine rank process found on this node (--engine, --pid)")
        report = NodeReport(self.name, True, tuple(samples + dead))
        fr = None
        if flight_recorder:  # after the samples: it wakes the engine (capture/step.py)
            left = deadline - time.monotonic()
            fr = await dump_flight_recorder(self.flight_recorder, tuple(procs), left)
            notes += fr.notes
        return NodeCapture(report, stacks, nvml, tuple(notes), fr)

    async def _two_samples(
        self, procs: Sequence[ProcInfo], deadline: float
    ) -> tuple[list[_Dump], list[_Dump]]:
        first = await self._sample(procs, (deadline - time.monotonic()) / 2)
        await asyncio.sleep(max(0.0, min(self.interval_s, deadline - time.monotonic() - 0.5)))
        second = await self._sample(procs, deadline - time.monotonic())
        return first, second

    async def _sample(self, procs: Sequence[ProcInfo], budget_s: float) -> list[_Dump]:
        return list(await asyncio.gather(*(self._dump(p, max(budget_s, 0.2)) for p in procs)))

    async def _dump(self, proc: ProcInfo, budget_s: float) -> _Dump:
        if not self.pyspy:
            return DumpOutcome(proc.pid, "not-available", "-", "py-spy is not installed"), (), ""
        opts = PySpyOptions(native_timeout_s=min(8.0, budget_s / 2))
        workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="ew-peer-"))
        try:
            out = await dump_process(self.pyspy, proc, workdir, budget_s, opts, self.proc_root)
            return await asyncio.to_thread(_read_dump, out, workdir)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _nvml(self, procs: Sequence[ProcInfo]) -> dict[str, Any] | None:
        gpu = self.gpu
        if gpu is None or gpu.start() is not None:
            return None
        return await asyncio.to_thread(snapshot, gpu, tuple(procs))


_Dump = tuple[DumpOutcome, tuple[str, ...], str]
"""A dump's outcome, the main thread's stack, and py-spy's text (or its error)."""


def _read_dump(out: DumpOutcome, workdir: Path) -> _Dump:
    base = workdir / "pyspy" / str(out.pid)
    stack: tuple[str, ...] = ()
    if base.with_suffix(".json").is_file():
        stack = main_stack(json.loads(base.with_suffix(".json").read_bytes()))
    for suffix in (".txt", ".err"):
        if base.with_suffix(suffix).is_file():
            return out, stack, base.with_suffix(suffix).read_text(errors="replace")
    return out, stack, f"no stacks: {out.status}, {out.detail}\n"


def _text(proc: ProcInfo, dumps: Sequence[_Dump]) -> str:
    parts = [
        f"=== sample {i} of pid {proc.pid} ({proc.role}): {d[0].status}, {d[0].mode} ===\n{d[2]}"
        for i, d in enumerate(dumps, 1)
    ]
    return "\n".join(parts)


_LETTERS = {
    "R": RankState.RUNNING,
    "S": RankState.SLEEPING,
    "D": RankState.SLEEPING,
    "I": RankState.SLEEPING,
    "T": RankState.STOPPED,
    "t": RankState.STOPPED,  # held by a debugger: it makes no progress either (probes/procs.py)
    "Z": RankState.ZOMBIE,
    "X": RankState.DEAD,
}


def _state_now(proc: ProcInfo, proc_root: Path) -> RankState:
    """The state after the samples (a rank may have died or been stopped meanwhile): /proc's
    letter (the dumps are over by now, so ``t`` is someone else's tracer), else as found."""
    letter = read_state_letter(proc.pid, proc_root)
    if letter is None:
        return RankState.DEAD
    return _LETTERS.get(letter, _STATES.get(proc.state, RankState.SLEEPING))


def _gpu_holders(nvml: dict[str, Any] | None) -> dict[int, int]:
    holders: dict[int, int] = {}
    for gpu in (nvml or {}).get("gpus") or []:
        for p in gpu.get("processes") or []:
            if isinstance(p.get("pid"), int):
                holders[p["pid"]] = int(gpu["index"])
    return holders


def _util(nvml: dict[str, Any] | None, index: int | None) -> float | None:
    for gpu in (nvml or {}).get("gpus") or []:
        if index is not None and gpu.get("index") == index:
            value = (gpu.get("utilization_pct") or {}).get("gpu")
            return float(value) if isinstance(value, int | float) else None
    return None
