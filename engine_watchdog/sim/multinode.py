"""The simulator's multi-node mode: ``engine-watchdog sim --nodes N --ranks-per-node M``.

Each "node" is a process in its own session (as a pod or host would be) with M rank children
(engine_watchdog/sim/distributed.py, titled ``VLLM::Worker_TP{rank}``); ranks are numbered
across nodes (node i holds ranks i*M .. i*M+M-1, GPU 0 .. M-1 on each node) and all of them
run one collective. Each node answers on its own loopback port, so a watchdog given
``--url http://127.0.0.1:PORT`` finds its ranks the way it finds vLLM's (the listener and its
titled descendants):

- ``GET /health``: 200;
- ``GET /metrics``: vLLM's series for a watchdog to judge the group by: one request running
  for good, and ``vllm:generation_tokens_total`` the steps this node's ranks completed (they
  stop when the collective does);
- ``GET /sim/ranks``: ``{"node", "ranks": [{"rank", "pid", "gpu", "gpu_util", "state",
  "steps"}]}``: the simulated GPU utilisation (no NVML here: 100 for a spinning rank, 50 while
  steps advance, 0 once they stop) and the scheduler state from /proc (a rank that died is
  reaped: ``dead``).

The group process (the ``sim`` command) prints one JSON line per node (``node``, ``url``,
``pid``, ``ranks``) once every node answers, then waits for SIGTERM/SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from engine_watchdog.sim.distributed import RANK_FAULTS
from engine_watchdog.sim.engine import _die_with_parent

SAMPLE_S = 0.25
STILL_AFTER_S = 1.0
"""A rank whose steps have not moved for this long reads 0 % (its GPU waits)."""
_STATES = {"R": "running", "S": "sleeping", "D": "sleeping", "T": "stopped", "t": "stopped"}
_STATES |= {"Z": "zombie", "X": "dead", "I": "sleeping"}


class MultiNodeError(ValueError):
    """A bad --nodes / --rank-fault combination (one line naming the fix)."""


@dataclass(frozen=True)
class GroupSpec:
    nodes: int
    ranks_per_node: int
    fault: str = "none"
    fault_rank: int = 0
    after_steps: int = 20

    @classmethod
    def parse(cls, nodes: int, ranks_per_node: int, rank_fault: str, after: int) -> GroupSpec:
        """``rank-fault`` is ``none`` or ``KIND:RANK`` (``rank-stop:1``)."""
        kind, _, rank = rank_fault.partition(":")
        if kind not in RANK_FAULTS:
            raise MultiNodeError(f"--rank-fault {rank_fault!r}: the kind is one of {RANK_FAULTS}")
        if nodes < 1 or ranks_per_node < 1 or nodes * ranks_per_node < 2:
            raise MultiNodeError("--nodes and --ranks-per-node: at least two ranks in all")
        if kind != "none" and not rank.isdigit():
            raise MultiNodeError(f"--rank-fault {rank_fault!r}: name the rank, e.g. {kind}:1")
        number = int(rank) if rank.isdigit() else 0
        if number >= nodes * ranks_per_node:
            raise MultiNodeError(
                f"--rank-fault: rank {number} is not below {nodes * ranks_per_node}"
            )
        return cls(nodes, ranks_per_node, kind, number, after)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "dead"
    return _STATES.get(stat.rpartition(")")[2].split()[0], "sleeping")


class Node:
    """One node process: its ranks, and what it says about them."""

    def __init__(self, spec: GroupSpec, node_rank: int, hub_port: int, workdir: Path) -> None:
        self.name = f"sim-node-{node_rank}"
        self.spec = spec
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.files: dict[int, Path] = {}
        self.samples: dict[int, dict[str, Any]] = {}
        for local in range(spec.ranks_per_node):
            rank = node_rank * spec.ranks_per_node + local
            self.files[rank] = workdir / f"rank-{rank}.steps"
            self.procs[rank] = self._spawn(rank, hub_port)
        self.core = self._engine_core() if node_rank == 0 else None

    def _engine_core(self) -> subprocess.Popen[bytes]:
        """The leader's engine core (vLLM's EngineCore beside its workers; the headless
        workers' nodes have none): sim/shm_broadcast.py."""
        cmd = [sys.executable, "-m", "engine_watchdog.sim.shm_broadcast"]
        cmd += ["--parent-pid", str(os.getpid())]
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)  # noqa: S603 (our own module)

    def _spawn(self, rank: int, hub_port: int) -> subprocess.Popen[bytes]:
        s = self.spec
        cmd = [sys.executable, "-m", "engine_watchdog.sim.distributed", "--rank", str(rank)]
        cmd += ["--world", str(s.world), "--hub-port", str(hub_port)]
        cmd += ["--parent-pid", str(os.getpid()), "--fault", s.fault]
        cmd += ["--fault-rank", str(s.fault_rank), "--fault-after-steps", str(s.after_steps)]
        cmd += ["--step-file", str(self.files[rank])]
        # RANK as torchrun and vLLM set it (the peers read it); SPT_NOENV: setproctitle must
        # not write the title over the environment, or /proc/PID/environ loses RANK.
        env = {**os.environ, "RANK": str(rank), "SPT_NOENV": "1"}
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)  # noqa: S603

    def sample(self, now: float) -> None:
        if self.core is not None:
            self.core.poll()  # reaped once gone
        for rank, proc in self.procs.items():
            gone = proc.poll() is not None  # reaped: a dead rank is gone, not a zombie
            steps, util = _read_steps(self.files[rank])
            last = self.samples.get(rank, {})
            moved_at = now if steps != last.get("steps") else last.get("moved_at", now)
            busy = util if now - moved_at < STILL_AFTER_S else 0.0
            self.samples[rank] = {
                "rank": rank,
                "pid": proc.pid,
                "gpu": rank % self.spec.ranks_per_node,
                "gpu_util": 0.0 if gone else (100.0 if util >= 100 else busy),
                "state": "dead" if gone else proc_state(proc.pid),
                "steps": steps,
                "moved_at": moved_at,
            }

    def metrics(self) -> bytes:
        steps = sum(max(int(r["steps"]), 0) for r in self.samples.values())
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="sim"} 1',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="sim"} 0',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="sim"}} {steps}',
        ]
        return ("\n".join(lines) + "\n").encode()

    def report(self) -> dict[str, Any]:
        ranks = [{k: v for k, v in r.items() if k != "moved_at"} for r in self.samples.values()]
        return {"node": self.name, "ranks": sorted(ranks, key=lambda r: r["rank"])}


def _read_steps(path: Path) -> tuple[int, float]:
    try:
        steps, util = path.read_text().split()
        return int(steps), float(util)
    except (OSError, ValueError):
        return -1, 0.0


def _serve(node: Node, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                body = b"{}"
            elif self.path == "/sim/ranks":
                body = json.dumps(node.report()).encode()
            elif self.path == "/metrics":
                body = node.metrics()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            kind = "text/plain; version=0.0.4" if self.path == "/metrics" else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="NodeStatus", daemon=True).start()
    return server


def node_main(spec: GroupSpec, node_rank: int, hub_port: int, port: int, parent: int) -> None:
    """One node; ``parent`` 0: started by a supervisor of its own (``engine-watchdog run``)."""
    if parent:
        _die_with_parent(parent)
    # SystemExit unwinds the temporary directory; the ranks die with us (PDEATHSIG).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="sim-node-") as tmp:
        node = Node(spec, node_rank, hub_port, Path(tmp))
        node.sample(time.monotonic())
        _serve(node, port)
        while True:
            time.sleep(SAMPLE_S)
            node.sample(time.monotonic())
