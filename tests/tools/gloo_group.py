"""A real cross-process collective on the CPU, laid out as an engine group's pods are: N torch
gloo ranks (tests/tools/gloo_rank.py), each in a pod of its own (tests/tools/pod.py).

- Each pod has its own network namespace (``ip netns add``), its own PID namespace (a reaper
  as PID 1, what the pause container is) and runs its rank as the engine's UID, with no
  capability and ``no_new_privs``.
- The pods are wired as a cluster network wires them: one veth per pod, its ``eth0`` inside
  the pod at 10.231.0.<rank+1>/24, its other end on a bridge that lives in one more namespace
  (the "switch"). Nothing is added to the host's own namespace: the addresses exist only in
  the namespaces made here, so two groups never collide and the host's routes are untouched.
- Rank 0's address is the rendezvous (``tcp://10.231.0.1:29500``); gloo talks over ``eth0``.

Use::

    with GlooGroup(2, workdir) as group:
        group.wait_stepping()                 # every rank completed collectives
        group.ranks[1].host_pid               # for py-spy / psutil from the root namespace
        group.stop(1)                         # SIGSTOP, from outside
        group.skip(1) / group.unskip(1)       # a rank stays out of the collective
        group.exit(1)                         # a rank leaves (status 3)
        group.heartbeat(0)                    # {"step", "beat", "t", "segments", ...}
        group.run(0, "sidecar", argv, uid, caps=("sys_ptrace",))  # another container in pod 0
        group.ranks[1].pod_pid                # the rank's PID in its own pod (--pid there)
        group.kill()                          # SIGKILL every pod's PID 1: the group stopped

``GlooGroup(..., title="VLLM::Worker_TP{rank}", metrics_port=8000)`` titles the ranks as vLLM
titles its workers and has rank 0 serve a vLLM-shaped /metrics, as the engine a leader's
watchdog watches (tests/integration/test_multinode_sidecars.py).

Leaving the block (also on an error) kills every process the group started (each in its own
process group) and deletes every namespace; the veths and the bridge go with them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from tests.tools.pod import Container, Pod, tools_missing

RANK_SCRIPT = Path(__file__).with_name("gloo_rank.py")
SUBNET = "10.231.0"
PORT = 29500
ENGINE_UID = 1000
IP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
"""torch's import alone takes 5-10 s per rank on a loaded 2-core machine."""
_GROUPS = itertools.count()


