"""One rank of the simulator's multi-node group: ``python -m engine_watchdog.sim.distributed``.

Titled like a vLLM tensor-parallel worker (``VLLM::Worker_TP{rank}``), each rank loops on a
model step and a real collective with every other rank: ``all_reduce`` over loopback TCP, rank
0 the hub (every rank sends its value, the hub answers the sum). A rank that does not take part
leaves the others blocked in ``all_reduce``, as NCCL and gloo leave them; the file is named
``distributed.py`` so its collective frames read like torch.distributed's
(``all_reduce (engine_watchdog/sim/distributed.py:N)``). A peer that is gone never releases
them either: like NCCL, the collective waits on (no error, no timeout).

The faults, at ``--fault-after-steps`` on ``--fault-rank``:

- ``rank-stop``: the rank SIGSTOPs itself before the next collective (state T);
- ``rank-skip``: it leaves the loop and works outside any collective, for good;
- ``rank-dead``: it exits;
- ``gpu-spin``: it enters the collective but never sends (a kernel spinning: its simulated GPU
  reads 100 %, the others, left waiting, 0 %); every host stack sits in ``all_reduce``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

from engine_watchdog.sim.engine import _die_with_parent

RANK_FAULTS = ("none", "rank-stop", "rank-skip", "rank-dead", "gpu-spin")
SHM_DIR_VAR = "ENGINE_WATCHDOG_SIM_SHM_DIR"
"""Where each rank makes a segment named as NCCL's (``nccl-sim-r<rank>-p<pid>``), held open
while it lives and left behind when it is killed, as NCCL's are (NVIDIA/nccl#1518)."""
CONNECT_TIMEOUT_S = 20.0
STEP_S = 0.02
"""A model step's compute (CPU), between two collectives."""
_VALUE = struct.Struct("!d")


def worker_title(rank: int) -> str:
    """vLLM's multiproc worker title (vllm/v1/executor/multiproc_executor.py)."""
    prefix = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")
    return f"{prefix}::Worker_TP{rank}"


class Group:
    """The collective among ranks: rank 0 accepts a connection from every other rank."""

    def __init__(self, rank: int, world: int, hub_port: int) -> None:
        self.rank = rank
        self.peers: list[socket.socket] = []
        if rank == 0:
            self._accept(world - 1, hub_port)
        else:
            self.peers.append(_connect(hub_port))

    def _accept(self, count: int, port: int) -> None:
        with socket.create_server(("127.0.0.1", port), backlog=count) as server:
            server.settimeout(CONNECT_TIMEOUT_S)
            self.peers = [server.accept()[0] for _ in range(count)]

    def all_reduce(self, value: float, send: bool = True) -> float:
        """The sum over every rank; blocks until every rank has sent (for good, if one never
        does). ``send`` False: a rank inside the collective that never contributes."""
        if not send:
            _wait_for_peer_forever()
        if self.rank != 0:
            self.peers[0].sendall(_VALUE.pack(value))
            return _recv_value(self.peers[0])
        total = value
        for peer in self.peers:
            total += _recv_value(peer)
        for peer in self.peers:
            peer.sendall(_VALUE.pack(total))
        return total


def _connect(port: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _recv_value(peer: socket.socket) -> float:
    peer.settimeout(None)
    buf = b""
    while len(buf) < _VALUE.size:
        chunk = peer.recv(_VALUE.size - len(buf))
        if not chunk:  # the peer is gone: NCCL would wait on, so do we
            _wait_for_peer_forever()
        buf += chunk
    return float(_VALUE.unpack(buf)[0])


def _wait_for_peer_forever() -> None:
    threading.Event().wait()


def forward(step: int) -> float:
    """A model step: CPU work between two collectives (the stack moves)."""
    end = time.monotonic() + STEP_S
    while time.monotonic() < end:
        sum(range(500))
    return float(step % 7)


def work_outside_collective() -> None:
    """rank-skip: this rank went its own way and never joins the collective again."""
    while True:
        time.sleep(0.5)


class StepFile:
    """``STEPS UTIL`` for the node process: how far this rank got, and its simulated GPU."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, step: int, gpu_util: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{step} {gpu_util:.0f}\n")
        tmp.replace(self.path)


def make_segment(rank: int) -> int | None:
    """The rank's stand-in for an NCCL shared-memory segment, under $ENGINE_WATCHDOG_SIM_SHM_DIR
    (none without it); the descriptor stays open, so the file is "in use" while we live."""
    folder = os.environ.get(SHM_DIR_VAR)
    if not folder:
        return None
    path = Path(folder) / f"nccl-sim-r{rank}-p{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"\0" * 4096)
    return fd


def run_rank(
    rank: int, group: Group, fault: str, fault_rank: int, after: int, steps: StepFile
) -> None:
    for step in range(1 << 62):
        value = forward(step)
        faulty = rank == fault_rank and step >= after
        if faulty and fault == "rank-stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif faulty and fault == "rank-skip":
            work_outside_collective()
        elif faulty and fault == "rank-dead":
            os._exit(3)
        spin = faulty and fault == "gpu-spin"
        steps.write(step, 100.0 if spin else 50.0)
        group.all_reduce(value, send=not spin)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engine_watchdog.sim.distributed")
    for name in ("--rank", "--world", "--hub-port", "--parent-pid", "--fault-rank"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--fault", choices=RANK_FAULTS, default="none")
    parser.add_argument("--fault-after-steps", type=int, default=20)
    parser.add_argument("--step-file", type=Path, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node process decides when we stop
    import setproctitle

    setproctitle.setproctitle(worker_title(args.rank))
    segment = make_segment(args.rank)  # noqa: F841 (held open for the rank's life)
    group = Group(args.rank, args.world, args.hub_port)
    steps = StepFile(args.step_file)
    run_rank(args.rank, group, args.fault, args.fault_rank, args.fault_after_steps, steps)


if __name__ == "__main__":
    main()
