"""This node's part of a group restart: stop the engine's ranks, then check the node clean.

What the restart order (``POST /v1/restart``) runs on every node, the leader's own in-process:

1. The rank processes this node knows (the same ones a capture samples: peers/node.py), of the
   engine's UID only (``--engine-uid``, else the watchdog's own), each checked by PID and start
   time, and their descendants, are ended: SIGCONT, SIGTERM, SIGKILL after a grace
   (recovery/node_clean.py's :func:`end_processes`). Nothing else: not another UID, not the
   sidecar itself, not a process of the engine's UID outside the ranks' trees.
2. Then recovery/node_clean.py's :func:`clean_node` checks the node: NVML's compute processes
   and the engine's stale shared-memory segments (``nccl-*``, ``torch_*``, ``psm_*``,
   ``vllm_*``) under the shm root (``/dev/shm``; ``ENGINE_WATCHDOG_SHM_ROOT`` for tests and
   containers that mount it elsewhere).

The answer: the ranks stopped, those spared and why, and the :class:`CleanReport` as a dict.
The node is verified clean only when the report is clean and no process of the engine's UID
still holds a GPU. Whatever runs the engine starts it again; this restarts nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.proclist import HostProc, ProcessList, PsutilProcesses
from engine_watchdog.peers.node import FindProcs, rank_procs
from engine_watchdog.recovery.node_clean import (
    GRACE_S,
    CleanReport,
    EngineRef,
    clean_node,
    end_processes,
    engine_processes,
)

SHM_ROOT_VAR = "ENGINE_WATCHDOG_SHM_ROOT"
DEFAULT_SHM_ROOT = Path("/dev/shm")


def shm_root_from(env: Mapping[str, str]) -> Path:
    """The shm root: ``ENGINE_WATCHDOG_SHM_ROOT`` where set (tests, other mounts), else
    /dev/shm."""
    raw = env.get(SHM_ROOT_VAR, "").strip()
    return Path(raw) if raw else DEFAULT_SHM_ROOT


def verified(clean: Mapping[str, Any], uid: int) -> bool:
    """The node is clean: nothing of the engine's left, no GPU held by the engine's UID."""
    held = [i for i in clean.get("left", []) if i.get("kind") == "gpu-process"]
    return bool(clean.get("clean")) and not any(i.get("uid") == uid for i in held)


@dataclass
class NodeRestart:
    """The restart hook of one node's peer endpoint (peers/endpoint.py's ``RestartHook``)."""

    find_procs: FindProcs
    uid: int
    nvml: Any | None
    shm_root: Path = DEFAULT_SHM_ROOT
    procs: ProcessList | None = None
    grace_s: float = GRACE_S

    async def __call__(self) -> dict[str, Any]:
        found = rank_procs(await self.find_procs())
        # psutil, /proc and the waits for processes to end block: off the event loop.
        return await asyncio.to_thread(self.stop_and_clean, found)

    def stop_and_clean(self, found: Sequence[ProcInfo]) -> dict[str, Any]:
        procs = self.procs or PsutilProcesses()
        table = procs.processes()
        ranks, spared = self._ranks(found, table)
        tree = engine_processes(EngineRef(self.uid, ranks), table)
        mine = [p for p in tree.values() if p.pid != os.getpid() and p.status != "zombie"]
        killed, survived = end_processes(procs, mine, self.grace_s)
        report: CleanReport = clean_node(
            EngineRef(self.uid, tuple(mine)), procs, self.nvml, self.shm_root, grace_s=self.grace_s
        )
        clean = report.as_dict()
        rank_pids = {p.pid for p in ranks}
        return {
            "stopped": sorted(p.pid for p in mine if p not in survived and p.pid in rank_pids),
            "stopped_others": sorted(p.pid for p in mine if p.pid not in rank_pids),
            "sigkill": sorted(p.pid for p in killed),
            "survived": sorted(p.pid for p in survived),
            "spared": spared,
            "uid": self.uid,
            "verified": verified(clean, self.uid) and not survived,
            "clean": clean,
        }

    def _ranks(
        self, found: Sequence[ProcInfo], table: Mapping[int, HostProc]
    ) -> tuple[tuple[HostProc, ...], list[str]]:
        """The ranks that are the engine's to stop, and why each other one is spared."""
        ranks, spared = [], []
        for p in found:
            live = table.get(p.pid)
            if live is None:
                continue  # already gone: nothing to stop
            if p.pid == os.getpid():
                spared.append(f"PID {p.pid}: this sidecar")
            elif live.uid != self.uid:
                spared.append(f"PID {p.pid}: UID {live.uid}, not the engine's ({self.uid})")
            else:
                ranks.append(live)
        return tuple(ranks), spared
