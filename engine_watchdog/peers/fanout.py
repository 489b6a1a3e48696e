"""The leader's capture order to every node at once, and what it writes into its bundle.

At the verdict every node is ordered to capture at the same moment (``asyncio.gather``), the
leader's own node in-process, all under one deadline. A node that does not answer within it,
answers 401 or answers something that is not a capture is named, and the others' evidence is
kept: the bundle is written all the same (it is the bundle writer's temporary directory,
renamed into place only when complete: capture/bundle.py).

Files, under the bundle: ``nodes/<node>/manifest.json`` (the node's report, or why it is
missing), ``nodes/<node>/<rank stacks>.txt``, ``nodes/<node>/nvml.json``,
``nodes/<node>/flight_recorder/`` (its NCCL flight-recorder dumps, peers/node_fr.py);
``nodes/group.json`` (every node, and the culprit). The leader's own node is captured without the
flight recorder: the leader's bundle runs that step itself (flight_recorder/), after this one.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.culprit import name_culprit
from engine_watchdog.core.ranks import Culprit, NodeReport
from engine_watchdog.core.settings import Secret
from engine_watchdog.host.tools import write_private
from engine_watchdog.net.http import fetch
from engine_watchdog.peers.auth import bearer
from engine_watchdog.peers.codec import MAX_ANSWER_BYTES, AnswerError, read_capture
from engine_watchdog.peers.discovery import GroupView, Peer
from engine_watchdog.peers.node import LocalNode, NodeCapture
from engine_watchdog.peers.node_fr import NodeFlightRecorder

STEP_NAME = "peers"
TRANSFER_MARGIN_S = 2.0
"""Of the deadline, kept back for a peer's answer to travel: its capture gets the rest."""


@dataclass(frozen=True)
class NodeResult:
    peer: Peer
    capture: NodeCapture | None
    error: str = ""
    elapsed_s: float = 0.0

    @property
    def report(self) -> NodeReport:
        if self.capture is not None:
            return self.capture.report
        return NodeReport(self.peer.name, False, error=self.error)


async def order_capture(
    session: aiohttp.ClientSession, peer: Peer, secret: Secret, deadline_s: float
) -> NodeCapture:
    """One peer's POST /v1/capture; AnswerError (one line) for anything but a capture."""
    budget = max(deadline_s - TRANSFER_MARGIN_S, 1.0)
    ans = await fetch(
        session,
        "POST",
        f"http://{peer.address}/v1/capture",
        timeout_s=deadline_s,
        max_bytes=MAX_ANSWER_BYTES,
        json_body={"budget_s": budget},
        headers=bearer(secret),
    )
    if ans.status is None:
        raise AnswerError(ans.detail or ans.error or "no answer")
    if ans.status == 401:
        raise AnswerError("401: it refused the secret (is --peer-secret-file the same Secret?)")
    if ans.status != 200:
        raise AnswerError(f"HTTP {ans.status}: {ans.text()[:200]}")
    return read_capture(ans.body)


async def _one(
    peer: Peer,
    view: GroupView,
    local: LocalNode,
    session: aiohttp.ClientSession,
    secret: Secret,
    deadline_s: float,
) -> NodeResult:
    t0 = time.monotonic()
    try:
        if peer == view.me:
            work = local.capture(max(deadline_s - TRANSFER_MARGIN_S, 1.0), flight_recorder=False)
        else:
            work = order_capture(session, peer, secret, deadline_s)
        cap = await asyncio.wait_for(work, deadline_s)
    except asyncio.TimeoutError:
        return NodeResult(peer, None, f"no answer within {deadline_s:.0f} s", deadline_s)
    except (AnswerError, OSError) as e:
        return NodeResult(peer, None, str(e), time.monotonic() - t0)
    return NodeResult(peer, cap, "", time.monotonic() - t0)


