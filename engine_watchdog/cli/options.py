"""The option groups of the commands, one per settings section, and the WatchSettings they
build together (cli/option_group.py has the machinery). The groups live by what they are about:
options_judging.py (engine, probes, detector), options_acting.py (policy, recovery, capture,
guard), options_output.py (reporters, the process's sockets, the peer endpoint, --json,
--record).

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine_watchdog.cli.option_group import all_consumed, named_by_source
from engine_watchdog.cli.options_acting import (
    CAPTURE,
    GUARD,
    INCIDENT_DIR_OPT,
    POLICY,
    PY_SPY_OPT,
    RECOVERY,
)
from engine_watchdog.cli.options_judging import DETECTOR, ENGINE, PROBE
from engine_watchdog.cli.options_output import JSON, PEERS, PROCESS, RECORD, REPORT
from engine_watchdog.core.checks import for_target, validate, validate_process
from engine_watchdog.core.settings import ProbeSettings, ProcessSettings, WatchSettings
from engine_watchdog.net.access import load_api_key

__all__ = [
    "CAPTURE",
    "DETECTOR",
    "ENGINE",
    "GUARD",
    "INCIDENT_DIR_OPT",
    "JSON",
    "PEERS",
    "POLICY",
    "PROBE",
    "PROCESS",
    "PY_SPY_OPT",
    "RECORD",
    "RECOVERY",
    "REPORT",
    "for_each",
    "process_settings",
    "watch_settings",
]


def watch_settings(kw: dict[str, Any], url: str = "") -> WatchSettings:
    """The WatchSettings the option groups a command declared say (the rest: defaults)."""
    settings = WatchSettings(
        url="",
        engine=ENGINE.take(kw),
        probe=_with_api_key(PROBE.take(kw)),
        detector=DETECTOR.take(kw),
        policy=POLICY.take(kw),
        capture=CAPTURE.take(kw),
        recovery=RECOVERY.take(kw),
        report=REPORT.take(kw),
        guard=GUARD.take(kw),
        peers=PEERS.take(kw),
    )
    for one, name in ((JSON, "as_json"), (RECORD, "record")):
        if one.opt.dest in kw:
            settings = replace(settings, **{name: one.take(kw)})
    all_consumed(kw)
    return for_target(settings, url) if url else settings


def process_settings(kw: dict[str, Any]) -> ProcessSettings:
    """The process's settings from its options (taken off ``kw`` before :func:`watch_settings`)."""
    return validate_process(PROCESS.take(kw))


def _with_api_key(probe: ProbeSettings) -> ProbeSettings:
    """The engine's API key, from --api-key-file or the environment (read once, at start)."""
    with named_by_source("--api-key-file", "api_key_file"):
        return replace(probe, api_key=load_api_key(probe.api_key_file))


def for_each(base: WatchSettings, urls: list[str]) -> list[WatchSettings]:
    """One settings per engine; with many, no per-target process table scan or NVML: the
    metrics, /health and the canary judge them (process and GPU evidence needs the engine on
    this machine)."""
    many = len(urls) > 1
    probe = replace(base.probe, procs=False, gpu=False) if many else base.probe
    return [validate(for_target(replace(base, probe=probe), u)) for u in urls]
