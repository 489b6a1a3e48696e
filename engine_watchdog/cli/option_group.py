"""The machinery of option groups: each declares its own command-line options and builds its
own settings (kopf's ``logging_options`` and node-problem-detector's per-component flags are
the models).

A group is a decorator (it adds its options to a command) and a builder (``take`` pops exactly
its options off the command's keyword arguments and returns its settings). A command ends with
:func:`all_consumed`, which fails loudly if it declared an option no group took. The defaults
shown in ``--help`` are the settings dataclasses' own. Every option also reads the environment
as ENGINE_WATCHDOG_<OPTION> (:func:`env_name`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Generic, TypeVar

import click

from engine_watchdog.cli.exits import CliError
from engine_watchdog.cli.numbers import SECONDS, env_source
from engine_watchdog.core.settings import SettingsError

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")


def env_name(name: str) -> str:
    return "ENGINE_WATCHDOG_" + name.upper().replace("-", "_")


@dataclass(frozen=True)
class Opt:
    """One option: its flag, the settings field it fills (dotted for a nested one), its help."""

    flag: str
    """``--stall-seconds``, or ``--canary/--no-canary`` for a boolean pair."""
    field: str
    help: str
    type: Any = None
    """click type; None: from the flag (a pair, or a plain flag for a bool field)."""
    multiple: bool = False
    convert: Callable[[Any], Any] | None = None
    """Command-line value -> field value."""
    default: Any = None
    """The command-line default when it is not the field's own (e.g. ``--action``)."""
    callback: Callable[[click.Context, click.Parameter, Any], Any] | None = None
    """click's callback: runs while the command line is read (--json: the log format)."""
    eager: bool = False
    """Read before the others (--json: their errors are then in its format)."""

    @property
    def dest(self) -> str:
        return self.flag.split("/")[0].lstrip("-").replace("-", "_")

    def decorator(self, field_default: Any, with_default: bool) -> Callable[[F], F]:
        attrs: dict[str, Any] = {"help": self.help, "envvar": env_name(self.dest)}
        attrs.update(show_envvar=True, callback=self.callback, is_eager=self.eager)
        default = self.default if self.default is not None else field_default
        if self.multiple:
            attrs["multiple"] = True
        if isinstance(field_default, bool) and "/" not in self.flag:
            attrs["is_flag"] = True
        elif self.type is float:  # click's FLOAT takes nan and inf: a number, finite, >= 0
            attrs["type"] = SECONDS
        elif self.type is not None:
            attrs["type"] = self.type
        if with_default:
            attrs.update(default=default, show_default=default not in (None, "", ()))
        return click.option(self.flag, self.dest, **attrs)


class One:
    """A single option that is not part of a settings section (--engine, --listen, --json)."""

    def __init__(self, opt: Opt, default: Any = None) -> None:
        self.opt = opt
        self.default = default

    def __call__(self, func: F) -> F:
        return self.opt.decorator(self.default, True)(func)

    def with_help(self, text: str) -> One:
        """The same option, its help worded for one command (capture prints one document)."""
        return One(replace(self.opt, help=text), self.default)

    def take(self, kw: dict[str, Any]) -> Any:
        return converted(self.opt, kw.pop(self.opt.dest))


class OptionGroup(Generic[S]):
    """Options that together build one settings dataclass."""

    def __init__(self, cls: type[S], *opts: Opt) -> None:
        self.cls = cls
        self.opts = opts

    def __call__(self, func: F) -> F:
        return self.options()(func)

    def options(
        self,
        with_defaults: bool = True,
        helps: Mapping[str, str] | None = None,
        **defaults: Any,
    ) -> Callable[[F], F]:
        """The decorator; ``with_defaults=False``: unset options stay None (the settings come
        from elsewhere, e.g. a trace); ``helps``: a command's own wording of an option's help,
        per dest (capture writes one bundle, watch many); ``defaults``: a command's own default
        per dest."""
        base = self.cls()
        helps = helps or {}

        def decorate(func: F) -> F:
            for opt in reversed(self.opts):
                if opt.dest in defaults:
                    opt = replace(opt, default=defaults[opt.dest])
                if opt.dest in helps:
                    opt = replace(opt, help=helps[opt.dest])
                func = opt.decorator(_get(base, opt.field), with_defaults)(func)
            return func

        return decorate

    def declared_in(self, kw: Mapping[str, Any]) -> bool:
        present = [o.dest in kw for o in self.opts]
        if any(present) and not all(present):
            missing = [o.flag for o in self.opts if o.dest not in kw]
            raise RuntimeError(f"{self.cls.__name__}: options {missing} not declared")
        return all(present)

    def take(self, kw: dict[str, Any], base: S | None = None) -> S:
        """Pop this group's options off ``kw``; the settings they say, over ``base``."""
        return self.overrides(kw)(base if base is not None else self.cls())

    def overrides(self, kw: dict[str, Any]) -> Callable[[S], S]:
        """Pop this group's options off ``kw``; a function that puts the ones given (not None)
        over any settings (e.g. the ones a trace was recorded with)."""
        given: list[tuple[str, Any]] = []
        if self.declared_in(kw):
            for opt in self.opts:
                value = kw.pop(opt.dest)
                if value is not None:
                    given.append((opt.field, converted(opt, value)))

        def apply(settings: S) -> S:
            for name, value in given:
                settings = _set(settings, name, value)
            return settings

        return apply


def converted(opt: Opt, value: Any) -> Any:
    """``opt.convert(value)``, its error naming where the value came from."""
    if opt.convert is None or value is None:
        return value
    with named_by_source(opt.flag.split("/")[0], opt.dest):
        return opt.convert(value)


@contextmanager
def named_by_source(flag: str, dest: str, only_ours: bool = False) -> Iterator[None]:
    """A usage error in the block names the environment variable instead of ``flag`` when the
    option's value was read from one (the messages are written with the flag); a message
    without the flag gets the variable in front, unless ``only_ours`` (the block reads other
    options too)."""
    try:
        yield
    except (SettingsError, CliError) as exc:
        ctx = click.get_current_context(silent=True)
        param = next((p for p in ctx.command.params if p.name == dest), None) if ctx else None
        var = env_source(param, ctx)
        if var is not None:
            text = str(exc)
            if flag in text:
                exc.args = (text.replace(flag, var, 1),)
            elif not only_ours:
                exc.args = (f"{var}: {text}",)
        raise


def _get(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj: S, dotted: str, value: Any) -> S:
    head, _, rest = dotted.partition(".")
    if rest:
        return replace(obj, **{head: _set(getattr(obj, head), rest, value)})  # type: ignore[type-var]
    assert is_dataclass(obj) and head in {f.name for f in fields(obj)}, dotted
    return replace(obj, **{head: value})  # type: ignore[type-var]


def all_consumed(kw: Mapping[str, Any]) -> None:
    """Every option a command declared was taken by a group or by the command itself."""
    if kw:
        raise RuntimeError(f"options declared but not consumed: {sorted(kw)}")