async def fan_out(
    view: GroupView,
    local: LocalNode,
    session: aiohttp.ClientSession,
    secret: Secret,
    deadline_s: float = 15.0,
) -> list[NodeResult]:
    """Every node's capture, ordered at once, the leader's in-process; in the group's order."""
    return list(
        await asyncio.gather(
            *(_one(p, view, local, session, secret, deadline_s) for p in view.peers)
        )
    )


def node_dir_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "node"


def write_nodes(workdir: Path, results: Sequence[NodeResult], culprit: Culprit) -> list[str]:
    """``nodes/...`` under the bundle's directory (blocking). Returns the files written."""
    files: list[str] = []

    def put(rel: str, data: bytes) -> None:
        (workdir / rel).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(workdir / rel, data)
        files.append(rel)

    for res in results:
        base = f"nodes/{node_dir_name(res.peer.name)}"
        cap = res.capture
        put(f"{base}/manifest.json", _dump(_node_manifest(res)))
        for name, text in (cap.stacks if cap else {}).items():
            put(f"{base}/{node_dir_name(name)}", text.encode())
        if cap is not None and cap.nvml is not None:
            put(f"{base}/nvml.json", _dump(cap.nvml))
        fr = cap.flight_recorder if cap else None
        for name, data in (fr.files if fr else {}).items():
            put(f"{base}/flight_recorder/{node_dir_name(name)}", data)
    group = {
        "nodes": [
            {
                "node": r.peer.name,
                "address": r.peer.address,
                "answered": r.capture is not None,
                "error": r.error,
                "elapsed_s": round(r.elapsed_s, 3),
            }
            for r in results
        ],
        "culprit": _jsonable(asdict(culprit)),
    }
    put("nodes/group.json", _dump(group))
    return files


def _node_manifest(res: NodeResult) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node": res.peer.name,
        "address": res.peer.address,
        "answered": res.capture is not None,
        "error": res.error,
        "elapsed_s": round(res.elapsed_s, 3),
    }
    if res.capture is not None:
        doc["ranks"] = [_jsonable(asdict(s)) for s in res.capture.report.ranks]
        doc["stack_files"] = sorted(node_dir_name(n) for n in res.capture.stacks)
        doc["notes"] = list(res.capture.notes)
        doc["flight_recorder"] = _fr_manifest(res.capture.flight_recorder)
    return doc


def _fr_manifest(fr: NodeFlightRecorder | None) -> dict[str, Any]:
    if fr is None:
        return {"status": "in-bundle", "detail": "the leader's own flight-recorder step"}
    files = sorted(f"flight_recorder/{node_dir_name(n)}" for n in fr.files)
    return {"status": fr.status, "detail": fr.detail, "files": files}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, default=str).encode()


def summary_line(results: Sequence[NodeResult], culprit: Culprit) -> str:
    """The step's detail in the manifest and summary.md: who answered, who did not."""
    parts = [
        f"{r.peer.name} answered ({len(r.capture.report.ranks)} ranks)"
        if r.capture is not None
        else f"{r.peer.name} DID NOT ANSWER ({r.error})"
        for r in results
    ]
    return "; ".join(parts) + f"; culprit: {culprit.confidence.value} ({culprit.why})"


def peers_step(
    view: GroupView,
    local: LocalNode,
    session: aiohttp.ClientSession,
    secret: Secret,
    deadline_s: float = 15.0,
) -> CaptureStep:
    """The leader's capture step: fan out, write ``nodes/``, name the culprit."""

    async def step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        # The bundle writer abandons a step after its timeout: answer within it.
        deadline = min(deadline_s, max(ctx.timeout_s - 1.0, 1.0))
        results = await fan_out(view, local, session, secret, deadline)
        culprit = name_culprit([r.report for r in results])
        files = await asyncio.to_thread(write_nodes, ctx.workdir, results, culprit)
        answered = sum(r.capture is not None for r in results)
        status: StepStatus = (
            "ok" if answered == len(results) else ("partial" if answered else "failed")
        )
        detail = summary_line(results, culprit)
        return StepResult(STEP_NAME, status, tuple(files), detail, time.monotonic() - t0)

    step.__name__ = STEP_NAME
    return step
