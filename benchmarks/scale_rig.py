"""The parts of benchmarks/scale.py's rig: the proxies it starts (fresh for each step), where
each role's processes run (``--pin``), the steps it takes, and what it writes of the setup.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import guard_rounds, proxy_peers, scale_report, upstream
from benchmarks.proxy_peers import Tree
from engine_watchdog.sim.launcher import free_port

PEERS = ("nginx", "haproxy")
ROLES = ("upstream", "clients", "proxy")
"""--pin UPSTREAM:CLIENTS:PROXY, each a taskset CPU list (empty: not pinned)."""
GUARD_ARGS = ("--no-gpu", "--action", "answer", "--json")
"""The guard's answer to a stall is what the freezes measure; no capture in a benchmark."""
ANSWER_BOUND_S = 20.0
WARM_S = 5.0
"""Streams move this long before a freeze, plus up to one probe round drawn at random."""


@dataclass
class Proxy:
    name: str
    url: str
    port: int
    tree: Tree
    proc: asyncio.subprocess.Process
    admin: str = ""
    """The guard's own API (its /metrics)."""
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    """The guard's verdict transitions (--json), with the time each was read."""
    reader: asyncio.Task[None] | None = None

    async def read_verdicts(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and "state" in doc:
                    self.verdicts.append(doc | {"read_t": time.time()})


@dataclass
class Rig:
    args: argparse.Namespace
    up: upstream.Upstream
    pool: ProcessPoolExecutor
    names: list[str]
    """The proxies measured (--proxies)."""
    report: scale_report.Report
    proxies: dict[str, Proxy] = field(default_factory=dict)
    """Those running now: fresh ones for each step (their RSS grows from idle, not from the
    last step's high-water mark)."""


def taskset(spec: str, role: str) -> list[str]:
    """``taskset -c LIST`` for a role's processes, where ``--pin`` gives it a list."""
    cpus = dict(zip(ROLES, spec.split(":"), strict=False)).get(role)
    return ["taskset", "-c", cpus] if cpus and shutil.which("taskset") else []


def pinned(spec: str, role: str) -> list[int] | None:
    """The CPUs of ``--pin`` for a role, as a list (None: not pinned)."""
    cpus = dict(zip(ROLES, spec.split(":"), strict=False)).get(role)
    if not cpus:
        return None
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


@contextlib.asynccontextmanager
async def proxy(rig: Rig, name: str) -> AsyncIterator[Proxy]:
    port, up = free_port(), rig.up
    env, admin = None, ""
    if name == "guard":
        admin = f"127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "benchmarks.guard_rounds", "guard", up.url]
        argv += ["--listen", admin, "--guard-listen", f"127.0.0.1:{port}", *GUARD_ARGS]
        env = {**os.environ, guard_rounds.ENV: str(rig.args.out / "guard-rounds.txt")}
    else:
        argv = proxy_peers.argv(name, up.port, port, workers=rig.args.peer_workers)
    with (rig.args.out / "proxies.log").open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *taskset(rig.args.pin, "proxy"), *argv, env=env, start_new_session=True, stderr=log,
            stdout=asyncio.subprocess.PIPE if name == "guard" else asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    p = Proxy(
        name, f"http://127.0.0.1:{port}", port, Tree(proc.pid), proc, admin and f"http://{admin}"
    )
    if name == "guard":
        p.reader = asyncio.create_task(p.read_verdicts())
    try:
        await upstream.wait_ready(port, 30, proc, name)
        await asyncio.sleep(0.5)  # nginx: its worker forked
        p.tree.pin()
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if p.reader is not None:
            p.reader.cancel()
        rig.report.verdicts += p.verdicts


@dataclass
class Step:
    """One item of --steps: ``NxR`` a load, ``NxR/S`` an arrival over S seconds, ``direct:NxR``
    the upstream alone, ``freeze:N:K`` K freezes under N streams through the guard."""

    kind: str
    streams: int
    rate: float = 25.0
    spread: float = 0.0
    count: int = 0

    @classmethod
    def parse(cls, text: str) -> Step:
        """Raises ValueError on anything else."""
        if text.startswith("freeze:"):
            n, _, k = text.removeprefix("freeze:").partition(":")
            return cls("freeze", int(n), count=int(k or 1))
        kind, _, load = text.rpartition(":")
        load, _, spread = load.partition("/")
        n, _, rate = load.partition("x")
        if kind not in ("", "direct") or int(n) < 1 or float(rate or 25) <= 0:
            raise ValueError(text)
        return cls(kind or "load", int(n), float(rate or 25), float(spread or 0))

    def seconds(self, rig: Rig) -> float:
        """About how long it takes (the run skips what would not end before --budget)."""
        if self.kind == "freeze":
            return 3.0 + self.count * (2 + self.streams / 1500 + WARM_S + 1 + 8 + 4)
        paths = 1 if self.kind == "direct" else 1 + len(rig.names)
        measured: float = rig.args.seconds
        one = 2.5 + self.spread + self.streams / 1500 + measured + self.streams / 4000
        return paths * one + (3.0 if self.kind == "load" else 0.0)


def setup(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """What the tables were measured on and with (the head of scale.md)."""
    versions = {}
    for name in names:
        if name in PEERS and (binary := proxy_peers.binary(name)):
            flag = "-v" if name == "nginx" else "-vv"
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = subprocess.run(  # noqa: S603 (the peer's own binary, found on PATH)
                    [binary, flag], capture_output=True, text=True, timeout=10, check=False
                )
                versions[name] = (done.stdout + done.stderr).strip().splitlines()[0]
    return {
        "command": " ".join(sys.argv),
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, {cpu_model()}",
        "load average before": f"{os.getloadavg()[0]:.2f}",
        "python": platform.python_version(),
        "pinning (upstream:clients:proxy)": args.pin or "none",
        "upstream processes": args.upstream_procs,
        "client processes": args.client_procs,
        "nginx workers / HAProxy threads": args.peer_workers,
        "stream length (tokens, each request drawn from half to 1.5 times it)": args.stream_tokens,
        "measured seconds per phase": args.seconds,
        **versions,
    }


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def guard_mode(out: Path) -> str:
    """The guard's own word on its data path (its start line in proxies.log)."""
    with contextlib.suppress(OSError):
        for line in (out / "proxies.log").read_text(errors="replace").splitlines():
            if "guard on http" in line and "event loop" in line:
                return line[line.index("(event loop") :].split(")")[0] + ")"
    return "not seen"
