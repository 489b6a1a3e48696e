"""Build deploy/Dockerfile with Debian's podman and run containers from it, bounded and cleaned up.

No container registry is reachable here, so the Dockerfile's base (python:3.11-slim-bookworm)
is replaced by a stand-in: a debootstrap'd Debian bookworm minbase with python3 (3.11, what the
locks are resolved for), imported with ``podman import``. Its tarball is cached in
``.cache/image/`` (a second run imports it in seconds, or finds the image already there).
This host's cgroups break crun and its hard ulimits are below podman's defaults: every podman
call goes through runc with cgroupfs, every container gets explicit ulimits.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from tests.deploy.tools import DEPLOY, REPO

CACHE = REPO / ".cache" / "image"
BUILD_TIMEOUT_S = 900
SUITE = "bookworm"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
BASE_KEY = hashlib.sha256(f"{SUITE} minbase {BASE_PACKAGES}".encode()).hexdigest()[:12]
BASE_TAG = f"localhost/engine-watchdog-base:{SUITE}-{BASE_KEY}"
IMAGE_TAG = "localhost/engine-watchdog:test"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
GLOBAL = ("--runtime", "runc", "--cgroup-manager=cgroupfs")
ULIMITS = ("--ulimit", "nofile=1024:20000", "--ulimit", "nproc=4096:4096")
FIX = "run `bash deploy/ensure-tools.sh` (apt-get install podman runc debootstrap)"


class Podman:
    def __init__(self, binary: str) -> None:
        self.binary = binary

    def argv(self, *args: str) -> list[str]:
        return [self.binary, *GLOBAL, *args]

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        """``podman ARGS`` bounded; with ``check`` a failure fails the test with its output."""
        proc = bounded(self.argv(*args), timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc.stdout

    def has_image(self, tag: str) -> bool:
        return bounded(self.argv("image", "exists", tag), 30).returncode == 0

    def remove(self, name: str) -> None:
        bounded(self.argv("rm", "--force", "--time", "0", name), 60)

    def oneshot(self, name: str, *args: str, timeout: float = 120, check: bool = True) -> str:
        """``podman run --rm --name NAME ARGS``, and the container is gone afterwards even when
        the client was killed on a timeout."""
        try:
            return self.run(
                "run", "--rm", "--name", name, *ULIMITS, *args, timeout=timeout, check=check
            )
        finally:
            self.remove(name)

    def remove_stale(self, prefix: str) -> None:
        """Containers ``PREFIX<pid>-...`` left by a test process that no longer exists (killed
        mid-test): removed. Those of live processes (a concurrent run) are left alone."""
        names = self.run("ps", "--all", "--format", "{{.Names}}", timeout=60).split()
        for name in names:
            pid = name.removeprefix(prefix).partition("-")[0]
            if name.startswith(prefix) and pid.isdigit() and not psutil.pid_exists(int(pid)):
                self.remove(name)

    @contextlib.contextmanager
    def container(self, name: str, *args: str) -> Iterator[str]:
        """``podman run --detach --name NAME ARGS``; removed on exit, whatever happened."""
        try:
            self.run("run", "--detach", "--name", name, *ULIMITS, *args, timeout=60)
            yield name
        finally:
            self.remove(name)


def bounded(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group; on a timeout the group is killed and the test fails."""
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.communicate(timeout=30)
            pytest.fail(f"{' '.join(argv)} did not finish within {timeout:.0f} s")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def podman_or_skip() -> Podman:
    """podman, once it is shown to run here. Missing tools fail (ensure-tools installs them);
    a host that cannot run containers (no root, cgroups or namespaces refused) skips, saying
    what podman answered."""
    binary = shutil.which("podman")
    if binary is None or shutil.which("runc") is None or shutil.which("debootstrap") is None:
        pytest.fail(f"podman, runc or debootstrap not found: {FIX}", pytrace=False)
    if os.geteuid() != 0:
        pytest.skip("podman cannot run here: debootstrap and rootful podman need root")
    podman = Podman(binary)
    probe = bounded(podman.argv("info", "--format", "{{.Host.OCIRuntime.Name}}"), 60)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"podman cannot run here: `podman info` failed: {last}")
    return podman


def ensure_base(podman: Podman) -> tuple[str, str]:
    """The stand-in base image; returns (tag, how it was had: present|imported|debootstrapped)."""
    if podman.has_image(BASE_TAG):
        return BASE_TAG, "present"
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{SUITE}-{BASE_KEY}.tar"
    how = "imported"
    if not tarball.exists():
        _debootstrap(tarball)
        how = "debootstrapped"
    podman.run("import", str(tarball), BASE_TAG, timeout=300)
    return BASE_TAG, how


def _debootstrap(tarball: Path) -> None:
    rootfs = CACHE / f"rootfs-{BASE_KEY}.partial"
    shutil.rmtree(rootfs, ignore_errors=True)
    argv = ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(rootfs)]
    proc = bounded(argv, BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"debootstrap failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    partial = tarball.with_suffix(".partial")
    tar = ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."]
    if bounded(tar, 300).returncode != 0:
        pytest.fail(f"could not tar {rootfs}")
    partial.rename(tarball)  # only a whole tarball is ever cached
    shutil.rmtree(rootfs, ignore_errors=True)


def build_image(podman: Podman, base: str) -> float:
    """``podman build`` of deploy/Dockerfile on the stand-in base; the host's CA bundle goes in
    as the ``ca`` build secret (this host reaches PyPI through a TLS-intercepting proxy)."""
    started = time.monotonic()
    args = [
        "build", "--isolation=chroot", "--network=host", "--build-arg", f"PYTHON_IMAGE={base}",
        "--file", str(DEPLOY / "Dockerfile"), "--tag", IMAGE_TAG,
    ]  # fmt: skip
    if HOST_CA.exists():
        args += ["--secret", f"id=ca,src={HOST_CA}"]
    proc = bounded(podman.argv(*args, str(REPO)), BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"podman build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return time.monotonic() - started


def ptrace_scope() -> str:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "absent (no Yama: classic rules, same UID or CAP_SYS_PTRACE)"
