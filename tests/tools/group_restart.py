"""One clean group restart as a user runs it: the simulator's multi-node group (2 nodes x 2
ranks), the leader's ``engine-watchdog run`` (node 0 its child) and the worker's ``engine-watchdog
peer`` as real processes on loopback, a rank fault, and the times from the fault to the
verdict, the bundle and the group restart. For tests/integration/test_group_restart.py and
benchmarks/group_restart.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine_watchdog.capture.pyspy import read_state_letter
from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import CONSOLE_SCRIPT
from tests.waiting import eventually

SECRET = "group-restart-secret-" + "5eed5eed5eed"
AFTER_STEPS = 60
"""About 1.5 s of steps before the fault: the leader sees the group progress first."""


@dataclass
class Outcome:
    """What a scenario saw: the times (seconds after the fault) and what was left."""

    bundle: Path
    group: dict[str, Any]
    restart: dict[str, Any]
    reports: dict[str, dict[str, Any]]
    old_ranks: list[int]
    actions: list[dict[str, Any]]
    peer_ports: tuple[int, ...]
    times: dict[str, float] = field(default_factory=dict)
    leaked_procs: list[int] = field(default_factory=list)
    leaked_shm: list[str] = field(default_factory=list)
    foreign: tuple[int, str | None] | None = None
    """The foreign orphan's PID and its state letter after the restart (None: gone)."""


def _node_cmd(rank: int, fault: str, hub: int, port: int) -> list[str]:
    kind, _, fault_rank = fault.partition(":")
    return [
        sys.executable, "-m", "engine_watchdog.sim.multinode_group", "node",
        "--node-rank", str(rank), "--nodes", "2", "--ranks-per-node", "2",
        "--fault", kind, "--fault-rank", fault_rank or "0",
        "--fault-after-steps", str(AFTER_STEPS), "--hub-port", str(hub), "--port", str(port),
        "--parent-pid", "0",
    ]  # fmt: skip


def _ranks(port: int) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/ranks", timeout=2) as r:
            return list(json.loads(r.read())["ranks"])
    except OSError:
        return []


def _peer_args(ports: tuple[int, ...], own: int, secret: Path) -> list[str]:
    listed = ",".join(f"127.0.0.1:{p}" for p in ports)
    return ["--peers", listed, "--peer-port", str(own), "--peer-bind", "127.0.0.1",
            "--peer-secret-file", str(secret)]  # fmt: skip


