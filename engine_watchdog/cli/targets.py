"""Where the engines are: URLs given, a targets file, or a Kubernetes label selector.

The selector asks ``kubectl`` (bounded, no shell) for the pods' IPs; the watchdog itself holds no
Kubernetes client. Past one machine, the fleet view belongs to Prometheus and the shipped rules.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from engine_watchdog.cli.option_group import F, env_name
from engine_watchdog.core.settings import SettingsError, normalise_url

KUBECTL_TIMEOUT_S = 30.0


def read_targets_file(path: Path) -> list[str]:
    """One URL per line; blank lines and ``#`` comments are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SettingsError(f"--targets {path}: cannot read it ({exc.strerror})") from None
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def pods_by_selector(selector: str, namespace: str | None, port: int, kubectl: str) -> list[str]:
    """Base URLs of the running pods that match ``selector``."""
    exe = shutil.which(kubectl)
    if exe is None:
        raise SettingsError(f"--selector needs kubectl on PATH ({kubectl!r} not found)")
    cmd = [exe, "get", "pods", "-l", selector, "-o", "json"]
    cmd += ["-n", namespace] if namespace else []
    try:
        done = subprocess.run(  # noqa: S603 (kubectl from PATH, arguments from our flags)
            cmd, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise SettingsError(f"kubectl get pods took over {KUBECTL_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise SettingsError(f"kubectl get pods -l {selector} failed: {first}")
    pods = json.loads(done.stdout).get("items", [])
    ips = [
        p["status"]["podIP"]
        for p in pods
        if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP")
    ]
    return [f"http://{ip}:{port}" for ip in ips]


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
                help="File with one engine URL per line.",
            ),
            click.option(
                "--selector",
                envvar=env_name("selector"),
                help="Kubernetes label selector of engine pods (asks kubectl for their IPs).",
            ),
            click.option(
                "--namespace", envvar=env_name("namespace"), help="Namespace for --selector."
            ),
            click.option(
                "--port",
                type=int,
                default=8000,
                show_default=True,
                envvar=env_name("port"),
                help="Engine port for --selector pods.",
            ),
        ]
        for option in reversed(options):
            func = option(func)
        return func

    def take(self, kw: dict[str, Any]) -> list[str]:
        return resolve_targets(
            kw.pop("urls"),
            kw.pop("targets_file"),
            kw.pop("selector"),
            kw.pop("namespace"),
            kw.pop("port"),
        )


TARGETS = TargetOptions()
