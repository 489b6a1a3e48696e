"""``capture --help`` describes capture: one bundle, one JSON document. Options shared with
watch and run keep watch's wording elsewhere, never here (it said "the action history" and "one
document per line for watch and run")."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from engine_watchdog.cli.capture import capture_command, doctor_command
from engine_watchdog.cli.main import watch


def help_of(command: click.Command) -> str:
    done = CliRunner().invoke(command, ["--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    return done.output


def option_helps(text: str) -> dict[str, str]:
    """--flag -> its help text, from click's one-line-per-option layout (width 200)."""
    found = re.findall(r"^  (--[\w-]+)(?: [A-Z]+)?\s{2,}(.+)$", text, re.M)
    # click's own suffix: "[env var: ENGINE_WATCHDOG_...; default: ...]" (show_envvar).
    suffix = r"\s+\[(?:env var|default): [^\]]*\]$"
    return {flag: re.sub(suffix, "", text).strip() for flag, text in found}


def test_capture_help_speaks_of_capture_only() -> None:
    text = help_of(capture_command)
    for foreign in ("watch", "and run", "action history", "per line", "bundles"):
        assert foreign not in text, foreign
    helps = option_helps(text)
    assert helps["--json"] == 'Print {"path", "elapsed_s", "steps"} as one JSON document.'
    assert helps["--incident-dir"] == "Where the bundle goes."
    assert len(set(helps.values())) == len(helps), helps  # no help pasted onto two options


def test_the_shared_options_keep_their_wording_in_watch() -> None:
    helps = option_helps(help_of(watch))
    assert helps["--incident-dir"] == "Where incident bundles and the action history go."
    assert helps["--json"].startswith("Print JSON: one object a line for watch, run and guard")
    doctor = option_helps(help_of(doctor_command))
    assert doctor["--json"] == "Print the report as one JSON document."


def test_the_action_help_lists_every_rung_the_defaults_use() -> None:
    """``watch --help`` listed capture,abort,restart,liveness while its default was
    answer,capture. Through the console script, for each command with --action."""
    from engine_watchdog.core.model import RUNGS
    from tests.tools.cli import run_cli_sync

    for command in ("watch", "run", "guard"):
        ran = run_cli_sync(command, "--help", timeout=60)
        assert ran.code == 0, ran
        after = ran.out.split("  --action ", 1)[1]
        line = " ".join(re.split(r"\n  --", after)[0].split()).replace(", ", ",")
        listed = re.search(r"none or any of ([\w,]+)", line)
        assert listed and listed.group(1).split(",") == [str(r) for r in RUNGS], line
        default = re.search(r"default: ([\w,]+)", line)
        assert default and set(default.group(1).split(",")) <= set(RUNGS), line
