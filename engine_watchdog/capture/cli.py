"""click commands ``capture`` and ``doctor`` (registered in the main group by engine_watchdog.cli).

Exit status: 0 done; 1 doctor found a missing piece; 64 bad input (one line naming the fix);
73 the bundle could not be written (nothing partial was left).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from engine_watchdog.capture.bundle import BundleError, BundleResult, BundleSettings, write_bundle
from engine_watchdog.capture.doctor import render_json, render_text, run_doctor
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.capture.steps import capture_steps
from engine_watchdog.engines import VLLM
from engine_watchdog.model import ProcInfo
from engine_watchdog.probes.gpu import GpuProbe, load_nvml
from engine_watchdog.probes.procs import FIX_NOT_FOUND, sample_procs, url_port

EX_USAGE = 64
EX_CANTCREAT = 73


class _UsageError(click.UsageError):
    exit_code = EX_USAGE


class _Command(click.Command):
    """Usage errors exit 64 (EX_USAGE) rather than click's 2."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _UsageError(e.format_message(), e.ctx) from None


def _fail(message: str, code: int = EX_USAGE) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)


def _tools(ctx: click.Context) -> dict[str, str] | None:
    """Tool paths injected by the caller (``obj={"tools": {...}}``, tests); None: from PATH."""
    obj = ctx.find_root().obj
    tools = obj.get("tools") if isinstance(obj, dict) else None
    return dict(tools) if isinstance(tools, dict) else None


def default_steps() -> list[CaptureStep]:
    """The non-destructive steps of an on-demand bundle (the GPU snapshot where NVML works)."""
    gpu = GpuProbe(load_nvml())
    return capture_steps(destructive=False, gpu=None if gpu.start() else gpu)


def _check_target(url: str | None, pids: Sequence[int]) -> None:
    if not url and not pids:
        _fail("say which engine: --url http://HOST:PORT of its server, or --pid PID")
    if url and pids:
        _fail("give --url or --pid, not both (--pid replaces the discovery from the port)")
    if any(p <= 0 for p in pids):
        _fail("--pid takes a positive process ID")
    if url:
        try:
            url_port(url)
        except ValueError:
            _fail(f"--url {url!r} is not an http(s) URL: use e.g. http://127.0.0.1:8000")


def find_procs(url: str | None, pids: Sequence[int]) -> tuple[ProcInfo, ...]:
    """The engine's processes, or exit 64 with the fix."""
    _check_target(url, pids)
    procs = sample_procs(url, pids, profile=VLLM).procs
    gone = [p.pid for p in procs if p.state == "gone"]
    if gone:
        _fail(
            f"no process with PID {', '.join(map(str, gone))} in this PID namespace: "
            "check the PID (a container's PIDs differ from the host's)"
        )
    if not procs:
        _fail(f"no engine process found for {url}: {FIX_NOT_FOUND}")
    return procs


@click.command("capture", cls=_Command)
@click.option(
    "--url", help="Base URL of the engine's server; its processes are found from the port."
)
@click.option("--pid", "pids", type=int, multiple=True, help="Engine process (repeatable).")
@click.option(
    "--incident-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("incidents"),
    show_default=True,
    help="Where bundles are written.",
)
@click.option(
    "--engine-log",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The engine's log file; its tail goes into the bundle.",
)
@click.option("--tar", is_flag=True, help="Write <name>.tar.gz instead of a directory.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=20.0,
    show_default=True,
    help="Seconds each capture step may take.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@click.pass_context
def capture_command(
    ctx: click.Context,
    url: str | None,
    pids: tuple[int, ...],
    incident_dir: Path,
    engine_log: Path | None,
    tar: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Write a non-destructive incident bundle now and print its path."""
    if engine_log is not None and not engine_log.is_file():
        _fail(f"--engine-log {engine_log} is not a readable file: check the path")
    procs = find_procs(url, pids)
    settings = BundleSettings(
        incident_dir=incident_dir,
        engine=VLLM.name,
        step_timeout_s=timeout,
        engine_log=engine_log,
        tar=tar,
        tools=_tools(ctx),
    )
    # The process sample is the only observation an on-demand capture has: keep it.
    seen = [{"pid": p.pid, "role": p.role, "state": p.state} for p in procs]
    timeline = [{"t": settings.clock(), "kind": "procs", "procs": seen}]
    try:
        result = asyncio.run(write_bundle(settings, None, procs, timeline, default_steps()))
    except BundleError as e:
        _fail(str(e), EX_CANTCREAT)
    _report(result, as_json)


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


@click.command("doctor", cls=_Command)
@click.option("--url", help="Base URL of the engine's server, to check its processes are visible.")
@click.option("--pid", "pids", type=int, multiple=True, help="Engine process (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def doctor_command(
    ctx: click.Context, url: str | None, pids: tuple[int, ...], as_json: bool
) -> None:
    """Say what this host can capture and how to fix each missing piece."""
    if url or pids:
        _check_target(url, pids)
    report = asyncio.run(run_doctor(url, pids, tools=_tools(ctx)))
    if as_json:
        click.echo(render_json(report))
    else:
        click.echo(render_text(report), nl=False)
    if not report.ok:
        raise click.exceptions.Exit(1)
