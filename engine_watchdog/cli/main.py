"""The command line: a thin click layer over run functions. No logic lives here.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom). Bad input prints one line naming the fix and exits
with the error's own code (64 for usage); :func:`main` is the one place that turns errors into
exit codes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import traceback
import warnings
from dataclasses import replace
from typing import Any, NoReturn

import click

from engine_watchdog import __version__
from engine_watchdog.cli.commands import LazyGroup
from engine_watchdog.cli.exits import EXIT_SOFTWARE, EXIT_USAGE, CliError
from engine_watchdog.cli.numbers import POSITIVE, env_source
from engine_watchdog.cli.options import (
    CAPTURE,
    DETECTOR,
    ENGINE,
    GUARD,
    JSON,
    PEERS,
    POLICY,
    PROBE,
    PROCESS,
    RECORD,
    RECOVERY,
    REPORT,
    for_each,
    process_settings,
    watch_settings,
)
from engine_watchdog.cli.targets import TARGETS
from engine_watchdog.core.checks import validate
from engine_watchdog.core.redact import redact_argv
from engine_watchdog.core.settings import CannotWriteError, SettingsError
from engine_watchdog.host import logs
from engine_watchdog.runtime.loop import run as run_loop
from engine_watchdog.runtime.stopping import die_by, stopped_by


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="engine-watchdog")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """Catches LLM serving engines that hang silently: detect, capture, recover."""
    logs.configure(False, verbose)  # --json, read with the command's options, may change it


@cli.command()
@TARGETS
@ENGINE
@PROBE
@DETECTOR
@PROCESS
@JSON
@RECORD
@POLICY.options(action=("answer,capture",))
@RECOVERY
@CAPTURE
@REPORT
@GUARD
@PEERS
def watch(**kw: Any) -> None:
    """Watch engines; print every state transition; act on stalls (--action).

    One process can watch many engines (a per-node DaemonSet): give several URLs, --targets or
    --selector; their metrics carry a ``target`` label.
    """
    from engine_watchdog.runtime.runner import run_watch

    urls = TARGETS.take(kw)
    process = process_settings(kw)
    base = watch_settings(kw)
    if base.record and len(urls) > 1:
        raise SettingsError("--record takes one engine; record each engine separately")
    if process.guard_listen and len(urls) > 1:
        raise SettingsError("--guard-listen takes one engine; run one guard per engine")
    if base.peers.peers and len(urls) > 1:
        raise SettingsError("--peers takes one engine: the group's leader or one of its nodes")
    if base.report.readiness_gate and len(urls) > 1:
        raise SettingsError(
            "--readiness-gate takes one engine: it sets the condition of the pod the sidecar "
            "shares with it"
        )
    sys.exit(run_loop(run_watch(for_each(base, urls), process), process))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("url", envvar="ENGINE_WATCHDOG_URL")
@ENGINE
@PROBE
@DETECTOR
@PROCESS
@JSON
@RECORD
@POLICY.options(action=("answer,capture,abort,restart",))
@RECOVERY
@CAPTURE
@REPORT
@GUARD
@PEERS
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(url: str, command: tuple[str, ...], **kw: Any) -> None:
    """Start the engine (the COMMAND after --), watch it, and restart it when it hangs.

    For bare metal and Slurm: engine-watchdog run http://127.0.0.1:8000 -- vllm serve MODEL
    """
    from engine_watchdog.runtime.runner import run_watch

    process = process_settings(kw)
    settings = validate(watch_settings(kw, url))
    sys.exit(run_loop(run_watch(settings, process, command=list(command)), process))


@cli.command()
@click.argument("url", envvar="ENGINE_WATCHDOG_URL")
@ENGINE
@PROBE
@DETECTOR
@PROCESS.options(guard_listen="127.0.0.1:8001")
@JSON
@RECORD
@POLICY.options(action=("answer,capture",))
@RECOVERY
@CAPTURE
@REPORT
@GUARD
@PEERS
def guard(url: str, **kw: Any) -> None:
    """Put the guard in front of an engine: clients connect to --guard-listen, every request
    passes through to URL; stuck streams are aborted and, when the engine stalls, every client
    is answered at once and new requests get 503 until it is back (docs/guard.md).

    Its own detector watches the engine (as ``watch`` does), with the guard's view of every
    stream as one more probe.
    """
    from engine_watchdog.runtime.runner import run_watch

    process = process_settings(kw)
    settings = validate(watch_settings(kw, url))
    if not process.guard_listen:
        raise SettingsError("guard needs --guard-listen host:port")
    sys.exit(run_loop(run_watch(settings, process), process))


@cli.command()
@TARGETS
@ENGINE
@PROBE
@DETECTOR
@click.option(
    "--timeout",
    type=POSITIVE,
    default=None,
    envvar="ENGINE_WATCHDOG_TIMEOUT",
    show_envvar=True,
    help="Observe at most this long [default: --stall-seconds + 10].",
)
@JSON
def check(timeout: float | None, **kw: Any) -> None:
    """One-shot verdict: exit 0 healthy (progress seen, or a canary answered), 1 stalled, 2
    unreachable, 3 undecided (the line says how long a verdict needs).

    Several engines are judged concurrently: one line each, a summary, the worst exit code.
    """
    from engine_watchdog.runtime.check import check_lines, run_checks

    urls = TARGETS.take(kw)
    as_json = JSON.take(kw)
    base = watch_settings(kw)
    base = replace(base, probe=replace(base.probe, health_every_round=False))
    settings = for_each(base, urls)
    budget = timeout if timeout is not None else settings[0].detector.stall_seconds + 10
    results = asyncio.run(run_checks(settings, budget))
    code, lines = check_lines(results, settings, as_json)
    for line in lines:
        click.echo(line)
    sys.exit(code)


def _internal_error(exc: Exception, argv: list[str]) -> int:
    if "-v" in argv or "--verbose" in argv:
        traceback.print_exc()
    click.echo(
        logs.error_line(
            f"internal error, {type(exc).__name__}: {exc} (a bug: rerun with -v for the "
            "traceback, and report it)"
        ),
        err=True,
    )
    return EXIT_SOFTWARE


def _ended_by(sig: int, console: bool) -> NoReturn:
    """The end of a run a signal stopped: the console script's process ends by that signal
    (runtime/stopping.py), at once: no interpreter shutdown in which a second Ctrl-C could
    raise again (a traceback in threading._shutdown), no warning about a coroutine it never
    took. Called as a function (``main(argv)``), it raises SystemExit(128+sig) instead: the
    caller's process is its own."""
    if console:
        logging.shutdown()
        die_by(sig)
    # The coroutine a Ctrl-C kept from its loop is released at the end of the handler: on
    # this path it was never awaited, by design, and Python's warning would say so.
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
    raise SystemExit(128 + sig)


