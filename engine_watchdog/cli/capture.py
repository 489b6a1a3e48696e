"""click commands ``capture`` and ``doctor`` (registered in the main group by cli/commands.py).

Exit status: 0 done; 1 doctor found a missing piece; 64 bad input (one line naming the fix);
73 the bundle could not be written (nothing partial was left); 77 doctor: the engine is another
user's process and this one may not ptrace it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import click

from engine_watchdog.capture.bundle import BundleError, BundleResult, BundleSettings, write_bundle
from engine_watchdog.capture.doctor import render_json, render_text, run_doctor
from engine_watchdog.capture.engine_version import read_engine_version
from engine_watchdog.capture.retention import cannot_write
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.capture.steps import capture_steps
from engine_watchdog.cli.exits import EXIT_CANTCREAT, EXIT_NOPERM, CliError
from engine_watchdog.cli.numbers import Number
from engine_watchdog.cli.option_group import One, all_consumed
from engine_watchdog.cli.options import CAPTURE, INCIDENT_DIR_OPT, JSON, PY_SPY_OPT
from engine_watchdog.core.checks import normalise_url
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.core.redact import redact_url
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.engines import PROFILES, VLLM, EngineProfile
from engine_watchdog.host.tools import tools_with
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.nvml import GpuProbe, load_nvml
from engine_watchdog.probes.procs import FIX_NOT_FOUND, discover, sample_procs, url_port

PY_SPY = One(PY_SPY_OPT)
"""doctor's; the commands that write bundles have it in the CAPTURE group."""
INCIDENT_DIR = One(
    replace(
        INCIDENT_DIR_OPT,
        help="The incident dir watch, run and guard would write to.",
        type=click.Path(file_okay=False, readable=False, path_type=Path),
    ),
    CaptureSettings().incident_dir,
)
"""doctor's: whether that folder can be created and written (one it may not read is a
finding of its own, not bad input)."""


def default_steps() -> list[CaptureStep]:
    """The non-destructive steps of an on-demand bundle (the GPU snapshot where NVML works)."""
    gpu = GpuProbe(load_nvml())
    return capture_steps(destructive=False, gpu=None if gpu.start() else gpu)


def _check_target(url: str | None, pids: Sequence[int]) -> None:
    if not url and not pids:
        raise CliError("say which engine: --url http://HOST:PORT of its server, or --pid PID")
    if url and pids:
        raise CliError("give --url or --pid, not both (--pid replaces the discovery from the port)")
    if any(p <= 0 for p in pids):
        raise CliError("--pid takes a positive process ID")
    if url:
        try:
            url_port(url)
        except ValueError:
            raise CliError(
                f"--url {url!r} is not an http(s) URL: use e.g. http://127.0.0.1:8000"
            ) from None


def find_procs(
    url: str | None, pids: Sequence[int], profile: EngineProfile = VLLM
) -> tuple[ProcInfo, ...]:
    """The engine's processes, or a usage error naming the fix."""
    _check_target(url, pids)
    procs = sample_procs(url, pids, profile=profile).procs
    gone = [p.pid for p in procs if p.state == "gone"]
    if gone:
        raise CliError(
            f"no process with PID {', '.join(map(str, gone))} in this PID namespace: "
            "check the PID (a container's PIDs differ from the host's)"
        )
    if not procs:
        why = "; ".join(discover(url)[0].notes) if url else ""  # the error path only: a rescan
        raise CliError(
            f"no engine process found for {url}{f' ({why})' if why else ''}: {FIX_NOT_FOUND}"
        )
    return procs


def engine_options(func: Any) -> Any:
    func = click.option(
        "--pid", "pids", type=int, multiple=True, help="Engine process (repeatable)."
    )(func)
    return click.option(
        "--url", help="Base URL of the engine's server; its processes are found from the port."
    )(func)


# capture writes ONE bundle and no action history: its help says so, not watch's wording.
CAPTURE_HELPS = {
    "incident_dir": "Where the bundle goes.",
    "engine_log": "The engine's log file (its tail goes into the bundle).",
    "pod_log": "On Kubernetes: the engine container whose log the bundle gets through the "
    "API's pods/log (the pod-log component grants it), when --engine-log names no file.",
    "tar": "The bundle as .tar.gz.",
    "signatures": "Known-hang signature file the bundle is matched against [default: the one "
    "shipped].",
}


