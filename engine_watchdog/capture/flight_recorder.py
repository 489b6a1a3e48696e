"""Capture step ``flight-recorder``: PyTorch's NCCL flight recorder, dumped through its pipe.

Where an engine process runs with ``TORCH_NCCL_TRACE_BUFFER_SIZE>0`` (newer PyTorch:
``TORCH_FR_BUFFER_SIZE``) and ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>``, each rank keeps a FIFO
``<stem><rank>.pipe`` open; a write to it makes the rank dump its recent collectives to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` (newer: ``TORCH_FR_DUMP_TEMP_FILE``; default
``/tmp/nccl_trace_rank_``). Non-destructive: the process carries on. The dump comes a few seconds
after the write (about 5 s on two H200s, docs/gpu-verification.md), so the step waits for it,
bounded.
It sees only torch.distributed collectives: vLLM's own all-reduce paths bypass it
(vllm/distributed/device_communicators).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine_watchdog.capture.procfs import (
    FIX_ENVIRON_PERMISSION,
    abs_pattern,
    all_denied,
    fifo_fds,
    is_fifo,
    list_dir,
    proc_view,
    read_environs,
    trigger_and_wait,
)
from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.tools import copy_private, write_private

NAME = "flight-recorder"
PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"  # PyTorch's default for the dump file prefix
ENVIRON_EMPTY = (
    "empty /proc/PID/environ (setproctitle zeroes it, and no ancestor's could be read): "
    "start the engine with SPT_NOENV=1"
)
WAIT_S = 10.0
"""Upper bound on the wait for the dumps (~5 s seen on two H200s), also bounded by ctx.timeout_s."""
POLL_S = 0.25
STABLE_S = 0.5
"""A new dump whose size has not changed for this long is complete."""


@dataclass(frozen=True)
class FrConfig:
    buffer_size: int
    pipe_stem: str
    dump_prefix: str


def fr_config(env: Mapping[str, str]) -> FrConfig | None:
    """The flight-recorder settings of one environment, or None where the pipe is not enabled."""
    size = 0
    for var in BUFFER_VARS:
        try:
            size = max(size, int(env.get(var, "0")))
        except ValueError:
            continue
    stem = env.get(PIPE_VAR, "")
    if size <= 0 or not stem:
        return None
    prefix = next((env[v] for v in DUMP_VARS if env.get(v)), DEFAULT_DUMP_PREFIX)
    return FrConfig(size, stem, prefix)


@dataclass
class RankDump:
    """One rank's pipe and what became of its dump."""

    pid: int
    rank: int
    pipe: str
    dump: str
    """Both as the process names them (its own mount namespace)."""
    trigger: str = ""
    size: int = 0
    complete: bool = False
    copied_to: str | None = None
    _pipe_path: Path | None = field(default=None, repr=False)
    _dump_path: Path | None = field(default=None, repr=False)
    _before: tuple[int, int] | None = field(default=None, repr=False)
    _seen: tuple[int, float] = field(default=(-1, 0.0), repr=False)

    def record(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def _stat(path: Path | None) -> tuple[int, int] | None:
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_size, st.st_mtime_ns)


def _rank_dump(
    proc_root: Path, pid: int, cfg: FrConfig, rank: int, pipe: str, path: Path
) -> RankDump:
    dump = abs_pattern(proc_root, pid, cfg.dump_prefix) + str(rank)
    dump_path = proc_view(proc_root, pid, dump)
    return RankDump(
        pid, rank, pipe, dump, _pipe_path=path, _dump_path=dump_path, _before=_stat(dump_path)
    )


def find_ranks(proc_root: Path, procs: Iterable[ProcInfo]) -> tuple[list[RankDump], dict[int, str]]:
    """Every rank pipe of the engine's processes (deduplicated by rank), and why others have none.

    Pipes come first from each process's open files (it holds its own FIFO open), then, for ranks
    not found that way, from the stem's directory.
    """
    configs: dict[int, FrConfig] = {}
    skipped: dict[int, str] = {}
    for p, env in read_environs(proc_root, procs, skipped):
        cfg = fr_config(env)
        if not env:
            skipped[p.pid] = ENVIRON_EMPTY
        elif cfg is None:
            skipped[p.pid] = f"no {PIPE_VAR} with a trace buffer in its environment"
        else:
            configs[p.pid] = cfg
    ranks: dict[int, RankDump] = {}
    for pid, cfg in configs.items():
        rx = re.compile(re.escape(abs_pattern(proc_root, pid, cfg.pipe_stem)) + r"(\d+)\.pipe")
        for path, target in fifo_fds(proc_root, pid, rx):
            rank = int(rx.fullmatch(target).group(1))  # type: ignore[union-attr]
            ranks.setdefault(rank, _rank_dump(proc_root, pid, cfg, rank, target, path))
    for pid, cfg in configs.items():
        for rank, pipe, path in _pipes_in_dir(proc_root, pid, cfg.pipe_stem):
            ranks.setdefault(rank, _rank_dump(proc_root, pid, cfg, rank, pipe, path))
    return [ranks[r] for r in sorted(ranks)], skipped


