"""Commands that live next to their subsystem, attached to the main group when named.

Each is imported only when it runs (or for ``--help``): ``watch``, a sidecar that runs for
weeks, never holds the simulator, the demo, the hang reports or ``capture``'s module in memory
(docs/performance.md, "Footprint of watch").
"""

from __future__ import annotations

import importlib

import click

LAZY = {
    "record": "engine_watchdog.cli.tracecmd:record",
    "replay": "engine_watchdog.cli.tracecmd:replay",
    "sim": "engine_watchdog.sim.cli:sim_command",
    "capture": "engine_watchdog.cli.capture:capture_command",
    "doctor": "engine_watchdog.cli.capture:doctor_command",
    "demo": "engine_watchdog.cli.demo:demo",
    "explain": "engine_watchdog.cli.hangscmd:explain_command",
    "report": "engine_watchdog.cli.hangscmd:report_command",
    "peer": "engine_watchdog.cli.peercmd:peer_command",
}
"""Command name -> "module:attribute" of its click command."""


def load(name: str) -> click.Command:
    module, _, attribute = LAZY[name].partition(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command), LAZY[name]
    return command


class LazyGroup(click.Group):
    """A group whose :data:`LAZY` commands are imported the first time they are looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY:
            command = load(cmd_name)
            self.add_command(command, cmd_name)
        return command


def register(group: click.Group) -> None:
    """Every command attached now (what a test that walks ``group.commands`` needs)."""
    for name in LAZY:
        if name not in group.commands:
            group.add_command(load(name), name)
