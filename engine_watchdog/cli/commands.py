"""Commands that live next to their subsystem, attached to the main group."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    from engine_watchdog.cli.capture import capture_command, doctor_command
    from engine_watchdog.cli.demo import demo
    from engine_watchdog.cli.hangscmd import explain_command, report_command
    from engine_watchdog.cli.peercmd import peer_command
    from engine_watchdog.cli.tracecmd import record, replay
    from engine_watchdog.sim.cli import sim_command

    commands = (record, replay, sim_command, capture_command, doctor_command, demo)
    for command in (*commands, explain_command, report_command, peer_command):
        group.add_command(command)
