"""A node's capture answer as JSON, and back: what travels between sidecars.

Reading is strict: a peer's answer is untrusted input, so anything that is not the expected
shape is refused with one line (:class:`AnswerError`) rather than half-read.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, get_args

from engine_watchdog.capture.step import StepStatus
from engine_watchdog.core.ranks import NodeReport, RankSample, RankState
from engine_watchdog.peers.node import NodeCapture
from engine_watchdog.peers.node_fr import MAX_TOTAL_BYTES, NodeFlightRecorder

STATUSES = get_args(StepStatus)
MAX_ANSWER_BYTES = 32 * 1024 * 1024 + MAX_TOTAL_BYTES * 4 // 3
"""Two text dumps of a few hundred threads per rank, eight ranks: well under 32 MiB; plus the
flight-recorder files in base64."""


class AnswerError(ValueError):
    """A peer's answer is not a node capture (one line, what is wrong)."""


def capture_json(cap: NodeCapture) -> dict[str, Any]:
    r = cap.report
    return {
        "node": r.node,
        "ranks": [
            {
                "rank": s.rank,
                "pid": s.pid,
                "state": s.state.value,
                "stacks": [list(stack) for stack in s.stacks],
                "gpu": s.gpu,
                "gpu_util": s.gpu_util,
            }
            for s in r.ranks
        ],
        "stacks": cap.stacks,
        "nvml": cap.nvml,
        "notes": list(cap.notes),
        "flight_recorder": _fr_json(cap.flight_recorder),
    }


def _fr_json(fr: NodeFlightRecorder | None) -> dict[str, Any] | None:
    if fr is None:
        return None
    files = {k: base64.b64encode(v).decode() for k, v in fr.files.items()}
    return {"status": fr.status, "detail": fr.detail, "files": files}


def _read_fr(doc: Any) -> NodeFlightRecorder:
    if doc is None:  # a sidecar from before the node's flight recorder
        return NodeFlightRecorder("not-available", "the node's sidecar sent no flight recorder")
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or doc.get("status") not in STATUSES:
        raise AnswerError("the answer's flight_recorder is malformed")
    try:
        raw = {str(k): base64.b64decode(str(v), validate=True) for k, v in files.items()}
    except (binascii.Error, ValueError):
        raise AnswerError("the answer's flight_recorder files are not base64") from None
    return NodeFlightRecorder(doc["status"], str(doc.get("detail", "")), raw)


def _sample(node: str, d: Any) -> RankSample:
    if not isinstance(d, dict):
        raise AnswerError("a rank is not an object")
    try:
        stacks = tuple(tuple(str(f) for f in st) for st in d.get("stacks") or [])
        gpu, util = d.get("gpu"), d.get("gpu_util")
        return RankSample(
            node,
            int(d["rank"]),
            int(d["pid"]),
            RankState(d["state"]),
            stacks,
            int(gpu) if gpu is not None else None,
            float(util) if util is not None else None,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise AnswerError(f"a rank is malformed ({type(e).__name__}: {e})") from None


def read_capture(body: bytes) -> NodeCapture:
    """Parse a peer's POST /v1/capture answer."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise AnswerError("the answer is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("node"), str):
        raise AnswerError("the answer is not a node capture (no node name)")
    node = doc["node"]
    ranks = doc.get("ranks")
    stacks = doc.get("stacks") or {}
    if not isinstance(ranks, list) or not isinstance(stacks, dict):
        raise AnswerError("the answer's ranks or stacks are malformed")
    samples = tuple(_sample(node, d) for d in ranks)
    texts = {str(k): str(v) for k, v in stacks.items()}
    nvml = doc.get("nvml") if isinstance(doc.get("nvml"), dict) else None
    notes = tuple(str(n) for n in doc.get("notes") or [])
    fr = _read_fr(doc.get("flight_recorder"))
    return NodeCapture(NodeReport(node, True, samples), texts, nvml, notes, fr)