def netns_missing() -> str | None:
    """Why pods with their own network cannot be made here, or None."""
    reason = tools_missing()
    if reason or shutil.which("ip") is None:
        return reason or "ip (iproute2) is not installed"
    name = f"ew-probe-{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    _ip("netns", "del", name, check=False)
    return None if made.returncode == 0 else f"ip netns add refused: {made.stderr.strip()}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(  # fixed argv, no shell
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Rank:
    """One rank, in its pod."""

    rank: int
    address: str
    """Its pod's address (on eth0, in its network namespace only)."""
    netns: str
    pod: Pod
    folder: Path
    """Its heartbeat and the fault flags."""
    shm_root: Path
    """Where it makes its segments: the group's shm root, or its pod's own folder in it."""
    container: Container | None = None

    @property
    def host_pid(self) -> int:
        """The rank's Python, as the root namespace numbers it (py-spy, psutil)."""
        assert self.container is not None
        procs = self.container.processes()
        assert procs, f"rank {self.rank} is not running:\n{self.container.log_tail()}"
        return procs[-1].pid

    @property
    def pod_pid(self) -> int:
        """The rank's PID as its own pod numbers it (``NSpid``'s last field): what a sidecar
        in the pod passes as ``--pid``."""
        status = Path(f"/proc/{self.host_pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("NSpid:"))
        return int(line.split()[-1])

    @property
    def init_pid(self) -> int | None:
        """Its pod's PID 1 (the reaper), as the root namespace numbers it."""
        return self.pod.pid1()


class GlooGroup:
    """``world`` gloo ranks in pods of their own; a context manager (see the module doc)."""

    def __init__(
        self,
        world: int,
        workdir: Path,
        python: Path,
        shm_root: Path | None = None,
        uid: int = ENGINE_UID,
        timeout_s: float = 300.0,
        reachable: Sequence[Path] = (),
        title: str | None = None,
        metrics_port: int | None = None,
        shm_per_pod: bool = False,
    ) -> None:
        """``reachable``: more programs the pods' UIDs must be able to run (a sidecar's
        Python), whatever the folders they sit in on the host (tests/tools/pod.py).
        ``title``: each rank's process title, ``{rank}`` filled in (``VLLM::Worker_TP{rank}``);
        ``metrics_port``: rank 0 serves a vLLM-shaped /metrics there (tests/tools/gloo_rank.py);
        ``shm_per_pod``: each rank makes its segments in ``shm_root/pod<rank>``, its own
        folder, as each node of a group has its own /dev/shm (a node's clean sees its own)."""
        self.world, self.python, self.uid, self.timeout_s = world, python, uid, timeout_s
        self.title, self.metrics_port, self.shm_per_pod = title, metrics_port, shm_per_pod
        self.reachable = (python, RANK_SCRIPT, *reachable)
        self.tag = f"ewg{os.getpid()}-{next(_GROUPS)}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir=workdir))
        self.workdir.chmod(0o755)
        self.shm_root = shm_root or self._folder("shm")
        self.switch = f"{self.tag}-sw"
        self.namespaces: list[str] = []
        self.ranks: list[Rank] = []

    def _folder(self, name: str, parent: Path | None = None) -> Path:
        path = (parent or self.workdir) / name
        path.mkdir(mode=0o700)
        os.chown(path, self.uid, self.uid)
        return path

    # ---- lifetime ------------------------------------------------------------------------
    def __enter__(self) -> GlooGroup:
        try:
            self._wire()
            for rank in self.ranks:
                rank.pod.start(reachable=self.reachable)
            for rank in self.ranks:  # all at once: each import of torch is seconds
                rank.container = rank.pod.run(
                    f"rank{rank.rank}", [str(self.python), str(RANK_SCRIPT)], self.uid,
                    env=self._env(rank),
                )  # fmt: skip
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _wire(self) -> None:
        self._netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.world):
            ns = self._netns(f"{self.tag}-r{i}")
            peer = f"p{i}"
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", peer,
                "netns", self.switch)  # fmt: skip
            _ip("-n", self.switch, "link", "set", peer, "master", "br0", "up")
            address = f"{SUBNET}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            pod_dir = self.workdir / f"pod{i}"
            pod_dir.mkdir(mode=0o755)
            shm = self._folder(f"pod{i}", self.shm_root) if self.shm_per_pod else self.shm_root
            pod = Pod(pod_dir, netns=ns)
            self.ranks.append(Rank(i, address, ns, pod, self._folder(f"r{i}"), shm))

    def _netns(self, name: str) -> str:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        return name

    def _env(self, rank: Rank) -> dict[str, str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(rank.folder),
            "EW_RANK": str(rank.rank),
            "EW_WORLD": str(self.world),
            "EW_MASTER": f"{SUBNET}.1:{PORT}",
            "EW_DIR": str(rank.folder),
            "EW_SHM_ROOT": str(rank.shm_root),
            "EW_TIMEOUT_S": str(self.timeout_s),
            "GLOO_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank.rank),  # as torchrun and Ray's vLLM workers set it
            "WORLD_SIZE": str(self.world),
        }
        if self.title:
            # setproctitle zeroes /proc/PID/environ, RANK with it, as it does for vLLM's
            # titled ranks: the sidecar reads the rank from the title (peers/node.py).
            env["EW_TITLE"] = self.title.format(rank=rank.rank)
        if self.metrics_port and rank.rank == 0:
            env["EW_METRICS_PORT"] = str(self.metrics_port)
        return env

    def kill(self, timeout_s: float = 30.0) -> None:
        """Stop the group as a restart does: SIGKILL of every pod's PID 1 (the kernel ends
        everything in its PID namespace) and of every container; return once each process
        seen is gone or a zombie (a SIGKILLed torch process takes a moment to exit). The
        network namespaces stay until :meth:`close`."""
        seen = self.processes()
        for rank in self.ranks:
            rank.pod.close()
        deadline = time.monotonic() + timeout_s
        while [p for p in seen if _running(p)] and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        """Kill every process, delete every namespace (the bridge and veths with them)."""
        self.kill()
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- faults --------------------------------------------------------------------------
    def stop(self, i: int) -> None:
        os.kill(self.ranks[i].host_pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        os.kill(self.ranks[i].host_pid, signal.SIGCONT)

    def skip(self, i: int) -> None:
        (self.ranks[i].folder / "skip").touch()

    def unskip(self, i: int) -> None:
        (self.ranks[i].folder / "skip").unlink(missing_ok=True)

    def exit(self, i: int) -> None:
        (self.ranks[i].folder / "exit").touch()

    # ---- what the ranks say --------------------------------------------------------------
    def heartbeat(self, i: int) -> dict[str, Any]:
        """The rank's last heartbeat; {} before its first."""
        try:
            doc: dict[str, Any] = json.loads((self.ranks[i].folder / "heartbeat.json").read_text())
        except (OSError, ValueError):
            return {}
        return doc

    def steps(self) -> list[int]:
        return [int(self.heartbeat(i).get("step", -1)) for i in range(self.world)]

    def wait_stepping(self, timeout_s: float = START_TIMEOUT_S) -> list[int]:
        """Wait until every rank has completed collectives (blocking, bounded)."""
        deadline = time.monotonic() + timeout_s
        while min(self.steps()) < 2:
            for rank in self.ranks:
                assert rank.container is not None
                if rank.container.proc.poll() is not None:
                    raise AssertionError(f"rank {rank.rank} ended:\n{rank.container.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks not stepping in {timeout_s:.0f} s: {self.logs()}")
            time.sleep(0.2)
        return self.steps()

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r.rank} ---\n{r.container.log_tail(15)}" for r in self.ranks if r.container
        )

    def run(
        self,
        i: int,
        name: str,
        argv: Sequence[str],
        uid: int,
        env: Mapping[str, str] | None = None,
        caps: Sequence[str] = (),
    ) -> Container:
        """Start another container in rank ``i``'s pod: its network and PID namespace, exactly
        ``caps`` (a sidecar's SYS_PTRACE)."""
        return self.ranks[i].pod.run(name, argv, uid, caps=caps, env=env)

    def processes(self) -> list[psutil.Process]:
        """Every live process of the group's pods (PID 1s included), as the host sees them."""
        out = []
        for rank in self.ranks:
            init = rank.pod.init
            if init is None:
                continue
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(init.pid))
                out += psutil.Process(init.pid).children(recursive=True)
            if rank.container is not None:
                out += rank.container.processes()
        return out


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def namespaces_left(tag: str) -> list[str]:
    """The named network namespaces of a group still present."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(tag + "-")]
