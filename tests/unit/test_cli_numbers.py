"""Every number option of every command refuses nan and inf: none may use
click's FLOAT or FloatRange, which pass them on."""

from __future__ import annotations

import click

from engine_watchdog.cli.commands import register
from engine_watchdog.cli.main import cli
from engine_watchdog.cli.numbers import Number


def test_no_option_takes_a_float_click_does_not_check() -> None:
    register(cli)
    loose = []
    for name, command in cli.commands.items():
        if name == "sim":  # the simulator stands alone (it imports nothing of the watchdog)
            continue
        for param in command.params:
            if isinstance(param.type, (click.types.FloatParamType, click.FloatRange)):
                loose.append(f"{name} {param.opts}")
            if isinstance(param.type, Number):
                assert param.type.convert("1.5", None, None) == 1.5 or param.type.at_least
    assert loose == []
