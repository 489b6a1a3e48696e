"""Commands that live next to their subsystem, attached to the main group."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    from engine_watchdog.tracecmd import record, replay

    for command in (record, replay):
        group.add_command(command)
