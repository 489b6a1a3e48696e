"""Where the engines are: URLs given, a targets file, or a Kubernetes label selector.

The selector asks ``kubectl`` (bounded, no shell) for the pods' IPs; the watchdog itself holds no
Kubernetes client. Past one machine, the fleet view belongs to Prometheus and the shipped rules.
A targets file that is not UTF-8 text is bad input (64); a kubectl that is missing, fails, or
prints anything but a pod list (a login proxy's HTML page) is a tool that failed (69).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from engine_watchdog.cli.exits import EXIT_UNAVAILABLE, CliError
from engine_watchdog.cli.option_group import F, env_name, named_by_source
from engine_watchdog.core.checks import normalise_url
from engine_watchdog.core.settings import SettingsError

KUBECTL_TIMEOUT_S = 30.0


TARGETS_MAX_BYTES = 1 << 20


def read_targets_file(path: Path) -> list[str]:
    """One URL per line; blank lines and ``#`` comments are skipped."""
    try:
        with path.open("rb") as f:
            raw = f.read(TARGETS_MAX_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"--targets {path}: cannot read it ({exc.strerror})") from None
    if len(raw) > TARGETS_MAX_BYTES:
        raise SettingsError(f"--targets {path}: over 1 MiB: give one engine URL per line")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SettingsError(
            f"--targets {path}: line {line} is not UTF-8 text: save it as UTF-8, one engine "
            "URL per line"
        ) from None
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def _kubectl_failed(message: str) -> CliError:
    return CliError(message, EXIT_UNAVAILABLE)


def pods_by_selector(selector: str, namespace: str | None, port: int, kubectl: str) -> list[str]:
    """Base URLs of the running pods that match ``selector``."""
    exe = shutil.which(kubectl)
    if exe is None:
        raise _kubectl_failed(f"--selector needs kubectl on PATH ({kubectl!r} not found)")
    cmd = [exe, "get", "pods", "-l", selector, "-o", "json"]
    cmd += ["-n", namespace] if namespace else []
    asked = f"kubectl get pods -l {selector} -o json"
    try:
        done = subprocess.run(  # noqa: S603 (kubectl from PATH, arguments from our flags)
            cmd, capture_output=True, timeout=KUBECTL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise _kubectl_failed(f"{asked} took over {KUBECTL_TIMEOUT_S:.0f} s") from None
    out, err = (done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    if done.returncode != 0:
        first = (err.strip().splitlines() or ["no output"])[0][:300]
        raise _kubectl_failed(f"{asked} failed: {first}")
    hosts = [f"[{ip}]" if ":" in ip else ip for ip in running_pod_ips(out, asked)]  # IPv6
    return [f"http://{host}:{port}" for host in hosts]


def running_pod_ips(text: str, asked: str) -> list[str]:
    """The IPs of the Running pods in ``kubectl get pods -o json`` output."""
    fix = "check kubectl's context and credentials (run it yourself)"
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        began = " ".join(text.split())[:60]
        raise _kubectl_failed(f"{asked} printed no JSON (it began {began!r}): {fix}") from None
    pods = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(pods, list):
        raise _kubectl_failed(f"{asked} printed JSON that is not a pod list: {fix}")
    ips = []
    for pod in pods:
        status = pod.get("status") if isinstance(pod, dict) else None
        if isinstance(status, dict) and status.get("phase") == "Running":
            ip = status.get("podIP")
            if isinstance(ip, str) and ip:
                ips.append(ip)
    return ips


def resolve_targets(
    urls: Sequence[str],
    targets_file: Path | None = None,
    selector: str | None = None,
    namespace: str | None = None,
    port: int = 8000,
    kubectl: str = "kubectl",
) -> list[str]:
    """Every target, normalised, deduplicated, in the order given."""
    found = list(urls)
    if targets_file is not None:
        found += read_targets_file(targets_file)
    if selector:
        found += pods_by_selector(selector, namespace, port, kubectl)
    if not found:
        raise SettingsError("no target: give URL(s), --targets FILE or --selector LABELS")
    return list(dict.fromkeys(normalise_url(u) for u in found))


class TargetOptions:
    """Many engines: URLs, a targets file, or a Kubernetes label selector (an option group)."""

    def __call__(self, func: F) -> F:
        options: list[Callable[[F], F]] = [
            click.argument("urls", nargs=-1, envvar=env_name("url")),
            click.option(
                "--targets",
                "targets_file",
                type=click.Path(dir_okay=False, path_type=Path),
                envvar=env_name("targets"),
                show_envvar=True,
                help="File with one engine URL per line.",
            ),
            click.option(
                "--selector",
                envvar=env_name("selector"),
                show_envvar=True,
                help="Kubernetes label selector of engine pods (asks kubectl for their IPs).",
            ),
            click.option(
                "--namespace",
                envvar=env_name("namespace"),
                show_envvar=True,
                help="Namespace for --selector.",
            ),
            click.option(
                "--port",
                type=int,
                default=8000,
                show_default=True,
                envvar=env_name("port"),
                show_envvar=True,
                help="Engine port for --selector pods.",
            ),
        ]
        for option in reversed(options):
            func = option(func)
        return func

    def take(self, kw: dict[str, Any]) -> list[str]:
        with named_by_source("--targets", "targets_file", only_ours=True):
            return resolve_targets(
                kw.pop("urls"),
                kw.pop("targets_file"),
                kw.pop("selector"),
                kw.pop("namespace"),
                kw.pop("port"),
            )


TARGETS = TargetOptions()