def _pipes_in_dir(proc_root: Path, pid: int, stem: str) -> list[tuple[int, str, Path]]:
    full = abs_pattern(proc_root, pid, stem)
    directory, _, base = full.rpartition("/")
    rx = re.compile(re.escape(base) + r"(\d+)\.pipe")
    ours = proc_view(proc_root, pid, directory or "/")
    out = []
    for name in list_dir(ours):
        m = rx.fullmatch(name)
        if m and is_fifo(ours / name):
            out.append((int(m.group(1)), f"{directory}/{name}", ours / name))
    return out


def poll_dump(r: RankDump, now: float) -> None:
    """Mark the dump complete once it is new (not the one there before) and stopped growing."""
    cur = _stat(r._dump_path)
    if cur is None or cur == r._before or r.complete:
        return
    if cur[0] != r._seen[0]:
        r._seen, r.size = (cur[0], now), cur[0]
        return
    r.complete = cur[0] > 0 and now - r._seen[1] >= STABLE_S


def make_flight_recorder_step(proc_root: Path = Path("/proc")) -> CaptureStep:
    """The step over a /proc root (a fake one in tests)."""

    async def flight_recorder_step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        ranks, skipped = await asyncio.to_thread(find_ranks, proc_root, ctx.procs)
        if not ranks:
            status, detail = _nothing_to_do(skipped)
            return StepResult(NAME, status, detail=detail, elapsed_s=time.monotonic() - t0)
        pipes = [r._pipe_path or Path(r.pipe) for r in ranks]
        wait_until = t0 + min(WAIT_S, max(ctx.timeout_s - 1.0, 0.0))
        await trigger_and_wait(ranks, pipes, poll_dump, POLL_S, wait_until)
        files = await asyncio.to_thread(_copy_out, ctx.workdir, ranks, skipped)
        status, detail = _outcome(ranks)
        return StepResult(NAME, status, files, detail, time.monotonic() - t0)

    flight_recorder_step.__name__ = NAME  # the bundle writer phases steps by name
    return flight_recorder_step


def _copy_out(workdir: Path, ranks: list[RankDump], skipped: dict[int, str]) -> tuple[str, ...]:
    out = workdir / "flight_recorder"
    out.mkdir(mode=0o700, exist_ok=True)
    for r in ranks:
        if r.complete and r._dump_path is not None:
            dest = out / f"rank{r.rank}_{Path(r.dump).name}"
            copy_private(r._dump_path, dest)
            r.copied_to = f"flight_recorder/{dest.name}"
    index = {"ranks": [r.record() for r in ranks], "skipped": skipped}
    write_private(out / "index.json", json.dumps(index, indent=1).encode())
    return ("flight_recorder/index.json", *(r.copied_to for r in ranks if r.copied_to))


def _outcome(ranks: list[RankDump]) -> tuple[StepStatus, str]:
    done = [r for r in ranks if r.complete]
    detail = f"{len(done)}/{len(ranks)} ranks dumped: " + ", ".join(
        f"rank {r.rank} {r.size} B" if r.complete else f"rank {r.rank} {r.trigger or 'no dump'}"
        for r in ranks
    )
    if len(done) == len(ranks):
        return "ok", detail
    if done:
        return "partial", detail
    return ("timeout" if any(r.trigger == "ok" for r in ranks) else "failed"), detail


def _nothing_to_do(skipped: dict[int, str]) -> tuple[StepStatus, str]:
    if all_denied(skipped):
        return "permission-denied", FIX_ENVIRON_PERMISSION
    if skipped and all(r == ENVIRON_EMPTY for r in skipped.values()):
        return "not-available", f"cannot read the ranks' environment: {ENVIRON_EMPTY}"
    return "not-available", (
        "no flight-recorder pipe: start the engine with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
        f"{PIPE_VAR}=/tmp/nccl_pipe_ "
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=<shared volume>/nccl_trace_rank_"
    )
