"""This node's NCCL flight recorder, dumped for a capture order: what its answer ships back.

capture/flight_recorder.py's step, run on the node's rank processes into a temporary directory
after the py-spy samples (it wakes the engine: capture/step.py's ``WAKES_THE_ENGINE``) and within
what is left of the capture budget. Its files travel in the node's answer (peers/codec.py, base64),
each up to :data:`MAX_FILE_BYTES`; a larger dump stays on the node, where the rank wrote it
(``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``), and a note says so. The CUDA core dump is not run
here: it kills the rank, so it belongs to the restart's destructive capture only.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepStatus
from engine_watchdog.core.model import ProcInfo

MAX_FILE_BYTES = 4 * 1024 * 1024
"""A dump of PyTorch's default 2000 entries is well under this."""
MAX_TOTAL_BYTES = 16 * 1024 * 1024
"""All of a node's dumps together: base64 keeps the answer within peers/codec.py's bound."""
MIN_BUDGET_S = 1.0
"""Less than this left after the samples: no trigger (the dump could not be waited for)."""


@dataclass(frozen=True)
class NodeFlightRecorder:
    """The step's outcome on this node, and its files (name under flight_recorder/ -> bytes)."""

    status: StepStatus
    detail: str
    files: dict[str, bytes] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _collect(workdir: Path, rels: tuple[str, ...]) -> tuple[dict[str, bytes], list[str]]:
    files: dict[str, bytes] = {}
    notes: list[str] = []
    total = 0
    for rel in rels:
        path = workdir / rel
        size = path.stat().st_size
        if size > MAX_FILE_BYTES or total + size > MAX_TOTAL_BYTES:
            notes.append(
                f"flight recorder {path.name}: {size} B, over what a node ships; "
                "it stays on this node where the rank wrote it"
            )
            continue
        files[path.name] = path.read_bytes()
        total += size
    return files, notes


async def dump_flight_recorder(
    step: CaptureStep, procs: tuple[ProcInfo, ...], budget_s: float
) -> NodeFlightRecorder:
    """The step over ``procs`` in a temporary directory, bounded by ``budget_s``."""
    if budget_s < MIN_BUDGET_S:
        return NodeFlightRecorder("timeout", f"{budget_s:.1f} s left after the py-spy samples")
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="ew-peer-fr-"))
    try:
        ctx = CaptureContext(workdir=workdir, procs=procs, timeout_s=budget_s)
        try:
            res = await asyncio.wait_for(step(ctx), budget_s)
        except asyncio.TimeoutError:
            return NodeFlightRecorder("timeout", f"no dump within {budget_s:.1f} s")
        files, notes = await asyncio.to_thread(_collect, workdir, res.files)
        return NodeFlightRecorder(res.status, res.detail, files, tuple(notes))
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
