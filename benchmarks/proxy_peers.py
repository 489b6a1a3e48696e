"""The proxies users would put where the guard goes: Debian's nginx-light and HAProxy, installed
if missing and configured here in a temporary directory (benchmarks/guard.py --peers).

nginx: one worker (``workers``: more), ``proxy_buffering off`` (each chunk passed as it comes),
HTTP/1.1 to the engine with a keepalive pool. HAProxy: one thread (the guard's event loop is one
too; ``workers``: more), HTTP mode, its
default keep-alive to the server. Both with timeouts far beyond a benchmark phase, so that no
timer of theirs shapes the figures (benchmarks/timers.py measures the timers themselves).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import namedtuple
from pathlib import Path

import psutil

NAMES = ("nginx", "haproxy")
PACKAGES = {"nginx": "nginx-light", "haproxy": "haproxy"}
BINARIES = {"nginx": "/usr/sbin/nginx", "haproxy": "/usr/sbin/haproxy"}

Times = namedtuple("Times", "user system")
Memory = namedtuple("Memory", "rss")


class Missing(RuntimeError):
    """A peer that is not installed and cannot be installed here (one line, the fix)."""


def binary(name: str) -> str | None:
    found = shutil.which(name) or BINARIES[name]
    return found if Path(found).exists() else None


def ensure_installed(names: tuple[str, ...] = NAMES, timeout: float = 300) -> None:
    """apt-get install what is missing, when root; else Missing naming the command."""
    missing = [PACKAGES[n] for n in names if binary(n) is None]
    if not missing:
        return
    command = ["apt-get", "install", "-y", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Missing(f"{', '.join(missing)} missing: run `sudo {' '.join(command)}`")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(command, env=env, capture_output=True, timeout=timeout, check=False)  # noqa: S603
    if done.returncode != 0 or any(binary(n) is None for n in names):
        raise Missing(f"`{' '.join(command)}` failed (exit {done.returncode})")


def nginx_conf(
    upstream_port: int, port: int, home: Path, read_timeout: str = "3600s", workers: int = 1
) -> str:
    temp = " ".join(f"{k}_temp_path {home / k};" for k in ("client_body", "proxy"))
    return f"""daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile 65536;
pid {home / "nginx.pid"};
error_log {home / "error.log"} warn;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  {temp}
  fastcgi_temp_path {home / "fastcgi"}; uwsgi_temp_path {home / "uwsgi"};
  scgi_temp_path {home / "scgi"};
  upstream engine {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout {read_timeout};
      proxy_send_timeout 3600s;
    }}
  }}
}}
"""


def haproxy_conf(upstream_port: int, port: int, workers: int = 1) -> str:
    return f"""global
  maxconn 8000
  nbthread {workers}
defaults
  mode http
  option http-no-delay
  timeout connect 10s
  timeout client 1h
  timeout server 1h
frontend front
  bind 127.0.0.1:{port}
  default_backend engine
backend engine
  server e1 127.0.0.1:{upstream_port}
"""


def argv(
    name: str, upstream_port: int, port: int, read_timeout: str = "3600s", workers: int = 1
) -> list[str]:
    """The command that runs the peer in the foreground (a fresh temporary directory each);
    ``workers``: nginx's worker processes, HAProxy's threads."""
    home = Path(tempfile.mkdtemp(prefix=f"ew-{name}-"))
    conf = home / f"{name}.conf"
    if name == "nginx":
        conf.write_text(nginx_conf(upstream_port, port, home, read_timeout, workers))
        return [binary("nginx") or "nginx", "-p", str(home), "-c", str(conf)]
    conf.write_text(haproxy_conf(upstream_port, port, workers))
    return [binary("haproxy") or "haproxy", "-db", "-f", str(conf)]


class Tree:
    """A proxy's whole process tree (nginx: master and worker) as one process: CPU and RSS
    summed, in the shape benchmarks/guard.py reads from a psutil.Process. ``pin()``: the
    members from then on are the ones found then (a tree that forks once, at start: a member
    missed by one listing would make a difference of two readings negative)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.pinned: list[psutil.Process] | None = None

    def pin(self) -> Tree:
        self.pinned = self.members()
        return self

    def members(self) -> list[psutil.Process]:
        if self.pinned is not None:
            return self.pinned
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_times(self) -> Times:
        user = system = 0.0
        for proc in self.members():
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            user, system = user + times.user, system + times.system
        return Times(user, system)

    def memory_info(self) -> Memory:
        rss = 0
        for proc in self.members():
            try:
                rss += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return Memory(rss)
