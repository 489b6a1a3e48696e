"""The options of what the process says and where: the reporters (REPORT), its sockets and
loop (PROCESS), the multi-node peer endpoint (PEERS), the output format (--json) and the trace
(--record)."""

from __future__ import annotations

from pathlib import Path

import click

from engine_watchdog.cli.numbers import POSITIVE
from engine_watchdog.cli.option_group import One, Opt, OptionGroup
from engine_watchdog.core.checks import normalise_url
from engine_watchdog.core.serving import PeerSettings
from engine_watchdog.core.settings import EVENT_LOOPS, ProcessSettings, ReportSettings
from engine_watchdog.host import logs


def api_target(value: str) -> str | None:
    """--k8s-events, --readiness-gate, --pod-log-api: 'in-cluster', a URL, or the ConfigMap's
    boolean 'true'."""
    if not value or value.lower() in ("false", "0", "no"):
        return None
    if value.lower() in ("true", "1", "yes", "in-cluster"):
        return "in-cluster"
    return normalise_url(value)


REPORT = OptionGroup(
    ReportSettings,
    Opt(
        "--k8s-events",
        "k8s_events",
        "Post Kubernetes Events on the pod for stalls and actions: 'in-cluster' "
        "(the events-rbac component), or an API URL such as kubectl proxy's.",
        str,
        convert=api_target,
    ),
    Opt(
        "--readiness-gate",
        "readiness_gate",
        "Set this pod's condition engine-watchdog.io/progressing (False while stalled, True "
        "otherwise) for its readinessGates: 'in-cluster' (the readiness-gate component), or an "
        "API URL. Off by default.",
        str,
        convert=api_target,
    ),
    Opt(
        "--alertmanager",
        "alertmanager",
        "Alertmanager base URL: push stall alerts there (API v2), resolve on recovery.",
        str,
        convert=lambda url: normalise_url(url) if url else None,
    ),
)


PROCESS = OptionGroup(
    ProcessSettings,
    Opt(
        "--listen",
        "listen",
        "host:port of the watchdog's /metrics /livez /readyz /status ('' for none).",
        str,
        convert=lambda text: text or None,
    ),
    Opt(
        "--guard-listen",
        "guard_listen",
        "host:port of the guard, the streaming proxy in front of the engine (clients connect "
        "there); unset: no guard.",
        str,
        convert=lambda text: text or None,
    ),
    Opt(
        "--guard-loop",
        "event_loop",
        "The event loop while the guard runs; auto: uvloop when installed.",
        click.Choice(EVENT_LOOPS),
    ),
)
"""The process's own options: its sockets and its loop, whatever the number of engines."""


def _peer_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


PEERS = OptionGroup(
    PeerSettings,
    Opt(
        "--peers",
        "peers",
        "Multi-node: every node's peer endpoint, HOST:PORT,HOST:PORT, the leader first (Ray, "
        "bare metal) [default: from LeaderWorkerSet's LWS_* variables, else a single node].",
        str,
        convert=_peer_list,
        default="",
    ),
    Opt(
        "--peer-port",
        "port",
        "This node's peer endpoint port (on LeaderWorkerSet every node the same).",
        int,
    ),
    Opt("--peer-bind", "bind", "The address the peer endpoint listens on.", str),
    Opt(
        "--peer-secret-file",
        "secret_file",
        "File holding the group's shared secret (a mounted Secret); else "
        "ENGINE_WATCHDOG_PEER_SECRET. Never give the secret as an argument.",
        click.Path(dir_okay=False, path_type=Path),
    ),
    Opt(
        "--peer-deadline",
        "deadline_s",
        "The leader's one deadline for every node's capture answer.",
        POSITIVE,
    ),
)


def _json_logs(ctx: click.Context, param: click.Parameter, as_json: bool) -> bool:
    """--json: every line from here on is JSON, log lines and the error a bad option ends with
    included (an eager option: read before the others)."""
    if as_json:
        logs.configure(True)
    return as_json


JSON = One(
    Opt(
        "--json",
        "as_json",
        "Print JSON: one object a line for watch, run and guard, their log lines included.",
        callback=_json_logs,
        eager=True,
    ),
    False,
)
RECORD = One(
    Opt(
        "--record",
        "record",
        "Append every observation to this JSON Lines trace (one engine only).",
        click.Path(dir_okay=False, path_type=Path),
    )
)
