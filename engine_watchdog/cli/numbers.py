"""Numbers on the command line and in ENGINE_WATCHDOG_* variables: finite, and in range.

Python's ``float()`` takes ``nan``, ``inf`` and ``1e999``, and click's FLOAT and FloatRange pass
them on (every comparison with nan is false, so no range refuses it): ``--stall-seconds nan``
switched stall detection off without a word. :class:`Number` refuses them, and names where the
value came from: the flag, or the environment variable when the value was read from there
(a ConfigMap's typo must point at the ConfigMap, not at a flag nobody gave).
"""

from __future__ import annotations

import math
import os
from typing import Any

import click
from click.core import ParameterSource


class Number(click.ParamType):  # type: ignore[type-arg]
    """A finite float, at least ``at_least`` (or above ``above``), at most ``at_most``."""

    name = "float"

    def __init__(
        self,
        *,
        above: float | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> None:
        self.above = above
        self.at_least = at_least
        self.at_most = at_most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self._refuse(value, "a number", param, ctx)
        if not math.isfinite(number):
            self._refuse(value, "a finite number", param, ctx)
        if self.above is not None and not number > self.above:
            self._refuse(value, f"> {self.above:g}", param, ctx)
        if self.at_least is not None and not number >= self.at_least:
            self._refuse(value, f">= {self.at_least:g}", param, ctx)
        if self.at_most is not None and not number <= self.at_most:
            self._refuse(value, f"<= {self.at_most:g}", param, ctx)
        return number

    def _refuse(
        self, value: Any, rule: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> None:
        raise click.UsageError(f"{source_name(param, ctx)} must be {rule}: got {value!r}", ctx)

    def __repr__(self) -> str:
        return f"Number(above={self.above}, at_least={self.at_least}, at_most={self.at_most})"


SECONDS = Number(at_least=0.0)
"""Any finite duration, zero included (a grace, a backoff)."""
POSITIVE = Number(above=0.0)
"""A finite duration above zero (an interval, a timeout, a window)."""


def source_name(param: click.Parameter | None, ctx: click.Context | None) -> str:
    """``--flag``, or the environment variable the value was read from."""
    if param is None:
        return "value"
    flag = max(param.opts, key=len) if param.opts else (param.name or "value")
    return env_source(param, ctx) or flag


def env_source(param: click.Parameter | None, ctx: click.Context | None) -> str | None:
    """The environment variable ``param``'s value was read from; None when it was given on the
    command line or is the default."""
    if param is None or ctx is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    envvar = param.envvar
    if isinstance(envvar, str):
        return envvar
    if envvar:  # several names: the one that is set
        return next((e for e in envvar if os.environ.get(e)), envvar[0])
    return None
