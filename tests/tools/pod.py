"""A pod made with the kernel's own mechanisms, for the tests that hold the sidecar to the
manifests' promise (shared PID namespace, the engine's UID, SYS_PTRACE or no capability).

- The pod's PID namespace: ``unshare --pid --fork --mount-proc --kill-child`` with a reaper as
  its PID 1 (what the pause container is to a pod with ``shareProcessNamespace: true``).
- A container: its command entered into that namespace with ``nsenter --target PID1 --pid
  --mount`` (the namespace's own /proc), under ``setpriv`` with the container's UID and GID, no
  supplementary groups, ``no_new_privs``, and exactly the capabilities given: inheritable,
  ambient and bounding sets cut to them (so a non-root process keeps CAP_SYS_PTRACE after exec,
  and can never gain another one).
- The network namespace stays the host's (a pod's containers share one; loopback reaches it),
  unless the pod is given one (``netns``: made with ``ip netns add``, tests/tools/gloo_group.py):
  then PID 1 starts in it and every container enters it too.

Every process runs in its own process group; :meth:`Pod.close` ends the namespace (the kernel
kills everything in it when its PID 1 dies), also when a test failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

REAPER = (
    "import os, signal, subprocess, sys, time\n"
    "for keep, hidden in zip(sys.argv[1::2], sys.argv[2::2]):\n"
    "    parent = os.path.dirname(hidden)\n"
    "    for argv in (['mount', '--rbind', hidden, keep],\n"
    "                 ['mount', '-t', 'tmpfs', '-o', 'mode=0755', 'tmpfs', parent],\n"
    "                 ['mkdir', '-p', hidden], ['mount', '--rbind', keep, hidden]):\n"
    "        subprocess.run(argv, check=True, timeout=10)\n"
    "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)
"""PID 1 of the pod: it first makes each given folder reachable in the pod's own mount
namespace (a folder inside a parent other users may not enter, such as a Python under
root's ~/.pyenv, is bound onto a world-readable tmpfs laid over that parent: what a container
image with its Python in /usr gives), then reaps orphans until it is killed."""
CAP_SYS_PTRACE_BIT = 19
START_TIMEOUT_S = 10.0


def tools_missing() -> str | None:
    """Why pods cannot be made here, or None."""
    for tool in ("unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux)"
    if os.geteuid() != 0:
        return "making a PID namespace and switching UIDs needs root"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if probe.returncode != 0:
        return f"the host refuses new PID namespaces: {probe.stderr.strip()}"
    return None


def ptrace_scope() -> str:
    """kernel.yama.ptrace_scope as the tests see it ("absent": no Yama, classic ptrace rules:
    a process may trace any other of its own UID)."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "absent"


@dataclass
class Container:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    _out: IO[bytes]

    def processes(self) -> list[psutil.Process]:
        """The container's processes (nsenter's child and everything below it)."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._out.close()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Pod:
    workdir: Path
    netns: str | None = None
    """A named network namespace (``ip netns add``) for the whole pod; None: the host's."""
    init: subprocess.Popen[bytes] | None = None
    containers: list[Container] = field(default_factory=list)

    def start(self, reachable: Sequence[Path] = ()) -> None:
        """Start the pod; ``reachable``: files (interpreters) its other UIDs must be able to
        run, whatever the permissions of the folders they sit in on the host."""
        mounts: list[str] = []
        for hidden in {h for path in reachable if (h := unreachable_folder(path))}:
            keep = self.workdir / f".keep-{len(mounts)}"
            keep.mkdir()
            mounts += [str(keep), str(hidden)]
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self.init = subprocess.Popen(  # fixed argv, no shell
            [*argv, "/usr/bin/python3", "-c", REAPER, *mounts],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.init.stdout is not None
        if self.init.stdout.readline().strip() != b"ready":  # bounded: the mounts time out
            raise RuntimeError("the pod's PID 1 did not start")

    def pid1(self) -> int | None:
        """The reaper's host PID: unshare's child."""
        assert self.init is not None
        try:
            kids = psutil.Process(self.init.pid).children()
        except psutil.NoSuchProcess:
            return None
        return kids[0].pid if kids else None

    def run(
        self,
        name: str,
        argv: Sequence[str],
        uid: int,
        caps: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Container:
        """Start ``argv`` as a container of the pod: UID/GID ``uid``, exactly ``caps``."""
        pid1 = self.pid1()
        assert pid1 is not None, "the pod is not running"
        keep = ",".join(["-all", *(f"+{c}" for c in caps)])
        net = ["--net"] if self.netns is not None else []
        wrapped = [
            "nsenter", f"--target={pid1}", "--pid", "--mount", *net, "--",
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            f"--inh-caps={keep}", f"--ambient-caps={keep}", f"--bounding-set={keep}",
            "--no-new-privs", "--", *argv,
        ]  # fmt: skip
        log = self.workdir / f"{name}.log"
        out = log.open("wb")
        proc = subprocess.Popen(  # fixed argv, no shell
            wrapped,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        container = Container(name, proc, log, out)
        self.containers.append(container)
        return container

    def close(self) -> None:
        for container in self.containers:
            container.stop()
        if self.init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.init.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.init.wait(10)


def unreachable_folder(path: Path) -> Path | None:
    """The folder to expose so that other UIDs can run ``path``: the child of its first
    ancestor that others may not enter (e.g. root's ~/.pyenv for a pyenv Python); None if none."""
    real = path.resolve()
    for parent in real.parents:
        if parent.parent != parent and not parent.parent.stat().st_mode & 0o001:
            return parent
    return None


def capabilities(pid: int) -> tuple[int, bool]:
    """(CapEff as a bit mask, NoNewPrivs) of a process, from /proc/PID/status."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["CapEff"].strip(), 16), fields["NoNewPrivs"].strip() == "1"