FOREIGN = (
    "import os, signal, setproctitle\n"
    "setproctitle.setproctitle('VLLM::Worker_TP1')\n"
    "os.kill(os.getpid(), signal.SIGSTOP)\n"
)
"""Another engine's worker on the leader's host, hung: our engine's title and UID, its parent
gone (reparented to init), stopped. A capture must not take it for one of our ranks, nor a
group restart stop it."""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Scenario:
    """Start everything under ``workdir``; :meth:`close` kills every process group started."""

    def __init__(
        self,
        workdir: Path,
        fault: str,
        silent_peer: bool = False,
        deadline_s: float = 8.0,
        foreign: bool = False,
    ) -> None:
        self.workdir, self.fault, self.deadline_s = workdir, fault, deadline_s
        self.foreign = foreign
        self.foreign_pid: int | None = None
        self.shm = workdir / "shm"
        self.shm.mkdir(parents=True)
        self.incidents = workdir / "incidents"
        (workdir / "secret").mkdir()
        self.secret = workdir / "secret" / "secret"
        self.secret.write_text(SECRET + "\n")
        self.env = dict(os.environ)
        self.env.pop("PYTHONUNBUFFERED", None)
        self.hub, self.ports = free_port(), (free_port(), free_port())
        self.peer_ports: tuple[int, ...] = (free_port(), free_port())
        self.silent: asyncio.Server | None = None
        self.silent_peer = silent_peer
        self.procs: list[asyncio.subprocess.Process] = []
        self.leader: asyncio.subprocess.Process | None = None

    def node_shm(self, node: int) -> Path:
        """Each node its own /dev/shm, as hosts and pods have: node i's ranks and sidecar."""
        (self.shm / f"node{node}").mkdir(exist_ok=True)
        return self.shm / f"node{node}"

    async def _spawn(self, *argv: str, log: str, node: int) -> asyncio.subprocess.Process:
        shm = str(self.node_shm(node))
        env = self.env | {"ENGINE_WATCHDOG_SIM_SHM_DIR": shm, "ENGINE_WATCHDOG_SHM_ROOT": shm}
        with (self.workdir / log).open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=out if log != "leader.out" else asyncio.subprocess.PIPE,
                stderr=out, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def start_foreign(self) -> None:
        """The shell exits at once, leaving its child to init; its group is killed at close."""
        sh = await self._spawn(
            "sh", "-c", f'"{sys.executable}" -c "$0" & echo $!', FOREIGN, log="foreign.out", node=0
        )
        await sh.wait()
        pid = self.foreign_pid = int((self.workdir / "foreign.out").read_text().split()[0])
        await eventually(lambda: read_state_letter(pid) == "T", 20, what="the orphan stopped")

    async def start(self) -> None:
        if self.foreign:
            await self.start_foreign()
        if self.silent_peer:  # accepts the connection, never answers (a hung sidecar)
            self.silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            self.peer_ports += (int(self.silent.sockets[0].getsockname()[1]),)
        await self._spawn(
            *_node_cmd(1, self.fault, self.hub, self.ports[1]), log="node1.out", node=1
        )
        ranks = await eventually(lambda: len(_ranks(self.ports[1])) == 2 and _ranks(self.ports[1]),
                                 30, what="node 1's ranks")  # fmt: skip
        pids = [a for r in ranks for a in ("--pid", str(r["pid"]))]
        args = _peer_args(self.peer_ports, self.peer_ports[1], self.secret)
        await self._spawn(str(CONSOLE_SCRIPT), "peer", *pids, *args, log="peer.out", node=1)
        self.leader = await self._spawn(
            str(CONSOLE_SCRIPT), "run", f"http://127.0.0.1:{self.ports[0]}", "--json",
            "--listen", f"127.0.0.1:{free_port()}", "--engine", "vllm", "--interval", "0.5",
            "--suspect-seconds", "1", "--stall-seconds", "3", "--no-canary", "--startup-grace", "1",
            "--action", "capture,restart", "--incident-dir", str(self.incidents),
            "--peer-deadline", str(self.deadline_s),
            *_peer_args(self.peer_ports, self.peer_ports[0], self.secret),
            "--", *_node_cmd(0, self.fault, self.hub, self.ports[0]), log="leader.out", node=0,
        )  # fmt: skip

    async def old_ranks(self) -> list[dict[str, Any]]:
        found = await eventually(
            lambda: len(r := _ranks(self.ports[0]) + _ranks(self.ports[1])) == 4 and r,
            30, what="every rank",
        )  # fmt: skip
        return list(found)

    async def fault_time(self) -> float:
        """When the faulty rank reached its fault step (the nodes sample every 0.25 s)."""
        rank = int(self.fault.partition(":")[2])
        port = self.ports[rank // 2]

        def reached() -> bool:
            return any(r["rank"] == rank and r["steps"] >= AFTER_STEPS - 1 for r in _ranks(port))

        await eventually(reached, 60, interval=0.05, what="the fault")
        return time.monotonic()

    async def verdict(self, timeout: float) -> dict[str, Any]:
        assert self.leader is not None and self.leader.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.leader.stdout.readline()
                assert line, "the leader exited"
                doc: dict[str, Any] = json.loads(line)
                if doc.get("state") == "stalled":
                    return doc

    def restart_record(self) -> dict[str, Any] | None:
        path = self.incidents / "actions.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        done = [json.loads(x) for x in lines if '"restart"' in x]
        return done[0] if done else None

    async def close(self) -> None:
        for proc in self.procs:  # SIGTERM first: run mode ends its child's group itself
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if self.silent is not None:
            self.silent.close()


async def run_scenario(
    workdir: Path,
    fault: str,
    silent_peer: bool = False,
    deadline_s: float = 8.0,
    foreign: bool = False,
) -> Outcome:
    """The whole path for one fault; every process ended on the way out."""
    sc = Scenario(workdir, fault, silent_peer, deadline_s, foreign)
    try:
        await sc.start()
        old = [int(r["pid"]) for r in await sc.old_ranks()]
        t0 = await sc.fault_time()
        await sc.verdict(60)
        times = {"verdict": time.monotonic() - t0}
        found = await eventually(lambda: list(sc.incidents.glob("2*/nodes/group.json")), 60)
        times["bundle"] = time.monotonic() - t0
        record = await eventually(sc.restart_record, 60, what="the restart record")
        times["restart"] = time.monotonic() - t0
        bundle = found[0].parent.parent
        reports = {
            p.parent.name: json.loads(p.read_text()) for p in bundle.glob("nodes/*/node-clean.json")
        }
        with contextlib.suppress(AssertionError):  # what is left is the outcome's to say
            await eventually(lambda: all(_gone(p) for p in old), 15, what="the old ranks gone")
        procs = [p for p in old if not _gone(p)]
        leaked = [p.name for p in sc.shm.glob("*/nccl-*") if int(p.name.rpartition("-p")[2]) in old]
        group = json.loads(found[0].read_text())
        actions = [json.loads(x) for x in (sc.incidents / "actions.jsonl").read_text().splitlines()]
        pid = sc.foreign_pid
        left = None if pid is None else (pid, read_state_letter(pid))
        return Outcome(bundle, group, record, reports, old, actions, sc.peer_ports, times,
                       procs, leaked, left)  # fmt: skip
    finally:
        await sc.close()
