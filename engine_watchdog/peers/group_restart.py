"""The leader's group stop: every node ordered to stop its ranks and check itself clean, at once.

Part of the leader's restart rung in run mode and on bare metal with ``--peers`` (on
LeaderWorkerSet the group is recreated by LWS instead: docs/multi-node.md). Every node gets
``POST /v1/restart`` at the same moment (``asyncio.gather``), the leader's own node in-process,
all under one deadline; each answers what it stopped and its node-clean report
(peers/node_stop.py). A node that does not answer in time, or answers anything else, is named
unverified: the group is never called clean on its behalf. Each node's report goes to
``nodes/<node>/node-clean.json`` in the incident's bundle, beside the fan-out's files.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.core.model import Outcome, Result
from engine_watchdog.core.settings import Secret
from engine_watchdog.host.tools import write_private
from engine_watchdog.net.http import fetch
from engine_watchdog.peers.auth import bearer
from engine_watchdog.peers.codec import MAX_ANSWER_BYTES, AnswerError
from engine_watchdog.peers.discovery import GroupView, Peer
from engine_watchdog.peers.endpoint import RestartHook
from engine_watchdog.peers.fanout import node_dir_name
from engine_watchdog.recovery.node_clean import REPORT_FILE


@dataclass(frozen=True)
class NodeStop:
    """One node's answer to the restart order, or why there is none."""

    peer: Peer
    result: dict[str, Any] | None
    error: str = ""
    elapsed_s: float = 0.0

    @property
    def verified(self) -> bool:
        return self.result is not None and bool(self.result.get("verified"))

    def line(self) -> str:
        """``node: stopped 2 ranks, removed 2 files, left 0`` or why it is unverified."""
        if self.result is None:
            return f"{self.peer.name} UNVERIFIED ({self.error})"
        clean = self.result.get("clean") or {}
        removed = [i for i in clean.get("removed", []) if i.get("kind") == "shm"]
        # A zombie holds nothing but its PID until its parent reaps it: not a leftover.
        left = [i for i in clean.get("left", []) if i.get("kind") != "zombie"]
        why = "; ".join(f"{i.get('what')}: {i.get('reason')}" for i in left[:3])
        words = f"{self.peer.name}: stopped {len(self.result.get('stopped', []))} rank processes, "
        words += f"removed {len(removed)} files, left {len(left)}" + (f" ({why})" if why else "")
        return words if self.verified else words + ", NOT CLEAN"


async def order_restart(
    session: aiohttp.ClientSession, peer: Peer, secret: Secret, deadline_s: float
) -> dict[str, Any]:
    """One peer's POST /v1/restart; AnswerError (one line) for anything but its result."""
    ans = await fetch(
        session,
        "POST",
        f"http://{peer.address}/v1/restart",
        timeout_s=deadline_s + 1.0,  # the one deadline is the caller's: one wording for all
        max_bytes=MAX_ANSWER_BYTES,
        headers=bearer(secret),
    )
    if ans.status is None:
        raise AnswerError(ans.detail or ans.error or "no answer")
    try:
        doc = json.loads(ans.body)
    except ValueError:
        doc = None
    if ans.status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
        said = doc.get("detail") or doc.get("error") if isinstance(doc, dict) else ans.text()
        raise AnswerError(f"HTTP {ans.status}: {str(said)[:200]}")
    return dict(doc["result"])


async def _one(
    peer: Peer,
    view: GroupView,
    own: RestartHook,
    session: aiohttp.ClientSession,
    secret: Secret,
    deadline_s: float,
) -> NodeStop:
    t0 = time.monotonic()
    try:
        work = own() if peer == view.me else order_restart(session, peer, secret, deadline_s)
        result = await asyncio.wait_for(work, deadline_s)
    except asyncio.TimeoutError:
        return NodeStop(peer, None, f"no answer within {deadline_s:g} s", deadline_s)
    except Exception as e:  # the node's failure is named; the others' answers are kept
        return NodeStop(peer, None, f"{type(e).__name__}: {e}", time.monotonic() - t0)
    return NodeStop(peer, result, "", time.monotonic() - t0)


async def stop_group(
    view: GroupView,
    own: RestartHook,
    session: aiohttp.ClientSession,
    secret: Secret,
    deadline_s: float,
) -> list[NodeStop]:
    """Every node's stop and check, ordered at once under one deadline; in the group's order."""
    work = (_one(p, view, own, session, secret, deadline_s) for p in view.peers)
    return list(await asyncio.gather(*work))


def write_reports(bundle: Path, stops: Sequence[NodeStop]) -> list[str]:
    """``nodes/<node>/node-clean.json`` for every node (its answer, or why none); blocking."""
    files = []
    for stop in stops:
        rel = f"nodes/{node_dir_name(stop.peer.name)}/{REPORT_FILE}"
        doc = {"node": stop.peer.name, "address": stop.peer.address, "answered": bool(stop.result)}
        doc |= {"verified": stop.verified, "error": stop.error}
        doc |= {"elapsed_s": round(stop.elapsed_s, 3), **(stop.result or {})}
        (bundle / rel).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        (bundle / rel).unlink(missing_ok=True)  # a second restart of one incident: the latest
        write_private(bundle / rel, json.dumps(doc, indent=2, default=str).encode())
        files.append(rel)
    return files


def outcome(stops: Sequence[NodeStop]) -> Outcome:
    """The group stop as the restart record says it: every node's line; FAILED (the group not
    verified clean) naming each node that did not answer or is not clean."""
    lines = "; ".join(s.line() for s in stops)
    bad = [s.peer.name for s in stops if not s.verified]
    if bad:
        return Outcome(Result.FAILED, f"group NOT verified clean ({', '.join(bad)}): {lines}")
    return Outcome(Result.OK, f"group stopped and clean: {lines}")
