"""Start and stop a multi-node group: one process per node, each in its own session.

For the ``sim --nodes`` command and for tests::

    with MultiNodeGroup(GroupSpec.parse(2, 2, "rank-stop:1", 20)) as group:
        group.nodes  # [NodeHandle(name, url, pid)], group.ranks(node) -> /sim/ranks

``python -m engine_watchdog.sim.multinode_group node ...`` is one node's process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from engine_watchdog.sim.multinode import GroupSpec, free_port, node_main

POLL_S = 0.1


@dataclass(frozen=True)
class NodeHandle:
    name: str
    url: str
    pid: int


class MultiNodeGroup:
    def __init__(self, spec: GroupSpec, startup_timeout: float = 20.0) -> None:
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.nodes: list[NodeHandle] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> MultiNodeGroup:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        hub = free_port()
        for i in range(self.spec.nodes):
            port = free_port()
            proc = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
                self._node_cmd(i, hub, port), stdin=subprocess.DEVNULL, start_new_session=True
            )
            self._procs.append(proc)
            self.nodes.append(NodeHandle(f"sim-node-{i}", f"http://127.0.0.1:{port}", proc.pid))
        deadline = time.monotonic() + self.startup_timeout
        for node in self.nodes:
            while not _answers(node.url + "/health"):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{node.name} did not answer within {self.startup_timeout} s"
                    )
                time.sleep(POLL_S)

    def _node_cmd(self, i: int, hub: int, port: int) -> list[str]:
        s = self.spec
        cmd = [sys.executable, "-m", "engine_watchdog.sim.multinode_group", "node"]
        cmd += ["--node-rank", str(i), "--nodes", str(s.nodes)]
        cmd += ["--ranks-per-node", str(s.ranks_per_node), "--fault", s.fault]
        cmd += ["--fault-rank", str(s.fault_rank), "--fault-after-steps", str(s.after_steps)]
        cmd += ["--hub-port", str(hub), "--port", str(port), "--parent-pid", str(os.getpid())]
        return cmd

    def ranks(self, node: NodeHandle) -> dict[str, Any]:
        """The node's ``/sim/ranks`` answer."""
        with urllib.request.urlopen(node.url + "/sim/ranks", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (and SIGCONT) every node's group, SIGKILL what is left; reap."""
        for proc in self._procs:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # stopped ranks, stragglers
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def run_group(spec: GroupSpec) -> int:
    """The ``sim --nodes`` command: start the group, say where each node is, run until a
    signal. Returns the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with MultiNodeGroup(spec) as group:
        for node in group.nodes:
            ranks = [r["rank"] for r in group.ranks(node)["ranks"]]
            line = {"node": node.name, "url": node.url, "pid": node.pid, "ranks": ranks}
            print(json.dumps(line), flush=True)
        stop.wait()
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engine_watchdog.sim.multinode_group")
    parser.add_argument("role", choices=("node",))
    for name in ("--node-rank", "--nodes", "--ranks-per-node", "--fault-rank"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--fault-after-steps", "--hub-port", "--port", "--parent-pid"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--fault", default="none")
    a = parser.parse_args(argv)
    spec = GroupSpec(a.nodes, a.ranks_per_node, a.fault, a.fault_rank, a.fault_after_steps)
    node_main(spec, a.node_rank, a.hub_port, a.port, a.parent_pid)


if __name__ == "__main__":
    main()
