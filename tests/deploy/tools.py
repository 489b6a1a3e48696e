"""Helpers for the deploy tests: the external tools, bounded subprocesses, metric-name checks.

A missing tool FAILS the test with the command that installs it (never a silent skip):
``bash deploy/ensure-tools.sh`` (``make test`` runs it) brings promtool, prometheus,
alertmanager, podman, runc and debootstrap from Debian's packages.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
KUBERNETES_DIR = DEPLOY / "kubernetes"
OVERLAYS = ("default", "baseline", "liveness", "events", "guard")
KUBERNETES_VERSION = "1.32.0"
"""Schemas the rendered objects are validated against (kubernetes-validate bundles them)."""

FIX = (
    "run `bash deploy/ensure-tools.sh` (apt-get install prometheus prometheus-alertmanager"
    " podman runc debootstrap); `make test` does it"
)


def tool(*names: str) -> str:
    """The first of ``names`` found on PATH, or fail the test naming the fix."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    hint = "install kubectl" if names[0] == "kubectl" else FIX
    pytest.fail(f"{' or '.join(names)} not found: {hint}", pytrace=False)


def run(argv: Sequence[str], timeout: float = 60, cwd: Path | None = None) -> str:
    """Run argv (no shell), bounded; fail the test with its output if it exits non-zero."""
    try:
        proc = subprocess.run(
            list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv[0]} did not finish within {timeout} s: {' '.join(argv)}")
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, within_s: float) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {within_s} s")


@contextmanager
def process(argv: Sequence[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start argv with output to ``log``; always killed (and reaped) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            proc.kill()
            proc.wait(timeout=10)


# ---- metric names ------------------------------------------------------------------------
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and labels left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        names.add(name)
    return names


def watchdog_series() -> set[str]:
    """Every series name the watchdog's /metrics can export: its registry, and the guard's
    collector (registered there when --guard-listen is on)."""
    from engine_watchdog.guard.stats import GuardCollector, GuardStats
    from engine_watchdog.report.metrics import WatchdogMetrics

    guard = GuardCollector("t", GuardStats(), in_flight=lambda: 0, refusing=lambda: False)
    names: set[str] = set()
    for family in [*WatchdogMetrics().registry.collect(), *guard.collect()]:
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def vllm_series() -> set[str]:
    """Every vLLM series name the engine profile knows, plus the pre-0.33 KV cache gauge."""
    from engine_watchdog.engines.vllm import VLLM

    names: set[str] = set()

    def collect(value: object) -> None:
        if isinstance(value, str) and value.startswith("vllm:") and len(value) > 5:
            names.add(value)
        elif isinstance(value, (tuple, list)):
            for item in value:
                collect(item)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)

    for f in fields(VLLM):
        collect(getattr(VLLM, f.name))
    return names


def known_series() -> set[str]:
    return watchdog_series() | vllm_series() | {"up"}