def _from_ctrl_c(exc: BaseException) -> bool:
    """A Ctrl-C that Python wrapped: on 3.11 one that lands in a class body's ``__set_name__``
    (an import at start-up: a dataclass's fields) comes out as RuntimeError caused by it."""
    seen: BaseException | None = exc
    for _ in range(8):  # (a chain is short; bounded anyway)
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _own_title_without_secrets() -> None:
    """Every user of the host sees a process's command line (ps): ours may hold a URL's
    password, or run mode's engine command with its keys. Show it redacted (setproctitle)."""
    shown = redact_argv(sys.argv)
    if shown != sys.argv:
        try:
            import setproctitle
        except ImportError:  # a core dependency; without it ps shows what it shows
            return
        setproctitle.setproctitle(" ".join(shown))


def main(argv: list[str] | None = None) -> None:
    """The console script: every error is one line on stderr and an exit code of its own."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # see engine_watchdog/__init__.py
    try:
        if argv is None:
            _own_title_without_secrets()
        code = cli.main(args=argv, prog_name="engine-watchdog", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except SystemExit as exc:  # a command's own sys.exit(code)
        code = exc.code
    except (click.Abort, KeyboardInterrupt):  # click turns a Ctrl-C into Abort
        _ended_by(signal.SIGINT, argv is None)
    except click.UsageError as exc:
        if isinstance(exc, click.BadParameter) and (var := env_source(exc.param, exc.ctx)):
            exc.param_hint = var  # the ConfigMap's typo points at the ConfigMap, not a flag
        click.echo(logs.error_line(f"{exc.format_message()} (see --help)"), err=True)
        code = EXIT_USAGE
    except (SettingsError, CannotWriteError, CliError) as exc:
        click.echo(logs.error_line(str(exc)), err=True)
        code = exc.exit_code
    except Exception as exc:  # a bug: one line and a code of its own, never "stalled" (1)
        if _from_ctrl_c(exc):
            _ended_by(signal.SIGINT, argv is None)
        else:
            code = _internal_error(exc, sys.argv[1:] if argv is None else argv)
    if (sig := stopped_by()) is not None:  # an orderly stop on a signal: it ends as one
        _ended_by(sig, argv is None)
    # Without standalone mode click returns the code a command exited with (ctx.exit(n)).
    sys.exit(code if isinstance(code, int) else 0)
