"""The options of what is done about a stall: the ladder (POLICY), the recovery commands
(RECOVERY), the bundles (CAPTURE) and the guard's own (GUARD)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import click

from engine_watchdog.cli.numbers import POSITIVE, SECONDS
from engine_watchdog.cli.option_group import Opt, OptionGroup
from engine_watchdog.cli.options_output import api_target
from engine_watchdog.core.checks import parse_actions
from engine_watchdog.core.model import RUNGS
from engine_watchdog.core.serving import REQUEST_ACTIONS, GuardSettings
from engine_watchdog.core.settings import (
    CaptureSettings,
    PolicySettings,
    RecoverySettings,
    SettingsError,
)


def checked_signatures(path: Path) -> Path:
    """A signature file that loads, or a usage error naming what is wrong with it (at start,
    not at the first incident)."""
    from engine_watchdog.cli.hangscmd import signatures_or_exit

    signatures_or_exit(path)
    return path


def _bundle_command(text: str) -> tuple[str, ...]:
    """A program that is not there is a usage error at start, not a failed upload at the first
    incident (hours later, the evidence already gone with the pod)."""
    argv = tuple(shlex.split(text))
    if argv and shutil.which(argv[0]) is None:
        raise SettingsError(
            f"--bundle-command {argv[0]!r} is not an executable program: give a path, or a "
            "name on PATH"
        )
    return argv


POLICY = OptionGroup(
    PolicySettings,
    Opt(
        "--action",
        "actions",
        f"Rungs that may run: none or any of {','.join(RUNGS)} (repeatable or "
        "comma-separated; the order is fixed; answer acts through the guard).",
        multiple=True,
        convert=parse_actions,
        default=("capture",),
    ),
    Opt("--dry-run", "dry_run", "Log actions only."),
    Opt(
        "--abort-grace", "abort_grace_s", "Seconds for progress to resume after an abort.", SECONDS
    ),
    Opt(
        "--max-restarts",
        "rate_limit.max_restarts",
        "At most this many restarts per --restart-window.",
        int,
    ),
    Opt(
        "--restart-window",
        "rate_limit.window_s",
        "Seconds the restart limit counts over.",
        POSITIVE,
    ),
    Opt(
        "--restart-backoff",
        "rate_limit.backoff_s",
        "Wait this, doubling per restart in the window, between restarts.",
        SECONDS,
    ),
)
GUARD = OptionGroup(
    GuardSettings,
    Opt(
        "--request-action",
        "request_action",
        "A stuck request: abort it (its client gets an error) or only report it.",
        click.Choice(REQUEST_ACTIONS),
    ),
    Opt(
        "--guard-max-body-bytes",
        "max_body_bytes",
        "Refuse (413) request bodies larger than this.",
        int,
    ),
    Opt(
        "--guard-retry-after",
        "retry_after_s",
        "Retry-After (seconds) of the guard's 503 answers.",
        int,
    ),
    Opt(
        "--guard-drain-seconds",
        "drain_s",
        "On SIGTERM: let moving streams finish this long (new requests get 503), then end "
        "the rest; keep it under the pod's grace period.",
        float,
    ),
    Opt(
        "--guard-head-timeout",
        "head_timeout_s",
        "Close a client connection that has not sent a whole request head this many seconds "
        "after it opened (slowloris).",
        float,
    ),
    Opt(
        "--guard-max-idle-connections",
        "max_idle_connections",
        "At most this many idle client connections; past it the longest idle is closed.",
        int,
    ),
)
RECOVERY = OptionGroup(
    RecoverySettings,
    Opt(
        "--restart-command",
        "restart_command",
        "Restart the engine with this command (split like a shell, run without one).",
        str,
        convert=lambda text: tuple(shlex.split(text)),
        default="",
    ),
    Opt(
        "--bundle-command",
        "bundle_command",
        "Run this on each finished bundle, its path the last argument (split like a shell, "
        "run without one), e.g. to copy it to object storage.",
        str,
        convert=_bundle_command,
        default="",
    ),
    Opt(
        "--bundle-command-timeout",
        "bundle_command_timeout_s",
        "Seconds each --bundle-command run may take; then its process group is killed.",
        POSITIVE,
    ),
    Opt(
        "--engine-uid",
        "engine_uid",
        "The engine's UID: only its processes are killed or taken as --pid [default: the "
        "watchdog's own].",
        click.IntRange(min=0),
    ),
)
PY_SPY_OPT = Opt(
    "--py-spy", "py_spy", "The py-spy to run [default: on PATH, or beside this Python].", str
)
INCIDENT_DIR_OPT = Opt(
    "--incident-dir",
    "incident_dir",
    "Where incident bundles and the action history go.",
    click.Path(file_okay=False, path_type=Path),
)
CAPTURE = OptionGroup(
    CaptureSettings,
    INCIDENT_DIR_OPT,
    Opt(
        "--engine-log",
        "engine_log",
        "The engine's log file (its tail goes into bundles).",
        click.Path(dir_okay=False, path_type=Path),
    ),
    Opt(
        "--pod-log",
        "pod_log",
        "On Kubernetes: the engine container whose log bundles get through the API's pods/log "
        "(the pod-log component grants it), when --engine-log names no file.",
        str,
        convert=lambda name: name or None,
    ),
    Opt(
        "--pod-log-api",
        "pod_log_api",
        "Where --pod-log asks: 'in-cluster', or an API URL such as kubectl proxy's.",
        str,
        convert=lambda where: api_target(where) or "in-cluster",
    ),
    Opt("--tar", "tar", "Bundles as .tar.gz."),
    Opt(
        "--signatures",
        "signatures",
        "Known-hang signature file bundles are matched against [default: the one shipped].",
        click.Path(dir_okay=False, path_type=Path),
        convert=checked_signatures,
    ),
    PY_SPY_OPT,
)