@click.command("capture")
@engine_options
@CAPTURE.options(helps=CAPTURE_HELPS)
@click.option(
    "--timeout",
    type=Number(at_least=1.0),
    default=20.0,
    show_default=True,
    help="Seconds each capture step may take.",
)
@click.option(
    "--engine",
    type=click.Choice(sorted(PROFILES)),
    default=VLLM.name,
    show_default=True,
    help="Engine profile: its process titles and roles, and the bundle's name.",
)
@JSON.with_help('Print {"path", "elapsed_s", "steps"} as one JSON document.')
def capture_command(
    url: str | None, pids: tuple[int, ...], timeout: float, engine: str, **kw: Any
) -> None:
    """Write a non-destructive incident bundle now and print its path."""
    given_url = url  # its /version is asked through one connection: credentials, TLS and all
    url = redact_url(url) if url else None  # for the process search only its port is used
    capture = replace(CAPTURE.take(kw), step_timeout_s=timeout)
    as_json = JSON.take(kw)
    all_consumed(kw)
    if capture.engine_log is not None and not capture.engine_log.is_file():
        raise CliError(f"--engine-log {capture.engine_log} is not a readable file: check the path")
    profile = PROFILES[engine]
    procs = find_procs(url, pids, profile)
    why = cannot_write(capture.incident_dir)
    if why is not None:
        raise CliError(
            f"--incident-dir {capture.incident_dir}: cannot create or write it ({why}): give a "
            "folder this user may create and write",
            EXIT_CANTCREAT,
        )
    settings = BundleSettings(
        capture,
        engine=profile.name,
        tools=tools_with(capture.py_spy),
        engine_version=(lambda: _version_of(given_url)) if given_url else None,
    )
    # The process sample is the only observation an on-demand capture has: keep it.
    seen = [{"pid": p.pid, "role": p.role, "state": p.state} for p in procs]
    timeline = [{"t": settings.clock(), "kind": "procs", "procs": seen}]
    try:
        result = asyncio.run(write_bundle(settings, None, procs, timeline, default_steps()))
    except BundleError as e:
        raise CliError(str(e), EXIT_CANTCREAT) from None
    _report(result, as_json)


async def _version_of(url: str) -> str | None:
    """The engine's /version, bounded (an on-demand capture has no watcher's session)."""
    async with aiohttp.ClientSession() as session:
        return await read_engine_version(session, EngineConnection.of(normalise_url(url)))


def _report(result: BundleResult, as_json: bool) -> None:
    path = str(result.path.resolve())
    if as_json:
        doc = {"path": path, "elapsed_s": result.elapsed_s, "steps": result.manifest["steps"]}
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(path)
    for step in result.steps:
        if step.status != "ok":
            click.echo(f"warning: {step.name} {step.status}: {step.detail}", err=True)


@click.command("doctor")
@click.option("--url", help="Base URL of the engine's server, to check its processes are visible.")
@click.option("--pid", "pids", type=int, multiple=True, help="Engine process (repeatable).")
@PY_SPY
@INCIDENT_DIR
@JSON.with_help("Print the report as one JSON document.")
def doctor_command(url: str | None, pids: tuple[int, ...], **kw: Any) -> None:
    """Say what this host can capture and how to fix each missing piece."""
    url = redact_url(url) if url else None  # only its port is used: its credentials never are
    tools = tools_with(PY_SPY.take(kw))
    incident_dir = INCIDENT_DIR.take(kw)
    as_json = JSON.take(kw)
    all_consumed(kw)
    if url or pids:
        _check_target(url, pids)
    report = asyncio.run(run_doctor(url, pids, tools=tools, incident_dir=incident_dir))
    if as_json:
        click.echo(render_json(report))
    else:
        click.echo(render_text(report), nl=False)
    if report.other_user:
        raise click.exceptions.Exit(EXIT_NOPERM)
    if not report.ok:
        raise click.exceptions.Exit(1)
